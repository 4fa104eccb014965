"""Reading a user's files in batches for `slipstream import`: CSV/TSV, JSON lines, Parquet.

The format comes from the file name (`.csv`, `.tsv`, `.jsonl`, `.json`, `.parquet`, each text
format optionally `.gz`), else from the source's `format:` in the spec. CSV/TSV have a header
line unless the source says `header: false`, and then the spec's `columns:` name them (Criteo's
files). Every format streams: CSV through Arrow's streaming reader (every cell read as text, parsed
by `import_parse`), JSON lines a batch of lines at a time, Parquet a row group at a time; nothing
holds a whole file. Each batch knows the line of each row (for the rejects file), the names the
file gives its values (to find a misnamed column), and how many bytes of the file have been read
(for progress). A file that cannot be read to its end (a truncated or corrupt gzip, a broken
Parquet footer, bytes that are not UTF-8) raises `RawDataError` naming the file, the line reached
and what to do; the import then writes nothing (`slipstream.lake.importer`).
"""

from __future__ import annotations

import csv
import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

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
    names: frozenset[str] = frozenset()
    """Every column (CSV/TSV, Parquet) or JSON key the batch's records have, fields of the source or not."""

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
    try:
        with (gzip.open(path, "rt", newline="") if gz else open(path, newline="")) as fh:
            first = next(csv.reader(fh, delimiter=DELIMITERS[fmt]), None)
    except READ_ERRORS as e:
        raise unreadable(path, gz, e, 0) from None
    if not first:
        raise RawDataError(f"{path} is empty: a {fmt} file of source {source.name!r} starts with a header line")
    return [c.strip() for c in first]


def count_records(path: Path, fmt: str, gz: bool, header: bool) -> int:
    """Records in a file (lines, less the header; Parquet: rows), for spreading times over a day."""
    if fmt == "parquet":
        rows: int = pq.ParquetFile(path).metadata.num_rows
        return rows
    n, last = 0, b"\n"
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as fh:
            while chunk := fh.read1(BLOCK_BYTES):  # read1: the lines before a broken end are counted
                n += chunk.count(b"\n")
                last = chunk[-1:]
    except READ_ERRORS as e:
        raise unreadable(path, gz, e, n) from None
    n += last != b"\n"
    return max(n - (1 if header and fmt in DELIMITERS else 0), 0)


READ_ERRORS = (EOFError, OSError, zlib.error, pa.ArrowInvalid, UnicodeDecodeError)
"""What reading a broken file raises: a gzip stream cut short (EOFError), a bad gzip header or
CRC (gzip.BadGzipFile, an OSError), a damaged deflate block (zlib.error), a broken Parquet file or
CSV block (ArrowInvalid), bytes that are not UTF-8."""


def unreadable(path: Path, gz: bool, e: BaseException, line: int) -> RawDataError:
    """The error for a file that cannot be read to its end, naming it, how far it got and why."""
    where = f" after line {line:,}" if line else ""
    if isinstance(e, EOFError) and gz:
        what = "is truncated: its gzip stream ends before the end-of-stream marker"
        todo = "the file was cut short (an interrupted download or copy?): fetch it again"
    elif gz and isinstance(e, (OSError, zlib.error)) and not isinstance(e, FileNotFoundError):
        what = f"is not a valid gzip file ({e})"
        todo = "the file is damaged or not gzip-compressed: fetch it again, or name it without .gz if it is plain text"
    elif isinstance(e, UnicodeDecodeError):
        what = f"is not UTF-8 text ({e.reason} at byte {e.start} of a block)"
        todo = "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
    else:
        what = f"could not be read ({type(e).__name__}: {str(e)[:300]})"
        todo = "check the file (is it complete, and of the format its name says?)"
    return RawDataError(f"{path} {what}{where}: {todo}, or leave it out of the command. Nothing was imported")


def read_batches(path: Path, source: SourceSpec, fmt: str, gz: bool, columns: list[str] | None) -> Iterator[RawBatch]:
    """The file's batches; `RawDataError` (`unreadable`) when it cannot be read to its end."""
    if fmt == "parquet":
        batches = _parquet(path, source)
    elif fmt == "jsonl":
        batches = _jsonl(path, source, gz)
    else:
        assert columns is not None
        batches = _delimited(path, source, fmt, gz, columns)
    last = 0
    try:
        for batch in batches:
            if batch.num_rows:
                last = max(last, int(batch.lines[-1]))
            if batch.malformed:
                last = max(last, max(line or 0 for line, _, _ in batch.malformed))
            yield batch
    except READ_ERRORS as e:
        raise unreadable(path, gz, e, last) from None


