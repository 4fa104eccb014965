"""Reading a user's files in batches for `slipstream import`: CSV/TSV, JSON lines, Parquet.

The format comes from the file name (`.csv`, `.tsv`, `.jsonl`, `.json`, `.parquet`, each text
format optionally `.gz`), else from the source's `format:` in the spec. CSV/TSV have a header
line unless the source says `header: false`, and then the spec's `columns:` name them (Criteo's
files). Every format streams: CSV through Arrow's streaming reader (every cell read as text, parsed
by `import_parse`), JSON lines a batch of lines at a time, Parquet a row group at a time; nothing
holds a whole file. Each batch knows the line of each row (for the rejects file) and how many
bytes of the file have been read (for progress).
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from slipstream.errors import RawDataError
from slipstream.samples.spec import SourceSpec

SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
DELIMITERS = {"csv": ",", "tsv": "\t"}
BATCH_ROWS = 65_536
BLOCK_BYTES = 4 << 20


def file_format(path: Path, source: SourceSpec) -> tuple[str, bool]:
    """(csv | tsv | jsonl | parquet, gzip-compressed) of a file."""
    suffixes = [s.lower() for s in path.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    ext = suffixes[-2] if gz and len(suffixes) > 1 else (suffixes[-1] if suffixes and not gz else "")
    fmt = SUFFIXES.get(ext) or (source.format if source.format != "auto" else None)
    if fmt is None:
        raise RawDataError(
            f"cannot tell the format of {path}: name it .csv, .tsv, .jsonl, .json or .parquet (optionally .gz), "
            f"or set `format:` of source {source.name!r} in the spec")
    if fmt == "parquet" and gz:
        raise RawDataError(f"{path}: a Parquet file is compressed inside; give it without .gz")
    return fmt, gz


@dataclass
class RawBatch:
    columns: dict[str, pa.Array]
    """The file's columns that are fields of the source (as read: text, or typed)."""
    lines: np.ndarray
    """Line (CSV/JSON, 1-based, the header counted) or row (Parquet, 1-based) of each row."""
    text: Callable[[int], str]
    """The raw record of row i, for the rejects file."""
    malformed: list[tuple[int | None, str, str]] = field(default_factory=list)
    """(line, reason, text) of the lines that are not records at all."""
    position: int = 0
    """Bytes of the file read so far."""

    @property
    def num_rows(self) -> int:
        return len(self.lines)


class _Counting:
    """The raw file under a decompressor: its position is the progress."""

    def __init__(self, path: Path) -> None:
        self.raw: BinaryIO = open(path, "rb")

    def stream(self, gz: bool) -> BinaryIO:
        return gzip.GzipFile(fileobj=self.raw) if gz else self.raw  # type: ignore[return-value]

    @property
    def position(self) -> int:
        return self.raw.tell()


def header_columns(path: Path, source: SourceSpec, fmt: str, gz: bool) -> list[str] | None:
    """The column names of a CSV/TSV file (its header, or the spec's `columns:`), None for others."""
    if fmt not in DELIMITERS:
        return None
    if not source.header:
        if not source.columns:
            raise RawDataError(f"source {source.name!r} says `header: false` but has no `columns:` naming them in the spec")
        return list(source.columns)
    with (gzip.open(path, "rt", newline="") if gz else open(path, newline="")) as fh:
        first = next(csv.reader(fh, delimiter=DELIMITERS[fmt]), None)
    if not first:
        raise RawDataError(f"{path} is empty: a {fmt} file of source {source.name!r} starts with a header line")
    return [c.strip() for c in first]


def count_records(path: Path, fmt: str, gz: bool, header: bool) -> int:
    """Records in a file (lines, less the header; Parquet: rows), for spreading times over a day."""
    if fmt == "parquet":
        return pq.ParquetFile(path).metadata.num_rows
    n, last = 0, b"\n"
    with (gzip.open(path, "rb") if gz else open(path, "rb")) as fh:
        while chunk := fh.read(BLOCK_BYTES):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    n += last != b"\n"
    return max(n - (1 if header and fmt in DELIMITERS else 0), 0)


def read_batches(path: Path, source: SourceSpec, fmt: str, gz: bool, columns: list[str] | None) -> Iterator[RawBatch]:
    if fmt == "parquet":
        yield from _parquet(path, source)
    elif fmt == "jsonl":
        yield from _jsonl(path, source, gz)
    else:
        assert columns is not None
        yield from _delimited(path, source, fmt, gz, columns)


