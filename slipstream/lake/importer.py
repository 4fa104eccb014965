"""`slipstream import --spec S FILE…`: a user's files into the raw zone, the spec's way.

Each file feeds one source of the spec (`--source`, else the source its name starts with:
ratings.csv -> ratings). Its rows are parsed to the source's field types (`import_rows`); a bad
row is counted by reason and written with its line to `<raw_dir>/_rejects/<source>/<run>.jsonl`;
a file whose every row is rejected fails with the reasons. Good records of events and labels land
in the folder of their UTC hour (`<raw_dir>/<source>/day=D/hour=HH/part-0.parquet`, typed with
the source's Arrow schema); a side table replaces `<raw_dir>/<table>/` whole.

Idempotent per day: the records are first spread over a few staging files (by day), then each day
they cover is written under a staging name and swapped in, replacing that day; a day the files do
not cover is left alone. With `stream_after` T the events at or after T are not written but
returned as samples for the stream (`SampleTail`).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from slipstream.errors import RawDataError
from slipstream.lake.import_read import DELIMITERS, RawBatch, count_records, file_format, header_columns, read_batches
from slipstream.lake.import_rows import Reject, SampleTail, TimeRule, split_tail, typed_records
from slipstream.lake.raw_files import hour_groups, staging_name, swap_in, write_parquet
from slipstream.lake.raw_zone import day_dir, rejects_path, source_dir
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import SourceSpec, Spec

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
    """Events at or after this time go to the stream (as samples) instead of the raw zone."""
    run_id: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6])
    progress_every_s: float = 5.0
    max_rejects_written: int = 100_000

    def __post_init__(self) -> None:
        if self.time_from and self.time_to and self.time_from >= self.time_to:
            raise RawDataError(f"--from {self.time_from} must be before --to {self.time_to}")


@dataclass
class SourceReport:
    source: str
    kind: str
    files: list[str] = field(default_factory=list)
    records: int = 0
    imported: int = 0
    streamed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    rejects_file: str | None = None
    days: list[str] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        return sum(self.reasons.values())

    def days_without_records(self) -> list[str]:
        if not self.days:
            return []
        first, last = date.fromisoformat(self.days[0]), date.fromisoformat(self.days[-1])
        every = (str(first + timedelta(days=i)) for i in range((last - first).days + 1))
        return [d for d in every if d not in set(self.days)]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "files": self.files, "records": self.records, "imported": self.imported,
                "streamed": self.streamed, "rejected": self.rejected, "reasons": dict(self.reasons.most_common()),
                "rejects_file": self.rejects_file, "days": self.days, "days_without_records": self.days_without_records()}

    def render(self) -> list[str]:
        n = len(self.files)
        span = "" if not self.days else f" ({self.days[0]})" if len(self.days) == 1 else f" ({self.days[0]} … {self.days[-1]})"
        where = f"into {len(self.days)} day folder{'s' * (len(self.days) != 1)}{span}" if self.kind != "table" else "(table replaced)"
        lines = [f"{self.source}: {n} file{'s' * (n != 1)}, {self.records:,} records: {self.imported:,} imported {where}, "
                 f"{self.rejected:,} rejected" + (f", {self.streamed:,} to the stream" if self.streamed else "")]
        if self.rejected:
            reasons = "; ".join(f"{k}: {v:,}" for k, v in self.reasons.most_common())
            lines.append(f"  rejected: {reasons} -> {self.rejects_file}")
        for d in self.days_without_records():
            lines.append(f"  no records on {d}: no folder written (the preprocessing job skips the day with a warning)")
        return lines


@dataclass
class ImportResult:
    run_id: str
    raw_dir: str
    sources: dict[str, SourceReport]
    stream_after: datetime | None = None
    tail: pa.Table | None = None
    """The samples at or after `stream_after`, in event-time order (None without it)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run_id, "raw_dir": self.raw_dir,
                               "sources": {k: v.to_dict() for k, v in self.sources.items()}}
        if self.stream_after is not None:
            out["stream"] = {"after": self.stream_after.isoformat(), "samples": 0 if self.tail is None else self.tail.num_rows}
        return out

    def render(self) -> str:
        lines = [line for r in self.sources.values() for line in r.render()]
        if self.stream_after is not None:
            lines.append(f"stream after {self.stream_after.isoformat()}: {0 if self.tail is None else self.tail.num_rows:,} samples")
        return "\n".join(lines)


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


