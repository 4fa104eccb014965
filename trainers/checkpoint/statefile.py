"""Data state (cursors, positions, buffered rows, rng states) in a file that cannot run code.

A checkpoint's data state is a tree of dicts, lists and scalars with numpy arrays as leaves. It is
stored as one `.npz` file: the arrays as its members and the tree as JSON in the member
`__tree__`, each array replaced by a reference to its member. Loading uses
`numpy.load(allow_pickle=False)` and `json.loads`, so a file from a shared runs volume is data,
never code (a pickle can run anything on load). Object arrays are refused when saving.

JSON alone would lose what a state needs back exactly: dict keys that are not strings (partition
numbers), tuples, and the dtypes and shapes of arrays; the tree keeps those explicitly.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

TREE = "__tree__"
_ARRAY, _DICT, _TUPLE = "__ndarray__", "__dict__", "__tuple__"
_MARKERS = (_ARRAY, _DICT, _TUPLE)


def _encode(obj: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"data state {where}: an object array cannot be stored without pickle")
        name = f"a{len(arrays)}"
        arrays[name] = obj
        return {_ARRAY: name}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _MARKERS for k in obj):
            return {k: _encode(v, arrays, f"{where}.{k}") for k, v in obj.items()}
        return {_DICT: [[_encode(k, arrays, f"{where}[key]"), _encode(v, arrays, f"{where}[{k!r}]")] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {_TUPLE: [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"data state {where}: {type(obj).__name__} is not storable (use arrays, dicts, lists, scalars)")


def _decode(obj: Any, arrays: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(v, arrays) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if _ARRAY in obj:
        return arrays[obj[_ARRAY]]
    if _DICT in obj:
        return {_hashable(_decode(k, arrays)): _decode(v, arrays) for k, v in obj[_DICT]}
    if _TUPLE in obj:
        return tuple(_decode(v, arrays) for v in obj[_TUPLE])
    return {k: _decode(v, arrays) for k, v in obj.items()}


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def encode_state(state: dict[str, Any]) -> tuple[bytes, str]:
    """The state as the bytes of an `.npz` file, and a digest of its content (equal for equal
    states; the zip's own bytes carry a time stamp, so they are not hashed)."""
    arrays: dict[str, np.ndarray] = {}
    tree = json.dumps(_encode(state, arrays, "state"), separators=(",", ":")).encode()
    digest = hashlib.blake2b(tree, digest_size=16)
    for name, a in arrays.items():
        digest.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        digest.update(np.ascontiguousarray(a).data)
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **{TREE: np.frombuffer(tree, dtype=np.uint8), **arrays})  # object arrays were refused above
    return buf.getvalue(), digest.hexdigest()


def decode_state(source: Path | bytes) -> dict[str, Any]:
    """A state written by `encode_state`, read without pickle."""
    fh = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")
    with fh, np.load(fh, allow_pickle=False) as z:
        arrays = {name: z[name] for name in z.files if name != TREE}
        tree = json.loads(bytes(z[TREE]).decode())
    out = _decode(tree, arrays)
    if not isinstance(out, dict):
        where = source if isinstance(source, Path) else "the data state"
        raise ValueError(f"{where}: a data state must be a mapping")
    return out
