"""Atomic checkpoints: model, optimizer and every rank's data progress, committed together.

Layout under `<run>/checkpoint/`:
    step-000000123/model/            model, optimizer, grad scaler, baselines: their tensors, a
                                     sharded torch.distributed.checkpoint written by all ranks
                                     (trainers.checkpoint.tensors); loads at any world size
    step-000000123/model.pt          rank 0: the rest of that state (rates, param groups, step)
    step-000000123/data-rank-R.npz   each rank: its data progress (cursor, buffers, offsets, rng)
    step-000000123/meta.json         rank 0: step, phase, world size, snapshot, offsets, counters
    step-000000123.r1/               the same step committed again with changed data (e.g. at the
                                     handoff, which shares the step of the batch phase's end)
    latest                           the name of the newest committed folder
    batch_only/model.pt              the model as it was at the handoff (for the batch-only AUC)

A checkpoint is written into `<name>.tmp/` by all ranks; rank 0 renames the folder to a name no
committed checkpoint has, then replaces `latest` (both atomic renames), and only then removes
folders older than the `keep` newest. The committed checkpoint is never touched before its
successor is committed, so a kill at any moment leaves `latest` naming a complete checkpoint.
A save whose content equals the committed one (same step, same data state, same metadata but
for the clock) commits nothing; files that did not change are hard links to the committed ones.
`.tmp` folders a killed or failed save left are removed when a run starts (rank 0), and a write
that fails (a full or read-only disk) raises `RunFolderWriteError` naming the file.

Nothing in a checkpoint runs code when loaded: `model.pt` loads with `torch.load(weights_only=True)`,
the sharded tensors through an allow-listed metadata reader (`trainers.checkpoint.tensors`), and data state
is `.npz` + JSON (`trainers.checkpoint.statefile`). Ranks must share the run folder (one node,
or a shared volume).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from slipstream.errors import ResumeError, RunFolderWriteError
from trainers.checkpoint.statefile import decode_state, encode_state
from trainers.checkpoint.tensors import SHARDS, join, load_tensors, refs, save_tensors, split

log = logging.getLogger(__name__)

LATEST = "latest"
MODEL_FILE = "model.pt"
META_FILE = "meta.json"
VOLATILE_META = (("time",), ("run", "stream_elapsed_s"))
"""Metadata (key paths) that changes with the clock alone: a save that differs only there commits nothing."""
_FOLDER = re.compile(r"step-(\d{9})(?:\.r(\d+))?$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_failure(path: Path, e: OSError) -> RunFolderWriteError:
    """The error of a failed write of `path`, naming it (a full disk's OSError names no file)."""
    what = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        todo = f"free space on the disk of {path.parent} (`df -h {path.parent}`) or set run.runs_dir to a larger one"
    elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        todo = f"make {path.parent} writable for this user, or set run.runs_dir to a writable folder"
    else:
        todo = f"check the disk of {path.parent}"
    return RunFolderWriteError(f"cannot write {path}: {what}. {todo[0].upper()}{todo[1:]}, then run again with the same "
                               "run.run_id: it resumes from the last committed checkpoint, which this failure left intact")


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an OSError of the block into a `RunFolderWriteError` naming `path`."""
    try:
        yield
    except OSError as e:
        raise write_failure(Path(e.filename) if isinstance(e.filename, str) else path, e) from e


def _write_synced(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    tmp = path.with_name(path.name + ".tmp")
    with writing(tmp):
        with open(tmp, mode) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def atomic_torch_save(obj: Any, path: Path) -> None:
    _write_synced(path, lambda fh: torch.save(obj, fh))


def atomic_write_text(path: Path, text: str) -> None:
    _write_synced(path, lambda fh: fh.write(text), "w")


def step_name(step: int, rev: int = 0) -> str:
    return f"step-{step:09d}" + (f".r{rev}" if rev else "")


def folder_order(name: str) -> tuple[int, int] | None:
    """(step, revision) of a committed folder's name, None for anything else."""
    m = _FOLDER.match(name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def data_file(rank: int) -> str:
    return f"data-rank-{rank}.npz"


def _files(folder: Path) -> list[str]:
    """Every file under `folder`, as sorted relative paths."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _missing(path: Path) -> list[str]:
    """What a committed checkpoint folder lacks (nothing: it is complete). A folder written before
    the model state was sharded has no `model/`: its `model.pt` holds the tensors too."""
    missing = [f for f in (META_FILE, MODEL_FILE) if not (path / f).is_file()]
    if (path / SHARDS).is_dir() and not (path / SHARDS / ".metadata").is_file():
        missing.append(f"{SHARDS}/.metadata")
    return missing


def _without(state: dict[str, Any], live: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`state` less the parts `live` holds: `{piece: {part: live state}}` (a piece's live model and
    optimizer, whose tensors load in place)."""
    out = dict(state)
    for piece, parts in live.items():
        if isinstance(out.get(piece), dict):
            out[piece] = {k: v for k, v in out[piece].items() if k not in parts}
    return out


def _overlay(state: dict[str, Any], live: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`state` with the live parts put back in."""
    out = dict(state)
    for piece, parts in live.items():
        out[piece] = {**(out.get(piece) or {}), **parts}
    return out


def _stable_meta(meta: dict[str, Any]) -> str:
    stable = json.loads(json.dumps(meta, default=str))
    for path in VOLATILE_META:
        node = stable
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return json.dumps(stable, sort_keys=True)


class Checkpointer:
    def __init__(self, root: Path, rank: int, barrier: Callable[[], None], keep: int = 2) -> None:
        self.root, self.rank, self.barrier, self.keep = root, rank, barrier, max(1, keep)
        self._committed: str | None = None
        """Name of the folder `latest` named after this process's last save (or its resume)."""
        self._data_digest: str | None = None
        """Digest of this rank's data state in the committed folder, when this process wrote it."""
        self._model_step: int | None = None
        """Step of the model in the committed folder (rank 0)."""
        if rank == 0:
            self.remove_leftovers()

    def remove_leftovers(self) -> list[str]:
        """Remove the `.tmp` folders and files a killed or failed save left (never named by `latest`).
        Called by rank 0 when a run starts, before any rank writes."""
        if not self.root.is_dir():
            return []
        gone = []
        for p in sorted(self.root.iterdir()):
            if p.name.endswith(".tmp") and (p.is_file() or folder_order(p.name.removesuffix(".tmp")) is not None):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                gone.append(p.name)
        if gone:
            log.info("removed %s from %s: left by a save that did not finish", ", ".join(gone), self.root)
        return gone

    # --- reading ------------------------------------------------------------------------------
    def latest(self) -> Path | None:
        """The committed checkpoint `latest` names, or None when the run has none yet."""
        pointer = self.root / LATEST
        if not pointer.exists():
            return None
        name = pointer.read_text().strip()
        path = self.root / name
        missing = _missing(path)
        if missing:
            older = self._complete_folders(before=name)
            advice = (f"point it at the newest complete one, {older[-1]} (`echo {older[-1]} > {pointer}`): the "
                      "resume then drops the audit parts written after it, so nothing is trained twice"
                      if older else "no complete checkpoint is left: start a new run.run_id")
            state = "missing" if not path.is_dir() else f"incomplete (no {', '.join(missing)})"
            raise ResumeError(
                f"{pointer} names {name}, which is {state}: "
                f"restore it, or {advice}. Do not delete {pointer}: the run would restart from step 0 while its "
                "audit keeps the trained parts, and every sample would count twice."
            )
        if self._committed is None:
            self._committed = name
            self._model_step = int(self.load_meta(path)["step"])
        return path

    def _complete_folders(self, before: str | None = None) -> list[str]:
        limit = folder_order(before) if before else None
        if not self.root.is_dir():
            return []
        found = [(order, p.name) for p in self.root.iterdir()
                 if p.is_dir() and (order := folder_order(p.name)) is not None and not _missing(p)]
        return [name for order, name in sorted(found) if limit is None or order < limit]

    @staticmethod
    def load_meta(path: Path) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads((path / META_FILE).read_text())
        return meta

    @staticmethod
    def load_model(path: Path, into: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The model state of a checkpoint, whole, on the CPU. Collective when a process group is up
        (every rank reads the tensors it needs from the sharded part, whichever rank wrote them).
        `into`: `{piece: {part: live state}}` (a sharded model's and optimizer's) whose tensors are
        loaded in place, each rank its own shards."""
        try:
            rest = torch.load(path / MODEL_FILE, map_location="cpu", weights_only=True)
            into = into or {}
            rest = _without(rest, into)  # those parts come from `into`
            live = split(into)[1]
            loaded = load_tensors(path / SHARDS, refs(rest), live) if (path / SHARDS).is_dir() else {}
            return _overlay(join(rest, loaded), into)
        except Exception as e:  # an unpickler refusing a global: an old or foreign file
            raise ResumeError(f"{path / MODEL_FILE} or {path / SHARDS} holds more than tensors and plain values "
                              f"({e}); it is not loaded, since unpickling it could run code. Start a new run.run_id.") from e

    @staticmethod
    def load_data(path: Path, rank: int) -> dict[str, Any]:
        target = path / data_file(rank)
        if not target.is_file() and (path / f"data-rank-{rank}.pt").is_file():
            raise ResumeError(
                f"checkpoint {path} stores data state as pickle (data-rank-{rank}.pt), which this version no "
                "longer loads (unpickling could run code): finish the run with the version that wrote it, or "
                "start a new run.run_id"
            )
        return decode_state(target)

    # --- writing ------------------------------------------------------------------------------
    def save(self, step: int, model_state: dict[str, Any], data_state: dict[str, Any],
             meta: dict[str, Any] | None) -> Path:
        """Collective: every rank calls it with its model state (the ranks write its tensors
        together); meta is used on rank 0 only. Returns the committed folder (the previous one when
        nothing changed)."""
        if self._committed is None:
            self.latest()  # which folder is committed, if any (a fresh process)
        name = self._next_name(step)
        tmp = self.root / (name + ".tmp")
        if self.rank == 0:
            with writing(tmp):
                self.root.mkdir(parents=True, exist_ok=True)
                for stale in (tmp, self.root / name):  # leftovers of a killed save: never named by `latest`
                    if stale.exists():
                        shutil.rmtree(stale)
                tmp.mkdir()
        self.barrier()
        blob, digest = encode_state(data_state)
        reused = self._reuse(data_file(self.rank), tmp) if digest == self._data_digest else False
        if not reused:
            _write_synced(tmp / data_file(self.rank), lambda fh: fh.write(blob))
        self._save_model(step, model_state, tmp)
        self.barrier()
        if self.rank == 0:
            assert meta is not None
            self._commit_or_drop(tmp, name, meta)
        self.barrier()
        self._committed = (self.root / LATEST).read_text().strip()
        self._data_digest = digest
        self._model_step = step
        return self.root / self._committed

    def _save_model(self, step: int, model_state: dict[str, Any], tmp: Path) -> None:
        """The model state into `tmp`: hard links to the committed one when the step is the same
        (every rank decides alike: they share step and committed folder), else written anew."""
        if step == self._model_step and self._committed is not None and not _missing(self.root / self._committed):
            if self.rank == 0:
                for name in _files(self.root / self._committed):
                    if name.startswith(SHARDS + "/") or name == MODEL_FILE:
                        if not self._reuse(name, tmp):
                            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                            shutil.copy2(self.root / self._committed / name, tmp / name)
            return
        rest, tensors = split(model_state)
        if self.rank == 0:
            atomic_torch_save(rest, tmp / MODEL_FILE)
        try:
            with writing(tmp / SHARDS):
                save_tensors(tensors, tmp / SHARDS)
        except CheckpointException as e:  # the checkpoint library gathers every rank's error
            cause = next((x for x, _ in e.failures.values() if isinstance(x, OSError)), None)
            if cause is None:
                raise
            raise write_failure(Path(cause.filename) if isinstance(cause.filename, str) else tmp / SHARDS, cause) from None

    def _next_name(self, step: int) -> str:
        """A folder name after the committed one's: `step-N`, or `step-N.rK` when step N is committed."""
        committed = folder_order(self._committed) if self._committed else None
        if committed is not None and committed[0] == step:
            return step_name(step, committed[1] + 1)
        return step_name(step)

    def _reuse(self, file: str, tmp: Path) -> bool:
        """Hard-link `file` of the committed folder into `tmp` (its content is unchanged)."""
        if self._committed is None:
            return False
        try:
            (tmp / file).parent.mkdir(parents=True, exist_ok=True)
            os.link(self.root / self._committed / file, tmp / file)
            return True
        except OSError:  # gone, or a file system without hard links: write it again
            return False

    def _unchanged(self, tmp: Path, meta: dict[str, Any]) -> bool:
        if self._committed is None:
            return False
        old = self.root / self._committed
        try:
            if _stable_meta(self.load_meta(old)) != _stable_meta(meta):
                return False
            files = _files(tmp)
            return files == [f for f in _files(old) if f != META_FILE] and all(
                os.path.samefile(tmp / f, old / f) for f in files)
        except (OSError, ValueError):
            return False

    def _commit_or_drop(self, tmp: Path, name: str, meta: dict[str, Any]) -> None:
        if self._unchanged(tmp, meta):
            shutil.rmtree(tmp)
            log.debug("checkpoint at step %s unchanged: %s stays", meta.get("step"), self._committed)
            return
        atomic_write_text(tmp / META_FILE, json.dumps(meta, indent=2, default=str))
        _fsync_dir(tmp)
        self._publish(tmp, self.root / name)
        self._point_latest(name)
        self._prune(name)
        log.info("checkpoint %s committed", self.root / name)

    def _publish(self, tmp: Path, final: Path) -> None:
        """The complete folder under its committed name (`latest` still names the previous one)."""
        os.replace(tmp, final)
        _fsync_dir(self.root)

    def _point_latest(self, name: str) -> None:
        """The commit: `latest` names the new folder."""
        atomic_write_text(self.root / LATEST, name)
        _fsync_dir(self.root)

    def _prune(self, newest: str) -> None:
        """Keep the `keep` newest committed folders up to `newest`; drop later ones (left by a kill
        between a rename and the commit, never named by `latest`) and unfinished `.tmp` folders."""
        top = folder_order(newest)
        assert top is not None
        ordered = sorted((order, p) for p in self.root.iterdir()
                         if p.is_dir() and (order := folder_order(p.name.removesuffix(".tmp"))) is not None)
        folders = [p for _, p in ordered]
        committed = [p for order, p in ordered if not p.name.endswith(".tmp") and order <= top]
        drop = [p for p in folders if p not in committed] + committed[: max(0, len(committed) - self.keep)]
        for old in drop:
            if old.name != newest:
                shutil.rmtree(old, ignore_errors=True)
