"""The model and optimizer part of a checkpoint as a sharded `torch.distributed.checkpoint`.

A checkpoint's model state is a tree (model weights, optimizer state, grad scaler, baselines, the
known-users bitmap). Its tensors are saved with `torch.distributed.checkpoint` into `model/`, by
every rank together: the save planner hands each tensor to one rank (a table that every rank
holds is written once, by one of them; a table sharded over ranks would be written by its
owners), so the write is spread over the ranks instead of funnelled through rank 0. Everything
that is not a tensor (learning rates, the optimizer's param groups, counters) stays in rank 0's
`model.pt`, with a placeholder naming each tensor's key in `model/`.

Loading needs no process group of the same size: any world size (one process included) reads the
tensors it asks for from `model/`, whichever rank wrote them. That is what lets a run killed at two
processes resume at one.

Nothing here runs code from the files: `model.pt` loads with `torch.load(weights_only=True)`,
tensors are requested only where the checkpoint's metadata says they are tensors, and the
metadata itself is unpickled with an allow-list of the checkpoint library's own record types.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

SHARDS = "model"
"""The folder of a checkpoint holding the tensors (`.metadata` + one `.distcp` file per writing rank)."""
_REF = "__shard__"


def split(tree: Any, prefix: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """(the tree with each tensor replaced by a reference to its key, the tensors by key). Keys
    are the tree's path, e.g. `model.tables.vectors.embedding_bags.user.weight`."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[path] = node if is_sharded(node) else node.detach()
            return {_REF: path}
        if isinstance(node, dict):
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            out = [walk(v, f"{path}.{i}") for i, v in enumerate(node)]
            return tuple(out) if isinstance(node, tuple) else out
        return node

    return walk(tree, prefix), tensors


def join(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """`split` undone."""
    if isinstance(tree, dict):
        if set(tree) == {_REF}:
            return tensors[tree[_REF]]
        return {k: join(v, tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        out = [join(v, tensors) for v in tree]
        return tuple(out) if isinstance(tree, tuple) else out
    return tree


def refs(tree: Any) -> list[str]:
    """The tensor keys a split tree refers to."""
    if isinstance(tree, dict):
        if set(tree) == {_REF}:
            return [tree[_REF]]
        return [k for v in tree.values() for k in refs(v)]
    if isinstance(tree, (list, tuple)):
        return [k for v in tree for k in refs(v)]
    return []


def save_tensors(tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """Collective when a process group is up (every rank passes its tensors; a tensor every rank
    holds is written by one of them); a plain save otherwise."""
    dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(folder), single_file_per_rank=True, sync_files=True),
             no_dist=not _group_up())


def load_tensors(folder: Path, keys: list[str], into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The tensors `keys` from a sharded checkpoint, whatever world size wrote it: new ones on the
    CPU, and, in place, every tensor of `into` the checkpoint holds (a live model's and optimizer's
    state: a sharded table receives the rows of its local shards, wherever they were written).
    Collective when a process group is up."""
    reader = _SafeReader(str(folder))
    meta = reader.read_metadata().state_dict_metadata
    template = {k: t for k, t in (into or {}).items() if isinstance(meta.get(k), TensorStorageMetadata)}
    for key in keys:
        entry = meta.get(key)
        if not isinstance(entry, TensorStorageMetadata):
            raise KeyError(f"{folder} has no tensor {key!r}" + ("" if entry is None else " (it holds bytes there)"))
        if key not in template:
            template[key] = torch.empty(entry.size, dtype=entry.properties.dtype)
    dcp.load(template, storage_reader=reader, no_dist=not _group_up())
    return template


def is_sharded(t: Any) -> bool:
    """Whether `t` is a table sharded over ranks (TorchRec's ShardedTensor)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    return isinstance(t, ShardedTensor)


def _group_up() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class _SafeReader(dcp.FileSystemReader):
    """A reader whose metadata unpickling admits only the checkpoint library's own records and
    torch's dtypes, sizes, layouts and memory formats (the stock reader unpickles anything)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        path = Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata")
        with open(path, "rb") as fh:
            metadata = _Unpickler(fh).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path} is not a checkpoint's metadata")
        storage: StorageMeta | None = getattr(metadata, "storage_meta", None)
        if storage is None:
            storage = metadata.storage_meta = StorageMeta()
        storage.load_id = self.load_id
        return metadata


_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)
_SAFE = {("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")}
"""The function torch pickles a layout as (its own weights-only loader admits it) and the path
the checkpoint was written to."""
_BUILTINS = {"set", "frozenset", "dict", "list", "tuple", "int", "float", "str", "bytes", "bool", "slice"}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch.distributed.checkpoint."):
            return super().find_class(module, name)
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), _TORCH_VALUES)):
            return getattr(torch, name)
        if ((module, name) in _SAFE or (module == "builtins" and name in _BUILTINS)
                or (module, name) == ("collections", "OrderedDict")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a checkpoint's metadata refers to {module}.{name}, which is not loaded: "
                                     "only the checkpoint library's records are")