def _parquet(path: Path, source: SourceSpec) -> Iterator[RawBatch]:
    f = pq.ParquetFile(path)
    everything = frozenset(f.schema_arrow.names)
    names = [n for n in f.schema_arrow.names if n in source.field_names]
    size, total, row = path.stat().st_size, max(f.metadata.num_rows, 1), 0
    for i in range(f.num_row_groups):
        group = f.read_row_group(i, columns=names)
        done = int(size * (row + group.num_rows) / total)  # row groups are about evenly sized
        for batch in group.to_batches(BATCH_ROWS):
            t = pa.Table.from_batches([batch])
            lines = np.arange(row + 1, row + 1 + t.num_rows)
            row += t.num_rows
            yield RawBatch({n: t.column(n).combine_chunks() for n in names}, lines, _row_as_json(t), position=done,
                           names=everything)


def _row_as_json(t: pa.Table) -> Callable[[int], str]:
    """Row j of `t` as the JSON object a person would recognise from the file."""
    return lambda j: json.dumps(t.slice(j, 1).to_pylist()[0], default=str)


def _row_as_text(t: pa.Table, delim: str) -> Callable[[int], str]:
    """Row j of `t` as a delimited line of its values."""
    return lambda j: delim.join(str(v) for v in t.slice(j, 1).to_pylist()[0].values())


def _json_column(values: list[Any]) -> pa.Array:
    """One field's JSON values as an Arrow array; mixed types, integers beyond 64 bits, and
    integers next to floats (which Arrow would turn into floats, rounding large ids) become their
    JSON text, parsed exactly by `import_parse`."""
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return _json_text(values)
    if pa.types.is_floating(arr.type) and any(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return _json_text(values)
    return arr


def _json_text(values: list[Any]) -> pa.Array:
    return pa.array([None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values], pa.string())


def _jsonl(path: Path, source: SourceSpec, gz: bool) -> Iterator[RawBatch]:
    counting = _Counting(path)
    line_no = 0
    with counting.raw, counting.stream(gz) as fh:
        while lines := _lines(fh, path, gz, line_no):
            records: list[dict[str, Any]] = []
            keys: set[str] = set()
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
                except ValueError as e:  # a JSONDecodeError, or an integer of too many digits
                    why = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
                    malformed.append((line_no, f"malformed line: not JSON ({why})", text))
                    continue
                if not isinstance(rec, dict):
                    malformed.append((line_no, "malformed line: not a JSON object", text))
                    continue
                records.append(rec)
                keys.update(rec)
                kept.append(line_no)
                texts.append(text)
            cols = {n: _json_column([r.get(n) for r in records]) for n in source.field_names
                    if any(n in r for r in records)}
            yield RawBatch(cols, np.array(kept, dtype=np.int64), texts.__getitem__, malformed, counting.position,
                           frozenset(keys))


def _lines(fh: BinaryIO, path: Path, gz: bool, done: int) -> list[bytes]:
    """The next batch of lines; a file that breaks off names the line it reached."""
    lines: list[bytes] = []
    try:
        lines.extend(islice(fh, BATCH_ROWS))
    except READ_ERRORS as e:
        raise unreadable(path, gz, e, done + len(lines)) from None
    return lines


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
    names = frozenset(columns)
    rows, invalid_lines = 0, []  # valid rows so far; lines of the skipped ones, in order

    def malformed() -> list[tuple[int | None, str, str]]:
        out: list[tuple[int | None, str, str]] = [
            (n, f"malformed line: {_columns(text.count(delim) + 1)}, expected {len(columns)}", text)
            for n, text in skipped if text.strip()]
        skipped.clear()
        return out

    with counting.raw:
        for batch in reader:
            t = pa.Table.from_batches([batch])
            invalid_lines += [n for n, _ in skipped]
            at = _line_numbers(rows, t.num_rows, header, invalid_lines)
            rows += t.num_rows
            blank = _blank_rows(t)
            t, at = t.filter(pa.array(~blank)), at[~blank]
            yield RawBatch({c: t.column(c).combine_chunks() for c in wanted}, at,
                           _row_as_text(t, delim), malformed(), counting.position, names)
        if skipped:  # lines after the last valid row (or a file with none) are reported too
            empty = pa.table({c: pa.array([], pa.string()) for c in wanted})
            yield RawBatch({c: empty.column(c).combine_chunks() for c in wanted}, np.zeros(0, dtype=np.int64),
                           lambda j: "", malformed(), counting.position, names)


def _columns(n: int) -> str:
    return f"{n} column{'s' * (n != 1)}"


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
