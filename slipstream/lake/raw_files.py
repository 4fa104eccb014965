"""Writing records into the raw zone's layout (`slipstream.lake.raw_zone`).

Records are split by the UTC hour of their time field and written as gzip JSON lines or as
Parquet typed with the source's Arrow schema. Whole folders (a day of a source, a side table) are
written under a staging name first and then swapped in, so the preprocessing job never reads half
of a day or of a table, and re-writing a day replaces it.
"""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

US_PER_HOUR = 3_600_000_000


def hour_groups(times: pa.Array | pa.ChunkedArray) -> list[tuple[date, int, np.ndarray]]:
    """(UTC day, hour, row indices in input order) for each hour the timestamps fall in, in time order."""
    ts = pc.cast(pc.cast(times, pa.timestamp("us", tz="UTC")), pa.int64()).to_numpy(zero_copy_only=False)
    hours = np.asarray(ts, dtype=np.int64) // US_PER_HOUR
    order = np.argsort(hours, kind="stable")
    uniq, starts = np.unique(hours[order], return_index=True)
    out = []
    for h, rows in zip(uniq, np.split(order, starts[1:])):
        when = datetime.fromtimestamp(int(h) * 3600, tz=UTC)
        out.append((when.date(), when.hour, rows))
    return out


_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def _json_text(col: pa.Array) -> pa.Array:
    """Each value as JSON text (null stays null)."""
    t = col.type
    if pa.types.is_timestamp(t):
        us = pc.fill_null(pc.cast(pc.cast(col, pa.timestamp("us", tz="UTC")), pa.int64()), 0).to_numpy()
        text = pa.array(np.char.add(np.datetime_as_string(us.astype("datetime64[us]"), unit="us"), 'Z"'))
        return pc.if_else(pc.is_null(col), pa.scalar(None, pa.string()), pc.binary_join_element_wise('"', text, ""))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        s = col
        if pc.any(pc.match_substring_regex(col, _NEEDS_ESCAPE)).as_py():
            for a, b in (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
                s = pc.replace_substring(s, a, b)
        return pc.binary_join_element_wise('"', s, '"', "")
    if pa.types.is_floating(t):  # 2.0 stays a JSON float ("2.0"), as json.dumps writes it
        text = pc.cast(col, pa.string())
        return pc.if_else(pc.match_substring_regex(text, r"^-?[0-9]+$"), pc.binary_join_element_wise(text, ".0", ""), text)
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return pc.cast(col, pa.string())
    return pa.array([None if v is None else json.dumps(v, default=str) for v in col.to_pylist()], pa.string())


def json_lines(table: pa.Table) -> pa.Array:
    """One JSON object per row (a string array), vectorised per column. A null value leaves its
    key out (a missing field); timestamps are ISO-8601 UTC strings."""
    if table.num_rows == 0:
        return pa.array([], pa.string())
    pieces = []
    for name, col in zip(table.column_names, table.columns):
        text = _json_text(col.combine_chunks())
        pieces.append(pc.fill_null(pc.binary_join_element_wise(json.dumps(name) + ":", text, ",", ""), ""))
    body = pc.utf8_rtrim(pc.binary_join_element_wise(*pieces, ""), characters=",")
    return pc.binary_join_element_wise("{", body, "}", "")


def write_jsonl_gz(fs: pafs.FileSystem, path: str, lines: pa.Array, more: Iterable[str] = ()) -> None:
    """`lines` (and `more`), one per line, gzip-compressed."""
    one = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines), "\n")[0]
    data = bytes(one.as_buffer() or b"") + (b"\n" if len(lines) else b"")
    data += b"".join(m.encode() + b"\n" for m in more)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path, compression=None) as out:  # not "detect": we compress ourselves
        out.write(gzip.compress(data, compresslevel=1))


def write_parquet(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(table, path, filesystem=fs)


def staging_name(final: str, purpose: str = "new") -> str:
    """A sibling of `final` the job ignores (its name starts with `_`)."""
    parent, name = final.rstrip("/").rsplit("/", 1)
    return f"{parent}/_{purpose}-{name}-{uuid.uuid4().hex[:8]}"


def swap_in(fs: pafs.FileSystem, staged: str, final: str) -> None:
    """Replace the folder `final` by `staged` (moved aside first, deleted after): a reader sees the
    old folder or the new one. `staged` must be a sibling (same filesystem, one rename)."""
    old = None
    if fs.get_file_info(final).type != pafs.FileType.NotFound:
        old = staging_name(final, "old")
        fs.move(final, old)
    fs.move(staged, final)
    if old is not None:
        fs.delete_dir(old)


def remove_if_exists(fs: pafs.FileSystem, path: str) -> None:
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)