class Progress:
    """A log line every few seconds while a file is read: rows, rate, share of bytes, ETA."""

    def __init__(self, path: Path, every_s: float) -> None:
        self.path, self.every_s = path, every_s
        self.size = max(path.stat().st_size, 1)
        self.start = self.last = time.monotonic()

    def update(self, rows: int, position: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return
        self.last, elapsed = now, now - self.start
        frac = min(max(position / self.size, 1e-9), 1.0)
        log.info("%s: %s rows (%s rows/s), %.0f%% of %.1f MB, ETA %.0f s", self.path.name, f"{rows:,}",
                 f"{rows / elapsed:,.0f}", 100 * frac, self.size / 1e6, elapsed * (1 - frac) / frac)

    def done(self, rows: int, rejected: int) -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        log.info("%s: %s records in %.1f s (%s/s), %s rejected", self.path.name, f"{rows:,}", elapsed,
                 f"{rows / elapsed:,.0f}", f"{rejected:,}")


class RejectsFile:
    """`<raw_dir>/_rejects/<source>/<run>.jsonl`, opened on the first reject; at most `cap` lines."""

    def __init__(self, raw_dir: Path, source: str, run: str, cap: int) -> None:
        self.path = Path(rejects_path(str(raw_dir), source, run))
        self.cap, self.written = cap, 0
        self._fh: TextIO | None = None

    def write(self, path: Path, source: str, rejects: list[Reject], batch: RawBatch) -> None:
        for r in rejects:
            if self.written >= self.cap:
                return
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "w")
            raw = r.raw if r.raw is not None else batch.text(r.row)  # built only for the lines written
            self._fh.write(json.dumps({"file": str(path), "line": r.line, "source": source, "reason": r.reason, "raw": raw}) + "\n")
            self.written += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


def _open(path: Path, source: SourceSpec) -> tuple[str, bool, list[str] | None]:
    """(format, gzip, CSV columns) of a file; columns the source does not know are named once."""
    fmt, gz = file_format(path, source)
    columns = header_columns(path, source, fmt, gz)
    unknown = [c for c in columns or () if c not in source.field_names and not c.startswith("_")]
    if unknown:
        log.warning("%s: columns %s are not fields of source %s in the spec: ignored", path, ", ".join(unknown), source.name)
    return fmt, gz, columns


def _all_rejected(path: Path, report_reasons: Counter[str], rows: int, source: SourceSpec, rejects: RejectsFile,
                  spread: bool) -> RawDataError:
    reasons = "; ".join(f"{k} in {v:,} records" for k, v in report_reasons.most_common(5))
    hint = ""
    if source.time and not spread and report_reasons.get(f"field `{source.time}` missing"):
        hint = f" (records without `{source.time}`: give --day YYYY-MM-DD to spread them over that UTC day)"
    return RawDataError(f"all {rows:,} rows of {path} rejected: {reasons}{hint}. Rejected rows: {rejects.path}")


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


