"""A range of raw days into `samples` in one Spark pass: read every day's files at once, build the
samples, write one set of files per day, commit the range as ONE snapshot.

The per-day path (`spark_jobs.day_job`) pays a read, a join, a write and a commit of its own for
every day: about 1.9 s a day however small on the 2-core dev machine. Here the cost grows with
the rows, not the days:

- one listing on the driver (`range_input`), one Spark read of all the files; each record knows
  its day from its folder and is checked against it, as a one-day job checks it;
- ONE shuffle by (day, a split key) and a sort by (day, key, time, id): a small day's rows all go
  to one task (one file per day), a large day's rows spread over the tasks by key like a day of
  its own; sequences stay per key and UTC day, and the writer drops the copies of an event within
  a day, so the samples equal the day-by-day job's row for row;
- the writer closes its file at each day boundary (every file holds one day) and counts each
  day's records;
- one commit for the range (`commit_days_overwrite`): one OVERWRITE snapshot that replaces exactly
  the range's days that had raw events, so a reader sees all of them old or all new, and a re-run
  replaces the same days (idempotent). Rejects are replaced per day in one commit the same way.

A range larger than `PASS_BYTES` of raw data runs in passes of consecutive days (one snapshot
each) with progress, rate and ETA after each. A day above the reject-rate limit is not
committed (its rejects are); the range's other days are, and the run then fails naming the day.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any

from py4j.protocol import Py4JJavaError
from pyiceberg.catalog import Catalog
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from slipstream.errors import RawDataError, RejectRateExceeded
from slipstream.lake.iceberg import commit_days_overwrite, rejects_table, samples_table
from slipstream.samples.schema import sample_arrow_schema
from slipstream.samples.spec import EVENT_TIME
from spark_jobs.day_job import (
    REJECTS_ARROW_SCHEMA,
    WORST_FILES_SHOWN,
    DayOptions,
    DayResult,
    _collect_stats,
    _duplicates_in,
    _fail_on_rejects,
    _observation,
    _observed,
    _read_error,
    read_side_tables,
)
from spark_jobs.finisher import SampleFinisher, tables_to_ipc
from spark_jobs.range_input import DAY, RangeFiles, folder_day, folders, list_range_files, parquet_drift
from spark_jobs.raw_input import read_raw_folders, spark_schema
from spark_jobs.transforms import (
    REASON,
    classify,
    exact_range_rows,
    finisher_columns,
    good,
    range_rows,
    rejects,
    sort_key,
    stats_of,
    with_sample_id,
)
from spark_jobs.writer import Split, WrittenDays, write_day_files

log = logging.getLogger(__name__)

SPLIT_BYTES = 64 << 20
"""A day with more raw bytes than this is spread over the tasks by key; a smaller one is one task."""
PASS_BYTES = 4 << 30
"""Raw bytes per pass of a long range (one Spark job and one snapshot each)."""
SAMPLES_SPLIT = Split("event_time_day", output_time=EVENT_TIME, input_day=DAY)


def plan_passes(days: Sequence[date], sizes: dict[date, int], max_bytes: int = PASS_BYTES) -> list[list[date]]:
    """Consecutive runs of `days` of at most `max_bytes` raw bytes each (a larger day alone)."""
    passes: list[list[date]] = []
    size = 0
    for d in sorted(days):
        if passes and size + sizes.get(d, 0) <= max_bytes:
            passes[-1].append(d)
            size += sizes.get(d, 0)
        else:
            passes.append([d])
            size = sizes.get(d, 0)
    return passes


def preprocess_range(spark: SparkSession, catalog: Catalog, opts: DayOptions, days: Sequence[date], side_tables: Any,
                     on_day: Callable[[DayResult], None]) -> list[DayResult]:
    """Preprocess `days` (any order, repeats ignored) into `samples` and `samples_rejects`; calls
    `on_day` with each day's result once it is committed (or skipped: a day without events), so
    a caller's summary holds what was committed even when a later pass fails. `side_tables`: the
    spec's side tables as `share_side_tables` gives them, read once per job by the caller; None
    reads them here."""
    t0 = time.monotonic()
    if side_tables is None:
        side_tables = tables_to_ipc(read_side_tables(opts.spec, opts.raw_dir, opts.raw_io))
    days = sorted(set(days))
    spec = opts.spec
    files = list_range_files(spec, opts.raw_dir, days, opts.window_s, opts.raw_io)
    log.info("%d days %s..%s: %d %s files, %d %s files (listed in %.1fs)", len(days), days[0], days[-1],
             len(files.all_events()), spec.events.name, len(files.all_labels()),
             spec.label_source.name if spec.label_source else "labels", time.monotonic() - t0)
    out: list[DayResult] = []
    for d in days:
        if d not in files.events:
            log.warning("day %s: no %s files: day skipped (nothing committed; a window over it trains without it)",
                        d, spec.events.name)
            out.append(DayResult(str(d), None, 0, 0, 0, 0, 0.0, empty=True))
            on_day(out[-1])
        elif spec.label_source is not None and not files.labels.get(d):
            log.warning("day %s: no %s files found; every sample of the day will have label 0", d, spec.label_source.name)
    drift = parquet_drift({spec.events.name: files.all_events(),
                           **({spec.label_source.name: files.all_labels()} if spec.label_source else {})}, spec, opts.raw_io)
    if drift:
        raise RawDataError(f"schema drift in the raw data: {'; '.join(drift[:WORST_FILES_SHOWN])}. "
                           "Fix the producer or the files; `samples` was left unchanged")
    busy = [d for d in days if d in files.events]
    passes = plan_passes(busy, files.event_bytes)
    total_bytes, done_bytes, rows = sum(files.event_bytes.values()), 0, 0
    for i, pass_days in enumerate(passes):
        results, failure = _run_pass(spark, catalog, opts, pass_days, files, side_tables)
        for r in results:
            out.append(r)
            on_day(r)
        done_bytes += sum(files.event_bytes[d] for d in pass_days)
        rows += sum(r.rows for r in results)
        spent = time.monotonic() - t0
        log.info("progress: %d/%d days (pass %d/%d), %d samples, %.0f rows/s, ETA %.0fs", len(out), len(days), i + 1,
                 len(passes), rows, rows / max(spent, 1e-9), spent / max(done_bytes, 1) * (total_bytes - done_bytes))
        if failure is not None:
            raise failure
    return sorted(out, key=lambda r: r.day)


def _split_key(spec_key: str, days: Sequence[date], sizes: dict[date, int]) -> Column:
    """Null for a small day (one task), the sort key for a large one (spread by key)."""
    big = [d for d in days if sizes.get(d, 0) >= SPLIT_BYTES]
    if not big:
        return F.lit(None)
    if len(big) == len(days):
        return F.col(spec_key)
    return F.when(F.col(DAY).isin(big), F.col(spec_key))


def _classified(spark: SparkSession, opts: DayOptions, days: Sequence[date], files: RangeFiles) -> dict[str, DataFrame]:
    spec = opts.spec
    ev, lab = spec.events, spec.label_source
    raw = read_raw_folders(spark, folders(files.event_folders, days), spark_schema(ev))
    out = {ev.name: classify(raw.withColumn(DAY, folder_day()), ev, F.col(DAY))}
    if lab is not None:
        raw = read_raw_folders(spark, folders(files.label_folders, days), spark_schema(lab))
        out[lab.name] = classify(raw.withColumn(DAY, folder_day(days)), lab)
    return out


def _write_range(events: DataFrame, labels: DataFrame | None, opts: DayOptions, table: Any, side: Any,
                 split_key: Column) -> WrittenDays:
    """Write the range's samples (uncommitted), one shuffle; days whose written ids hold copies
    the sort could not put side by side are written again with the exact dedupe (as a day alone)."""
    spec = opts.spec
    key = sort_key(spec)
    common: dict[str, Any] = dict(directory=f"{table.location()}/data", run_tag=opts.run_id,
                                  io_properties=dict(table.io.properties), schema=sample_arrow_schema(spec),
                                  target_bytes=opts.target_bytes, columns=[*finisher_columns(spec), DAY])
    written = write_day_files(range_rows(events, labels, spec, DAY, split_key), split=SAMPLES_SPLIT,
                              prepare=functools.partial(SampleFinisher, spec, key, side, True, DAY), **common)
    redo = [d for d, paths in written.paths.items() if _duplicates_in(table.io, paths)[0]]
    if not redo:
        return written
    log.info("days %s: sample ids duplicated across keys or event times: writing them again with the dedupe by id",
             ", ".join(redo))
    for d in redo:
        for path in written.paths[d]:
            table.io.delete(path)
    again = write_day_files(
        exact_range_rows(events.where(F.col(DAY).isin([date.fromisoformat(d) for d in redo])), labels, spec, DAY, split_key),
        split=Split(SAMPLES_SPLIT.folder, output_time=EVENT_TIME),
        prepare=functools.partial(SampleFinisher, spec, key, side, False, DAY), **common)
    paths = {**written.paths, **{d: again.paths.get(d, []) for d in redo}}
    rows = {**written.rows, **{d: again.rows.get(d, 0) for d in redo}}
    return WrittenDays(paths, rows, written.inputs, written.bytes + again.bytes)


def _write_rejects(catalog: Catalog, opts: DayOptions, days: Sequence[date], classified: dict[str, DataFrame],
                   any_rejects: bool, props: dict[str, str]) -> dict[str, int]:
    """Replace the days' rejects in ONE commit (a day now clean loses its old ones); returns the
    rejects per day."""
    table = rejects_table(catalog, opts.namespace)
    by_day: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    if any_rejects:
        parts = [rejects(df, F.col(DAY), opts.run_id, opts.spec.source(name)) for name, df in classified.items()]
        df = functools.reduce(DataFrame.unionByName, parts)
        written = write_day_files(df.repartition("day").sortWithinPartitions("day"), directory=f"{table.location()}/data",
                                  split=Split("day", output_day="day"), run_tag=opts.run_id,
                                  io_properties=dict(table.io.properties), schema=REJECTS_ARROW_SCHEMA,
                                  target_bytes=opts.target_bytes)
        by_day, counts = written.paths, written.rows
    commit_days_overwrite(table, {d: by_day.get(str(d), []) for d in days}, snapshot_properties=props)
    return counts


def _label_counts(labels: DataFrame | None) -> dict[str, tuple[int, int]]:
    """(records, rejects) of the labels source per day they count toward (a small second read)."""
    if labels is None:
        return {}
    rows = labels.groupBy(DAY).agg(F.count(F.lit(1)).alias("n"), F.count(F.col(REASON)).alias("bad")).collect()
    return {str(r[DAY]): (int(r["n"]), int(r["bad"])) for r in rows}


def _run_pass(spark: SparkSession, catalog: Catalog, opts: DayOptions, days: list[date], files: RangeFiles,
              side: Any) -> tuple[list[DayResult], RejectRateExceeded | None]:
    """One Spark pass over `days` (every one has events files) and its commits; returns the days'
    results and, when a day was refused for its reject rate, the error to raise."""
    t0 = time.monotonic()
    spec = opts.spec
    ev, lab = spec.events, spec.label_source
    classified = _classified(spark, opts, days, files)
    if lab is not None:
        # the labels are small and read twice (the join, then their count per day): read the files once
        classified[lab.name] = classified[lab.name].persist()
    seen = {name: _observed(df, name) for name, df in classified.items()}
    good_events = with_sample_id(good(seen[ev.name][0]), spec)
    good_labels = good(seen[lab.name][0]).drop(DAY) if lab is not None else None
    table = samples_table(catalog, opts.namespace, spec)
    what = f"{days[0]}" if len(days) == 1 else f"{days[0]}..{days[-1]}"
    clock = _Clock()
    try:
        written = _write_range(good_events, good_labels, opts, table, side, _split_key(sort_key(spec), days, files.event_bytes))
        clock.lap("write")
        got = {name: _observation(obs, df) for name, (df, obs) in seen.items()}
        labels = _label_counts(classified[lab.name] if lab is not None else None)
        clock.lap("count labels")
    except (PySparkException, Py4JJavaError) as e:
        raise RawDataError(f"raw data of {what} could not be read: {_read_error(e)}. Replace or remove that file and "
                           "re-run; `samples` was left unchanged") from e
    finally:
        if lab is not None:
            classified[lab.name].unpersist()
    n_rejects = sum(g["rejects"] for g in got.values())
    props = {"run_id": opts.run_id, "spec": f"{spec.name}@{spec.version}:{spec.digest}", **_day_props(days)}
    rejects_by_day = _write_rejects(catalog, opts, days, classified, n_rejects > 0, {**props, "rejects": str(n_rejects)})
    clock.lap("rejects")
    results, failing = [], []
    for d in days:
        k = str(d)
        raw = written.inputs.get(k, 0) + rejects_by_day.get(k, 0) - labels.get(k, (0, 0))[1] + labels.get(k, (0, 0))[0]
        bad = rejects_by_day.get(k, 0)
        if bad / max(raw, 1) > opts.max_reject_rate:
            failing.append((d, bad, raw))
        elif bad:
            log.warning("day %s: %d of %d raw records rejected (%.3f%%); see %s.samples_rejects", d, bad, raw,
                        100 * bad / max(raw, 1), opts.namespace)
        results.append((d, raw, bad))
    refused = {d for d, _, _ in failing}
    for d in refused:
        for path in written.paths.get(str(d), []):  # never committed: remove them so no orphan files remain
            table.io.delete(path)
    keep = [d for d in days if d not in refused]
    snapshot_id = None
    if keep:
        props.update(_day_props(keep), rows=str(sum(written.rows.get(str(d), 0) for d in keep)),
                     rejects=str(sum(rejects_by_day.get(str(d), 0) for d in keep)))
        snapshot_id = commit_days_overwrite(table, {d: written.paths.get(str(d), []) for d in keep},
                                            snapshot_properties=props)
    clock.lap("commit")
    share = round((time.monotonic() - t0) / len(days), 3)
    out = [DayResult(str(d), None if d in refused else snapshot_id, 0 if d in refused else written.rows.get(str(d), 0),
                     bad, raw, 0 if d in refused else len(written.paths.get(str(d), [])), share)
           for d, raw, bad in results]
    rows = sum(r.rows for r in out)
    log.info("%s: %d samples of %d raw records, %d rejects in %.1fs (%.0f rows/s; %s), snapshot %s", what, rows,
             sum(r.raw_records for r in out), sum(r.rejects for r in out), time.monotonic() - t0,
             rows / max(time.monotonic() - t0, 1e-9), clock, snapshot_id)
    return out, _refusal(spark, opts, failing, files) if failing else None


class _Clock:
    """Seconds per phase of a pass, for its log line."""

    def __init__(self) -> None:
        self.mark = time.monotonic()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = now - self.mark
        self.mark = now

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.1f}s" for k, v in self.laps.items())


def _day_props(days: Sequence[date]) -> dict[str, str]:
    """Snapshot summary properties naming the days a commit replaced."""
    if len(days) == 1:
        return {"day": str(days[0]), "days": str(days[0]), "day_count": "1"}
    return {"days": f"{days[0]}..{days[-1]}", "day_count": str(len(days))}


def _refusal(spark: SparkSession, opts: DayOptions, failing: list[tuple[date, int, int]],
             files: RangeFiles) -> RejectRateExceeded:
    """The error naming the refused days, with the reasons and worst files of the worst one (a
    per-file pass over its files only)."""
    worst_day, n_bad, raw = max(failing, key=lambda f: f[1] / max(f[2], 1))
    per_file = _collect_stats(stats_of(_classified(spark, opts, [worst_day], files), opts.spec), worst_day)
    err = _fail_on_rejects(per_file, opts, worst_day, n_bad, raw)
    if len(failing) == 1:
        return err
    others = ", ".join(f"{d} ({b:,} of {r:,} rejected)" for d, b, r in failing if d != worst_day)
    return RejectRateExceeded(f"{err}. Also above the limit: {others}; `samples` kept its old rows for those days too")
