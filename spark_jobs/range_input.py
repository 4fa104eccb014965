"""The raw files of a range of days, listed once on the driver, and each record's day.

A range job reads every raw file of its days in one Spark read. The listing is pyarrow's (one
recursive listing of a source folder, or one per day folder for a short range): Hadoop's listing
through Py4J costs about 10 ms a file on the 2-core dev machine, which made a 200-day listing
take 50 s. A record's day is the `day=YYYY-MM-DD` folder it was read from, as in a one-day job
(where the folder is the day being built).

Labels (clicks) for day D are D's files and the first `spill_hours` hour folders of D+1 (a click
on a late event lands after midnight). A labels file read only as such spill-over (D+1 is not in
the range) counts toward D, the day that read it; every other labels file counts toward its own
folder's day, once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, timedelta

from pyarrow import fs as pafs
from pyspark.sql import Column
from pyspark.sql import functions as F

from slipstream.errors import RawDataError
from slipstream.lake.raw_zone import filesystem, raw_format, source_dir, spill_hours
from slipstream.samples.spec import Spec
from spark_jobs.raw_input import SOURCE

log = logging.getLogger(__name__)

DAY = "_day"
"""The date column a range job gives every raw record: the day it belongs to."""
LIST_ROOT_ABOVE_DAYS = 16
"""Longer ranges list a source's folder once (recursively) instead of one listing per day."""
FOOTER_THREADS = 8
_DAY_DIR = re.compile(r"(/day=\d{4}-\d{2}-\d{2})(?:/|$)")
_HOUR_DIR = re.compile(r"(/hour=\d{2})(?:/|$)")


@dataclass
class RangeFiles:
    """Raw files of a range, by day."""

    events: dict[date, list[str]] = field(default_factory=dict)
    """The events files of each day of the range that has any."""
    event_bytes: dict[date, int] = field(default_factory=dict)
    labels: dict[date, list[str]] = field(default_factory=dict)
    """Labels files by the day they count toward (see the module docstring)."""
    event_folders: dict[date, dict[str, set[str]]] = field(default_factory=dict)
    """What Spark reads for a day's events: its `day=` folder, by the formats found there."""
    label_folders: dict[date, dict[str, set[str]]] = field(default_factory=dict)
    """What Spark reads for the labels a day counts: `day=` folders, and `hour=` folders of spill-over."""

    def all_labels(self) -> list[str]:
        return sorted(p for ps in self.labels.values() for p in ps)

    def all_events(self) -> list[str]:
        return sorted(p for ps in self.events.values() for p in ps)


def folders(by_day: dict[date, dict[str, set[str]]], days: Sequence[date]) -> dict[str, list[str]]:
    """The folders to read for `days`, by format (`json`/`parquet`)."""
    out: dict[str, set[str]] = {}
    for d in days:
        for fmt, where in by_day.get(d, {}).items():
            out.setdefault(fmt, set()).update(where)
    return {fmt: sorted(where) for fmt, where in out.items()}


def _add(by_day: dict[date, dict[str, set[str]]], day: date, uri: str, cut: re.Pattern[str]) -> None:
    """Record the folder (`uri` up to the end of `cut`'s match) that holds `uri`, by format."""
    found = cut.search(uri)
    assert found is not None  # the listing kept only paths with a day= folder
    by_day.setdefault(day, {}).setdefault(raw_format(uri) or "", set()).add(uri[: found.end(1)])


def _uri(raw_dir: str, path: str) -> str:
    """A path the pyarrow filesystem listed, as a URI Spark opens (the raw dir's scheme)."""
    if "://" in raw_dir:
        return f"{raw_dir.split('://', 1)[0]}://{path.lstrip('/')}"
    return path


def _listing(raw_dir: str, folders: Sequence[str], io: Mapping[str, str]) -> list[tuple[str, int]]:
    """(URI, size) of the data files under `folders` (recursively); a missing folder is empty."""
    out: list[tuple[str, int]] = []
    for folder in folders:
        fs, inner = filesystem(folder, io)
        infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True, recursive=True))
        out += [(_uri(raw_dir, i.path), int(i.size or 0)) for i in infos
                if i.type == pafs.FileType.File and raw_format(i.path) and not _hidden(i.path[len(inner):])]
    return out


