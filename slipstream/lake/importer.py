"""`slipstream import --spec S FILE…`: a user's files into the raw zone, the spec's way.

Each file feeds one source of the spec (`--source`, else the source its name starts with:
ratings.csv -> ratings). Its rows are parsed to the source's field types (`import_rows`); a bad
row is counted by reason and written with its line to `<raw_dir>/_rejects/<source>/<run>.jsonl`.
Good records of events and labels land in the folder of their UTC hour
(`<raw_dir>/<source>/day=D/hour=HH/part-0.parquet`, typed with the source's Arrow schema, a
missing optional value kept missing: the featurizer gives it its default, and a `missing:
indicator` feature sees it); a side table replaces `<raw_dir>/<table>/` whole.

All or nothing: every day folder and table is written under a staging name first, and swapped in
only once every file of every source has been read. A file that cannot be used stops the import
and nothing changes in the raw zone: one that cannot be read to its end (a truncated gzip), whose
columns misname the spec's fields (`import_checks`), or that had lines but yielded no record.

Idempotent per day: re-importing the files of a day replaces that day; a day the files do not
cover is left alone. With `stream_after` T, the events at or after T are also returned as
samples for the stream (`SampleTail`); they are written to the raw zone like every other event,
so the stream never holds a row the raw zone lacks and a run hands off at its own T without a gap.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from slipstream.errors import RawDataError
from slipstream.lake.import_checks import ColumnCheck, all_rejected, check_columns, separator_hint
from slipstream.lake.import_read import (
    DELIMITERS,
    READ_ERRORS,
    count_records,
    file_format,
    header_columns,
    read_batches,
    unreadable,
)
from slipstream.lake.import_report import ImportResult, Progress, RejectsFile, SourceReport
from slipstream.lake.import_rows import SampleTail, TimeRule, split_tail, typed_records
from slipstream.lake.raw_files import hour_groups, staging_name, swap_in, write_parquet
from slipstream.lake.raw_zone import day_dir, source_dir
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import SourceSpec, Spec

__all__ = ["ImportOptions", "ImportResult", "SourceReport", "assign_sources", "import_files", "read_side_tables"]

log = logging.getLogger(__name__)

US_PER_DAY = 86_400_000_000
STAGING_BUCKETS = 64
"""Staging files per source: days go to bucket `day % 64`, so an unsorted multi-year log keeps
64 files open, and the second pass holds about 1/64 of the records at a time."""
SOURCE_ORDER = {"table": 0, "labels": 1, "events": 2}


@dataclass(frozen=True, kw_only=True)
class ImportOptions:
    raw_dir: Path
    source: str | None = None
    """Every file feeds this source (else: the source each file's name starts with)."""
    day: date | None = None
    """Records without a time get one spread evenly over this UTC day, in file order."""
    time_from: datetime | None = None
    time_to: datetime | None = None
    """Records with a time outside [time_from, time_to) are rejected."""
    stream_after: datetime | None = None
    """Events at or after this time are also returned as samples for the stream."""
    allow_missing: tuple[str, ...] = ()
    """Optional fields a file may lack while it has columns the spec does not know."""
    run_id: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6])
    progress_every_s: float = 5.0
    max_rejects_written: int = 100_000

    def __post_init__(self) -> None:
        if self.time_from and self.time_to and self.time_from >= self.time_to:
            raise RawDataError(f"--from {self.time_from} must be before --to {self.time_to}")


def assign_sources(spec: Spec, files: list[Path], forced: str | None) -> dict[str, list[Path]]:
    """Source name -> its files, in the order given: `forced`, else the source the file's name
    starts with (the longest such name), else the only source of a one-source spec."""
    names = [s.name for s in spec.sources]
    if forced is not None and forced not in names:
        raise RawDataError(f"--source {forced!r} is not a source of spec {spec.name!r}: use one of {', '.join(names)}")
    out: dict[str, list[Path]] = {}
    for path in files:
        if not path.is_file():
            raise RawDataError(f"{path}: no such file")
        stem = path.name.split(".", 1)[0].lower()
        match = forced or max((n for n in names if stem.startswith(n)), key=len, default=None)
        if match is None and len(names) == 1:  # a one-source spec (criteo): every file feeds it
            match = names[0]
        if match is None:
            raise RawDataError(f"{path}: cannot tell which source of spec {spec.name!r} it feeds: name it after one "
                               f"({', '.join(names)}: e.g. {names[0]}.csv) or give --source NAME")
        out.setdefault(match, []).append(path)
    return out