def _parquet(path: Path, source: SourceSpec) -> Iterator[RawBatch]:
    f = pq.ParquetFile(path)
    names = [n for n in f.schema_arrow.names if n in source.field_names]
    size, total, row = path.stat().st_size, max(f.metadata.num_rows, 1), 0
    for i in range(f.num_row_groups):
        group = f.read_row_group(i, columns=names)
        done = int(size * (row + group.num_rows) / total)  # row groups are about evenly sized
        for batch in group.to_batches(BATCH_ROWS):
            t = pa.Table.from_batches([batch])
            lines = np.arange(row + 1, row + 1 + t.num_rows)
            row += t.num_rows
            yield RawBatch({n: t.column(n).combine_chunks() for n in names}, lines,
                           lambda j, t=t: json.dumps(t.slice(j, 1).to_pylist()[0], default=str), position=done)


def _json_column(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # mixed types: parse each as text
        return pa.array([None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values], pa.string())


def _jsonl(path: Path, source: SourceSpec, gz: bool) -> Iterator[RawBatch]:
    counting = _Counting(path)
    line_no = 0
    with counting.raw, counting.stream(gz) as fh:
        while lines := list(islice(fh, BATCH_ROWS)):
            records: list[dict[str, Any]] = []
            kept: list[int] = []
            texts: list[str] = []
            malformed: list[tuple[int | None, str, str]] = []
            for raw in lines:
                line_no += 1
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if not text.strip():
                    continue
                try:
                    rec = json.loads(text)
                except ValueError as e:
                    malformed.append((line_no, f"malformed line: not JSON ({e.msg} at column {e.colno})", text))
                    continue
                if not isinstance(rec, dict):
                    malformed.append((line_no, "malformed line: not a JSON object", text))
                    continue
                records.append(rec)
                kept.append(line_no)
                texts.append(text)
            cols = {n: _json_column([r.get(n) for r in records]) for n in source.field_names
                    if any(n in r for r in records)}
            yield RawBatch(cols, np.array(kept, dtype=np.int64), texts.__getitem__, malformed, counting.position)


def _delimited(path: Path, source: SourceSpec, fmt: str, gz: bool, columns: list[str]) -> Iterator[RawBatch]:
    """Arrow's streaming CSV reader, every cell as text. Single-threaded: only then does it tell the
    line of a row it skips, which places every row. A blank line is no record."""
    delim = DELIMITERS[fmt]
    skipped: list[tuple[int, str]] = []

    def invalid(row: Any) -> str:
        skipped.append((row.number, row.text or ""))
        return "skip"

    counting = _Counting(path)
    header = 1 if source.header else 0
    reader = pcsv.open_csv(
        counting.stream(gz),
        read_options=pcsv.ReadOptions(column_names=columns, skip_rows=header, block_size=BLOCK_BYTES, use_threads=False),
        parse_options=pcsv.ParseOptions(delimiter=delim, invalid_row_handler=invalid, ignore_empty_lines=False),
        convert_options=pcsv.ConvertOptions(column_types={c: pa.string() for c in columns}, strings_can_be_null=False),
    )
    wanted = [c for c in columns if c in source.field_names]
    rows, invalid_lines = 0, []  # valid rows so far; lines of the skipped ones, in order
    with counting.raw:
        for batch in reader:
            t = pa.Table.from_batches([batch])
            invalid_lines += [n for n, _ in skipped]
            at = _line_numbers(rows, t.num_rows, header, invalid_lines)
            rows += t.num_rows
            blank = _blank_rows(t)
            t, at = t.filter(pa.array(~blank)), at[~blank]
            malformed: list[tuple[int | None, str, str]] = [
                (n, f"malformed line: {text.count(delim) + 1} columns, expected {len(columns)}", text)
                for n, text in skipped if text.strip()]
            skipped.clear()
            yield RawBatch({c: t.column(c).combine_chunks() for c in wanted}, at,
                           lambda j, t=t: delim.join(str(v) for v in t.slice(j, 1).to_pylist()[0].values()),
                           malformed, counting.position)


def _blank_rows(t: pa.Table) -> np.ndarray:
    blank = np.ones(t.num_rows, dtype=bool)
    for col in t.columns:
        blank &= pc.equal(col, "").to_numpy(zero_copy_only=False)
    return blank


def _line_numbers(first: int, n: int, header: int, invalid: list[int]) -> np.ndarray:
    """Lines of valid rows first..first+n (counted among the valid rows): each skipped line
    (sorted) before a row pushes it down."""
    lines = np.arange(first, first + n, dtype=np.int64) + header + 1
    for x in invalid:
        lines[lines >= x] += 1
    return lines