def _hidden(rel: str) -> bool:
    """A path inside a listed folder that crosses a `_…` or `.…` folder (staging, markers)."""
    return any(part.startswith(("_", ".")) for part in rel.strip("/").split("/")[:-1])


def _source_files(raw_dir: str, source: str, days: Sequence[date], io: Mapping[str, str]) -> list[tuple[date, int, str, int]]:
    """(folder day, hour or -1, URI, size) of a source's files on `days`."""
    root = source_dir(raw_dir, source)
    wanted = set(days)
    folders = [root] if len(wanted) > LIST_ROOT_ABOVE_DAYS else [f"{root}/day={d.isoformat()}" for d in sorted(wanted)]
    out = []
    for uri, size in _listing(raw_dir, folders, io):
        found = _DAY_DIR.search(uri)
        if found is None:
            continue
        day = date.fromisoformat(found.group(1)[len("/day="):])
        if day in wanted:
            hour = _HOUR_DIR.search(uri)
            out.append((day, int(hour.group(1)[len("/hour="):]) if hour else -1, uri, size))
    return out


def list_range_files(spec: Spec, raw_dir: str, days: Sequence[date], window_s: int, io: Mapping[str, str]) -> RangeFiles:
    """The events and labels files the days need (see the module docstring)."""
    found = RangeFiles()
    for day, _, uri, size in _source_files(raw_dir, spec.events.name, days, io):
        found.events.setdefault(day, []).append(uri)
        found.event_bytes[day] = found.event_bytes.get(day, 0) + size
        _add(found.event_folders, day, uri, _DAY_DIR)
    for files in found.events.values():
        files.sort()
    lab = spec.label_source
    if lab is not None:
        spill = min(spill_hours(window_s), 24)
        in_range = set(days)
        after = {d + timedelta(days=1) for d in days} - in_range
        for day, hour, uri, _ in _source_files(raw_dir, lab.name, sorted(in_range | after), io):
            if day in in_range:
                found.labels.setdefault(day, []).append(uri)
                _add(found.label_folders, day, uri, _DAY_DIR)
            elif 0 <= hour < spill:  # only the spill-over hours of the day after a range day
                found.labels.setdefault(day - timedelta(days=1), []).append(uri)
                _add(found.label_folders, day - timedelta(days=1), uri, _HOUR_DIR)
        for files in found.labels.values():
            files.sort()
    return found


def folder_day(days_in_range: Sequence[date] | None = None) -> Column:
    """Each record's day from its file's `day=` folder; with `days_in_range`, a day outside them
    (a labels spill-over file) counts toward the day before it."""
    folder = F.to_date(F.regexp_extract(F.col(SOURCE), r"/day=(\d{4}-\d{2}-\d{2})/", 1))
    if days_in_range is None:
        return folder
    return F.when(folder.isin(list(days_in_range)), folder).otherwise(F.date_sub(folder, 1))


def parquet_drift(files: Mapping[str, list[str]], spec: Spec, io: Mapping[str, str]) -> list[str]:
    """Parquet files whose footer lacks a required column (footers only, read on the driver by a
    few threads: a range has thousands of hour files)."""
    import pyarrow.parquet as pq

    def missing(name_path: tuple[str, str]) -> str | None:
        name, path = name_path
        fs, inner = filesystem(path, io)
        try:
            names = set(pq.read_schema(inner, filesystem=fs).names)
        except (OSError, ValueError) as e:  # ArrowInvalid is a ValueError
            raise RawDataError(f"raw data could not be read: file {path} ({e}). Replace or remove that "
                               "file and re-run; `samples` was left unchanged") from e
        lacking = [c for c in spec.source(name).required if c not in names]
        return f"{path}: required column(s) {', '.join(lacking)} missing" if lacking else None

    todo = [(name, p) for name, paths in files.items() for p in paths if raw_format(p) == "parquet"]
    if not todo:
        return []
    with ThreadPoolExecutor(max_workers=min(FOOTER_THREADS, len(todo)), thread_name_prefix="footers") as pool:
        return [m for m in pool.map(missing, todo) if m]