class _Pending:
    """Folders this import staged (sibling names the job ignores), swapped in together at the end."""

    def __init__(self, raw_dir: Path) -> None:
        self.fs = pafs.LocalFileSystem()
        self.root = str(raw_dir).rstrip("/")
        self.swaps: list[tuple[str, str]] = []

    def add(self, staged: str, final: str) -> None:
        self.swaps.append((staged, final))

    def commit(self) -> None:
        for staged, final in self.swaps:
            swap_in(self.fs, staged, final)
        self.swaps = []

    def discard(self) -> None:
        for staged, _ in self.swaps:
            if self.fs.get_file_info(staged).type != pafs.FileType.NotFound:
                self.fs.delete_dir(staged)
            parent = staged.rsplit("/", 1)[0]  # a source folder left empty goes too
            if parent != self.root and not self.fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
                self.fs.delete_dir(parent)
        self.swaps = []


@dataclass
class _File:
    """One file being read: its format, CSV columns, and what is known of its columns."""

    path: Path
    fmt: str
    gz: bool
    columns: list[str] | None
    checked: ColumnCheck | None = None


def _open(path: Path, source: SourceSpec, opts: ImportOptions) -> _File:
    """A file's format and columns; a CSV/TSV header or a Parquet schema that misnames the
    source's fields is refused here, before any row is read (JSON lines: after the file)."""
    fmt, gz = file_format(path, source)
    columns = header_columns(path, source, fmt, gz)
    f = _File(path, fmt, gz, columns)
    names: list[str] | None = columns
    if fmt == "parquet":
        try:
            names = pq.read_schema(path).names
        except READ_ERRORS as e:
            raise unreadable(path, False, e, 0) from None
    if names is not None:
        hint = separator_hint(names, fmt, len(source.fields)) if len(names) == 1 and source.header else None
        if hint is None and len(names) == 1 and fmt in DELIMITERS:
            other = next((s for s in (",", "\t", ";", "|") if s != DELIMITERS[fmt] and s in names[0]), None)
            hint = f"the header is one column: is the separator `{other}`?" if other else None
        f.checked = _check(f, source, names, opts, hint)
    return f


def _check(f: _File, source: SourceSpec, names: list[str] | set[str], opts: ImportOptions,
           hint: str | None = None) -> ColumnCheck:
    checked = check_columns(f.path, source, names, allow_missing=opts.allow_missing, time_given=opts.day is not None,
                            fmt=f.fmt, sep_hint=hint)
    if checked.unknown:
        log.warning("%s: columns %s are not fields of source %s in the spec: ignored", f.path,
                    ", ".join(checked.unknown), source.name)
    if checked.absent:
        log.warning("%s: no record has %s: every record takes the spec's default", f.path, ", ".join(checked.absent))
    return checked


class _Staging:
    """The first pass: a timed source's good records, by day bucket, in Parquet files."""

    def __init__(self, root: Path, schema: pa.Schema, time_field: str) -> None:
        self.root, self.schema, self.time_field = root, schema, time_field
        self.writers: dict[int, pq.ParquetWriter] = {}

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        days = pc.cast(table.column(self.time_field), pa.int64()).to_numpy() // US_PER_DAY
        buckets = days % STAGING_BUCKETS
        for b in np.unique(buckets):
            if b not in self.writers:
                self.root.mkdir(parents=True, exist_ok=True)
                self.writers[int(b)] = pq.ParquetWriter(self.root / f"bucket-{b:02d}.parquet", self.schema)
            self.writers[int(b)].write_table(table.filter(pa.array(buckets == b)))

    def close(self) -> list[Path]:
        for w in self.writers.values():
            w.close()
        files = [self.root / f"bucket-{b:02d}.parquet" for b in sorted(self.writers)]
        self.writers = {}
        return files