def _write_days(staged: list[Path], raw_dir: Path, source: SourceSpec) -> list[str]:
    """The second pass: each day of the staged records into a new day folder (one file per
    hour, rows in time order), then every day swapped in."""
    fs, time_field = pafs.LocalFileSystem(), source.time or ""
    ready: dict[date, tuple[str, str]] = {}
    for path in staged:
        t = pq.read_table(path)
        us = pc.cast(t.column(time_field), pa.int64()).to_numpy()
        for d in np.unique(us // US_PER_DAY):
            rows = t.filter(pa.array(us // US_PER_DAY == d))
            rows = rows.take(pc.sort_indices(rows, sort_keys=[(time_field, "ascending")]))
            day = date(1970, 1, 1) + timedelta(days=int(d))
            final = day_dir(str(raw_dir), source.name, day)
            new = staging_name(final)
            for _, hour, idx in hour_groups(rows.column(time_field)):
                write_parquet(fs, f"{new}/hour={hour:02d}/part-0.parquet", rows.take(pa.array(idx)))
            ready[day] = (new, final)
    for day in sorted(ready):
        swap_in(fs, *ready[day])
    return [str(d) for d in sorted(ready)]


def _import_timed(spec: Spec, source: SourceSpec, files: list[Path], opts: ImportOptions, report: SourceReport,
                  tail: SampleTail | None) -> None:
    counts = {p: count_records(p, *file_format(p, source), header=source.header) for p in files} if opts.day else {}
    rule = TimeRule(opts.day, sum(counts.values()), opts.time_from, opts.time_to)
    staging = _Staging(opts.raw_dir / f"_import-{opts.run_id}" / source.name, source_arrow_schema(source), source.time or "")
    rejects = RejectsFile(opts.raw_dir, source.name, opts.run_id, opts.max_rejects_written)
    offset = 0
    try:
        for path in files:
            fmt, gz, columns = _open(path, source)
            header = 1 if fmt in DELIMITERS and source.header else 0
            rows, kept, reasons = 0, 0, Counter[str]()
            progress = Progress(path, opts.progress_every_s)
            for batch in read_batches(path, source, fmt, gz, columns):
                good, bad = typed_records(spec, source, batch, rule, offset - header)
                rows, kept = rows + good.num_rows + len(bad), kept + good.num_rows
                reasons.update(r.kind for r in bad)
                rejects.write(path, source.name, bad, batch)
                if tail is not None and source.kind == "events":
                    good, after = split_tail(good, source.time or "", tail.t)
                    tail.add_events(good, after)
                    report.streamed += after.num_rows
                elif tail is not None and source.kind == "labels":
                    tail.add_labels(good)
                staging.write(good)
                report.imported += good.num_rows
                progress.update(rows, batch.position)
            progress.done(rows, rows - kept)
            offset += counts.get(path, 0)
            report.records += rows
            report.reasons.update(reasons)
            if rows and not kept:
                raise _all_rejected(path, reasons, rows, source, rejects, opts.day is not None)
            if not rows:
                log.warning("%s holds no records", path)
        report.days = _write_days(staging.close(), opts.raw_dir, source)
    finally:
        staging.close()
        rejects.close()
        shutil.rmtree(opts.raw_dir / f"_import-{opts.run_id}", ignore_errors=True)
    report.rejects_file = str(rejects.path) if rejects.written else None


def _import_table(spec: Spec, source: SourceSpec, files: list[Path], opts: ImportOptions, report: SourceReport) -> None:
    fs = pafs.LocalFileSystem()
    final = source_dir(str(opts.raw_dir), source.name)
    new = staging_name(final)
    rejects = RejectsFile(opts.raw_dir, source.name, opts.run_id, opts.max_rejects_written)
    try:
        fs.create_dir(new, recursive=True)
        for i, path in enumerate(files):
            fmt, gz, columns = _open(path, source)
            rows, kept, reasons = 0, 0, Counter[str]()
            progress = Progress(path, opts.progress_every_s)
            with pq.ParquetWriter(f"{new}/part-{i}.parquet", source_arrow_schema(source)) as out:
                for batch in read_batches(path, source, fmt, gz, columns):
                    good, bad = typed_records(spec, source, batch, TimeRule())
                    rows, kept = rows + good.num_rows + len(bad), kept + good.num_rows
                    reasons.update(r.kind for r in bad)
                    rejects.write(path, source.name, bad, batch)
                    out.write_table(good)
                    progress.update(rows, batch.position)
            progress.done(rows, rows - kept)
            report.records, report.imported = report.records + rows, report.imported + kept
            report.reasons.update(reasons)
            if rows and not kept:
                raise _all_rejected(path, reasons, rows, source, rejects, True)
        swap_in(fs, new, final)
    finally:
        rejects.close()
        if fs.get_file_info(new).type != pafs.FileType.NotFound:
            fs.delete_dir(new)
    report.rejects_file = str(rejects.path) if rejects.written else None


def read_side_tables(spec: Spec, raw_dir: Path) -> dict[str, pa.Table]:
    """The side tables in the raw zone (a table not imported yet is left out: its defaults apply)."""
    out = {}
    for t in spec.tables:
        folder = Path(source_dir(str(raw_dir), t.name))
        if folder.is_dir() and any(folder.glob("*.parquet")):
            out[t.name] = pq.read_table(folder, schema=source_arrow_schema(t))
    return out


def import_files(spec: Spec, files: list[Path], opts: ImportOptions) -> ImportResult:
    """Load `files` into the raw zone (see the module docstring); raises RawDataError naming the
    file and the reasons when a file cannot be used at all."""
    raw = str(opts.raw_dir)
    if "://" in raw:
        raise RawDataError(f"slipstream import writes a local raw zone, and the raw dir is {raw}: import into a local "
                           "folder (SLIPSTREAM_RAW_DIR=/path) and copy it to the object store")
    by_source = assign_sources(spec, files, opts.source)
    tail = SampleTail(spec, opts.stream_after) if opts.stream_after is not None else None
    if tail is not None and spec.label.kind == "click_within" and spec.label_source and spec.label_source.name not in by_source:
        log.warning("--stream-after without a %s file: the streamed samples' labels come from the %s of this import, "
                    "so every one will be 0", spec.label_source.name, spec.label_source.name)
    reports: dict[str, SourceReport] = {}
    for source in sorted((spec.source(n) for n in by_source), key=lambda s: SOURCE_ORDER[s.kind]):
        report = reports[source.name] = SourceReport(source.name, source.kind, [str(p) for p in by_source[source.name]])
        if source.kind == "table":
            _import_table(spec, source, by_source[source.name], opts, report)
        else:
            _import_timed(spec, source, by_source[source.name], opts, report, tail)
    result = ImportResult(opts.run_id, raw, reports, opts.stream_after)
    if tail is not None:
        result.tail = tail.samples(read_side_tables(spec, opts.raw_dir))
    return result