def _stage_days(staged: list[Path], raw_dir: Path, source: SourceSpec, pending: _Pending) -> list[str]:
    """The second pass: each day of the staged records into a new day folder (one file per hour,
    rows in time order) under a staging name, to be swapped in with everything else."""
    fs, time_field = pafs.LocalFileSystem(), source.time or ""
    days: list[date] = []
    for path in staged:
        t = pq.read_table(path)
        us = pc.cast(t.column(time_field), pa.int64()).to_numpy()
        for d in np.unique(us // US_PER_DAY):
            rows = t.filter(pa.array(us // US_PER_DAY == d))
            rows = rows.take(pc.sort_indices(rows, sort_keys=[(time_field, "ascending")]))
            day = date(1970, 1, 1) + timedelta(days=int(d))
            final = day_dir(str(raw_dir), source.name, day)
            new = staging_name(final)
            pending.add(new, final)
            for _, hour, idx in hour_groups(rows.column(time_field)):
                write_parquet(fs, f"{new}/hour={hour:02d}/part-0.parquet", rows.take(pa.array(idx)))
            days.append(day)
    return [str(d) for d in sorted(days)]


def _read_file(spec: Spec, source: SourceSpec, f: _File, opts: ImportOptions, rule: TimeRule, offset: int,
               report: SourceReport, rejects: RejectsFile, tail: SampleTail | None, out: _Sink) -> None:
    """Every batch of one file through `typed_records` into `out`; refuses the file when its
    columns misname the fields or when it had lines and yielded no record."""
    header = 1 if f.fmt in DELIMITERS and source.header else 0
    rows, kept, reasons, names = 0, 0, Counter[str](), set[str]()
    progress = Progress(f.path, opts.progress_every_s)
    rejects.new_file()
    for batch in read_batches(f.path, source, f.fmt, f.gz, f.columns):
        good, bad = typed_records(spec, source, batch, rule, offset - header)
        rows, kept = rows + good.num_rows + len(bad), kept + good.num_rows
        names |= batch.names
        reasons.update(r.kind for r in bad)
        rejects.write(f.path, source.name, bad, batch)
        if tail is not None and source.kind == "events":
            before, after = split_tail(good, source.time or "", tail.t)
            tail.add_events(before, after)
            report.streamed += after.num_rows
        elif tail is not None and source.kind == "labels":
            tail.add_labels(good)
        out.write(good)
        report.imported += good.num_rows
        progress.update(rows, batch.position)
    progress.done(rows, rows - kept)
    if f.checked is None and rows:  # JSON lines: the keys of all its records
        f.checked = _check(f, source, names, opts)
    if f.checked is not None and f.checked.absent:
        report.absent[str(f.path)] = list(f.checked.absent)
    report.records += rows
    report.reasons.update(reasons)
    if rows and not kept:
        examples = sorted(rejects.examples, key=lambda e: e[0] or 0)
        raise all_rejected(f.path, rows, reasons, examples, source, rejects.path if rejects.written else None,
                           fmt=f.fmt, expected_columns=len(f.columns or ()), time_given=opts.day is not None)
    if not rows:
        log.warning("%s holds no records", f.path)


class _Sink:
    def write(self, table: pa.Table) -> None:
        raise NotImplementedError


class _StagingSink(_Sink):
    def __init__(self, staging: _Staging) -> None:
        self.staging = staging

    def write(self, table: pa.Table) -> None:
        self.staging.write(table)


class _ParquetSink(_Sink):
    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer = writer

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)


def _import_timed(spec: Spec, source: SourceSpec, files: list[Path], opts: ImportOptions, report: SourceReport,
                  tail: SampleTail | None, pending: _Pending) -> None:
    opened = [_open(p, source, opts) for p in files]
    counts = {f.path: count_records(f.path, f.fmt, f.gz, header=source.header) for f in opened} if opts.day else {}
    rule = TimeRule(opts.day, sum(counts.values()), opts.time_from, opts.time_to)
    staging = _Staging(opts.raw_dir / f"_import-{opts.run_id}" / source.name, source_arrow_schema(source), source.time or "")
    rejects = RejectsFile(opts.raw_dir, source.name, opts.run_id, opts.max_rejects_written)
    offset = 0
    try:
        for f in opened:
            _read_file(spec, source, f, opts, rule, offset, report, rejects, tail, _StagingSink(staging))
            offset += counts.get(f.path, 0)
        report.days = _stage_days(staging.close(), opts.raw_dir, source, pending)
    finally:
        staging.close()
        rejects.close()
        shutil.rmtree(opts.raw_dir / f"_import-{opts.run_id}", ignore_errors=True)
    report.rejects_file = str(rejects.path) if rejects.written else None


def _import_table(spec: Spec, source: SourceSpec, files: list[Path], opts: ImportOptions, report: SourceReport,
                  pending: _Pending) -> None:
    final = source_dir(str(opts.raw_dir), source.name)
    new = staging_name(final)
    pending.add(new, final)
    pafs.LocalFileSystem().create_dir(new, recursive=True)
    rejects = RejectsFile(opts.raw_dir, source.name, opts.run_id, opts.max_rejects_written)
    try:
        for i, path in enumerate(files):
            f = _open(path, source, opts)
            with pq.ParquetWriter(f"{new}/part-{i}.parquet", source_arrow_schema(source)) as out:
                _read_file(spec, source, f, opts, TimeRule(), 0, report, rejects, None, _ParquetSink(out))
    finally:
        rejects.close()
    report.rejects_file = str(rejects.path) if rejects.written else None


def read_side_tables(spec: Spec, raw_dir: Path, staged: dict[str, str] | None = None) -> dict[str, pa.Table]:
    """The side tables in the raw zone (a table not imported yet is left out: its defaults apply);
    `staged`: final folder -> the staged folder that will replace it."""
    out = {}
    for t in spec.tables:
        final = source_dir(str(raw_dir), t.name)
        folder = Path((staged or {}).get(final, final))
        if folder.is_dir() and any(folder.glob("*.parquet")):
            out[t.name] = pq.read_table(folder, schema=source_arrow_schema(t))
    return out


def _check_allow_missing(spec: Spec, by_source: dict[str, list[Path]], allowed: tuple[str, ...]) -> None:
    optional = {f.name for name in by_source for f in spec.source(name).fields if f.optional}
    wrong = [a for a in allowed if a not in optional]
    if wrong:
        raise RawDataError(f"--allow-missing {', '.join(wrong)}: not an optional field of "
                           f"{', '.join(sorted(by_source))} (optional fields: {', '.join(sorted(optional)) or 'none'})")


def import_files(spec: Spec, files: list[Path], opts: ImportOptions) -> ImportResult:
    """Load `files` into the raw zone (see the module docstring); raises RawDataError naming the
    file and the reasons when a file cannot be used, and then the raw zone is left as it was."""
    raw = str(opts.raw_dir)
    if "://" in raw:
        raise RawDataError(f"slipstream import writes a local raw zone, and the raw dir is {raw}: import into a local "
                           "folder (SLIPSTREAM_RAW_DIR=/path) and copy it to the object store")
    by_source = assign_sources(spec, files, opts.source)
    _check_allow_missing(spec, by_source, opts.allow_missing)
    tail = SampleTail(spec, opts.stream_after) if opts.stream_after is not None else None
    if tail is not None and spec.label.kind == "click_within" and spec.label_source and spec.label_source.name not in by_source:
        log.warning("--stream-after without a %s file: the streamed samples' labels come from the %s of this import, "
                    "so every one will be 0", spec.label_source.name, spec.label_source.name)
    reports: dict[str, SourceReport] = {}
    pending = _Pending(opts.raw_dir)
    try:
        for source in sorted((spec.source(n) for n in by_source), key=lambda s: SOURCE_ORDER[s.kind]):
            report = reports[source.name] = SourceReport(source.name, source.kind, [str(p) for p in by_source[source.name]])
            if source.kind == "table":
                _import_table(spec, source, by_source[source.name], opts, report, pending)
            else:
                _import_timed(spec, source, by_source[source.name], opts, report, tail, pending)
        result = ImportResult(opts.run_id, raw, reports, opts.stream_after)
        if tail is not None:  # with the side tables as this import leaves them
            result.tail = tail.samples(read_side_tables(spec, opts.raw_dir, {final: new for new, final in pending.swaps}))
        pending.commit()
    finally:
        pending.discard()
    return result
