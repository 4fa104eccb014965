"""One day of preprocessing, for any feature spec: read the raw day, validate, build samples,
write, commit.

The raw data is read ONCE on the happy path: the pass that writes the sample files also counts
records and rejects (Spark observed metrics). Nothing is committed until those counts pass the
reject-rate check, so bad input leaves `samples` exactly as it was (the uncommitted files are
deleted). Rejected records cost a second pass only when there are any; per-file diagnostics are
computed only when the run fails. Parquet inputs are checked for missing required columns from
their footers before Spark reads them (schema drift). A day without raw events is skipped with a
warning: nothing is committed for it.
"""

from __future__ import annotations

import functools
import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from py4j.protocol import Py4JJavaError
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from slipstream.errors import DuplicateSampleIds, RawDataError, RejectRateExceeded
from slipstream.lake.iceberg import REJECTS_SCHEMA, commit_day_overwrite, rejects_table, samples_table
from slipstream.lake.raw_zone import day_dir, hour_dir, raw_format, spill_hours
from slipstream.lake.unique_ids import check_unique_ids, ids_can_repeat_across_days
from slipstream.samples.schema import sample_arrow_schema, source_arrow_schema
from slipstream.samples.spec import SAMPLE_ID, SourceSpec, Spec
from spark_jobs.finisher import SampleFinisher
from spark_jobs.raw_input import SOURCE, arrow_to_spark, line_offsets, list_raw_files, read_raw, spark_schema
from spark_jobs.transforms import (
    REASON,
    classify,
    exact_rows,
    finisher_columns,
    good,
    one_shuffle_rows,
    rejects_of,
    sort_key,
    stats_of,
    with_sample_id,
)
from spark_jobs.writer import WrittenFiles, write_parquet_files

log = logging.getLogger(__name__)

REJECTS_ARROW_SCHEMA = schema_to_pyarrow(REJECTS_SCHEMA, include_field_ids=False)
WORST_FILES_SHOWN = 5


@dataclass(frozen=True, kw_only=True)
class DayOptions:
    spec: Spec
    raw_dir: str
    namespace: str
    run_id: str
    max_reject_rate: float
    target_bytes: int
    attribution_s: int | None = None
    """Click-within specs: overrides the spec's window (seconds)."""
    write_mode: str = "pyarrow"
    spark_catalog: str = ""
    raw_io: Mapping[str, str] = field(default_factory=dict)
    """FileIO properties (S3 endpoint, keys) the driver reads raw Parquet footers and side tables with."""

    @property
    def window_s(self) -> int:
        return self.attribution_s if self.attribution_s is not None else self.spec.label.window_s


@dataclass(frozen=True)
class DayResult:
    day: str
    snapshot_id: int | None
    rows: int
    rejects: int
    raw_records: int
    files: int
    seconds: float
    empty: bool = False
    """The day had no raw events: skipped, nothing committed."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FileStats:
    kind: str
    records: int = 0
    parsed: int = 0
    rejects: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


def _collect_stats(stats: DataFrame, day: date) -> dict[str, FileStats]:
    """Per-file record and reject counts (a pass over the raw day; diagnostics and native mode)."""
    per_file: dict[str, FileStats] = {}
    try:
        rows = stats.collect()
    except (PySparkException, Py4JJavaError) as e:
        raise RawDataError(
            f"raw data of day {day} could not be read: {_read_error(e)}. Replace or remove that file "
            "and re-run the day; `samples` was left unchanged"
        ) from e
    for r in rows:
        fs = per_file.setdefault(r[SOURCE], FileStats(r["record_kind"]))
        fs.records += r["records"]
        fs.parsed += r["parsed"] or 0
        if r[REASON] is not None:
            fs.rejects += r["records"]
            fs.reasons[r[REASON]] += r["records"]
    return per_file


def _read_error(e: BaseException) -> str:
    """The file Spark failed on and the root cause, out of a long JVM stack trace."""
    text = str(e)
    found = re.search(r"error while reading file (\S+?)\.?\s", text)
    causes = re.findall(r"Caused by: ([^\n]+)", text)
    if found:
        return f"file {found.group(1)}" + (f" ({causes[-1].strip()})" if causes else "")
    return " ".join(line.strip() for line in text.strip().splitlines()[:3])[:600]


def _worst_files(per_file: dict[str, FileStats]) -> str:
    worst = sorted((fs.rejects / max(fs.records, 1), p, fs) for p, fs in per_file.items() if fs.rejects)
    shown = [f"{p} ({fs.rejects}/{fs.records} rejected)" for _, p, fs in reversed(worst[-WORST_FILES_SHOWN:])]
    return "; ".join(shown)


def _commit_rejects(spark: SparkSession, catalog: Catalog, opts: DayOptions, day: date, rejects: DataFrame,
                    n_rejects: int, props: dict[str, str]) -> None:
    """Replace the day's rejects (an empty set too: a clean re-run clears the old ones)."""
    table = rejects_table(catalog, opts.namespace)
    files: list[str] = []
    if n_rejects:
        written = write_parquet_files(
            rejects.coalesce(1), directory=f"{table.location()}/data/day={day}", run_tag=opts.run_id,
            io_properties=dict(table.io.properties), schema=REJECTS_ARROW_SCHEMA, target_bytes=opts.target_bytes,
        )
        files = written.paths
    commit_day_overwrite(table, day, files, snapshot_properties=props)


def _write_native(samples: DataFrame, opts: DayOptions, props: dict[str, str]) -> None:
    """Spark's own Iceberg writer (needs the Iceberg Spark runtime and a configured catalog)."""
    writer = samples.writeTo(f"{opts.spark_catalog}.{opts.namespace}.samples")
    for k, v in props.items():
        writer = writer.option(f"snapshot-property.{k}", v)
    writer.overwritePartitions()


def _native_snapshot_id(catalog: Catalog, opts: DayOptions, day: date) -> int | None:
    table = catalog.load_table(f"{opts.namespace}.samples")
    for snap in reversed(table.snapshots()):
        summary = snap.summary.additional_properties if snap.summary else {}
        if summary.get("run_id") == opts.run_id and summary.get("day") == str(day):
            return snap.snapshot_id
    return None


def _parquet_drift(files: dict[str, list[str]], spec: Spec, io_properties: Mapping[str, str]) -> list[str]:
    """Parquet files whose footer lacks a required column (read on the driver, no data)."""
    import pyarrow.parquet as pq

    from slipstream.lake.raw_zone import filesystem

    found: list[str] = []
    for name, paths in files.items():
        required = spec.source(name).required
        for path in paths:
            if raw_format(path) != "parquet":
                continue
            fs, inner = filesystem(path, io_properties)
            try:
                names = set(pq.read_schema(inner, filesystem=fs).names)
            except (OSError, ValueError) as e:  # ArrowInvalid is a ValueError
                raise RawDataError(f"raw data could not be read: file {path} ({e}). Replace or remove that "
                                   "file and re-run the day; `samples` was left unchanged") from e
            missing = [c for c in required if c not in names]
            if missing:
                found.append(f"{path}: required column(s) {', '.join(missing)} missing")
    return found


def read_side_tables(spec: Spec, raw_dir: str, io_properties: Mapping[str, str]) -> dict[str, Any]:
    """The spec's side tables from `<raw_dir>/<table>/` (whole tables, read on the driver); a
    table with no files is empty (every event takes its defaults, with a warning)."""
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    from slipstream.lake.raw_zone import filesystem

    out: dict[str, Any] = {}
    for src in spec.tables:
        fs, root = filesystem(f"{raw_dir.rstrip('/')}/{src.name}", io_properties)
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=True))
        schema = source_arrow_schema(src)
        parts = []
        for info in sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path):
            fmt = raw_format(info.path)
            with fs.open_input_file(info.path) as fh:
                if fmt == "parquet":
                    parts.append(pq.read_table(fh).select([f.name for f in schema if f.name in pq.read_schema(fh).names]))
                elif fmt == "json":
                    opts = pj.ParseOptions(explicit_schema=schema)
                    parts.append(pj.read_json(pa.input_stream(fh, compression="detect"), parse_options=opts))
        if not parts:
            log.warning("side table %s has no files under %s/%s: every event takes its defaults", src.name, raw_dir, src.name)
            out[src.name] = schema.empty_table()
            continue
        table = pa.concat_tables([p.cast(pa.schema([schema.field(n) for n in p.column_names])) for p in parts],
                                 promote_options="default")
        out[src.name] = table
        log.info("side table %s: %d rows", src.name, table.num_rows)
    return out


def _label_dirs(opts: DayOptions, source: SourceSpec, day: date) -> list[str]:
    """Where a day's label records can be: the whole day, and the next day's spill-over hours."""
    nxt = day + timedelta(days=1)
    return [day_dir(opts.raw_dir, source.name, day)] + [
        hour_dir(opts.raw_dir, source.name, nxt, h) for h in range(min(spill_hours(opts.window_s), 24))
    ]


def _reasons(per_file: dict[str, FileStats]) -> str:
    counts: Counter[str] = Counter()
    for fs in per_file.values():
        counts.update(fs.reasons)
    return "; ".join(f"{reason} in {n:,} records" for reason, n in counts.most_common(WORST_FILES_SHOWN))


def _fail_on_rejects(per_file: dict[str, FileStats], opts: DayOptions, day: date, n_rejects: int,
                     raw_records: int) -> RejectRateExceeded:
    rate = n_rejects / max(raw_records, 1)
    what = (f"all {raw_records:,} raw records of day {day} rejected" if n_rejects >= raw_records
            else f"day {day}: {n_rejects:,} of {raw_records:,} raw records rejected ({100 * rate:.2f}%), above "
                 f"the limit {100 * opts.max_reject_rate:.2f}%")
    return RejectRateExceeded(
        f"{what}: {_reasons(per_file)}. Worst files: {_worst_files(per_file)}. "
        f"Inspect them in {opts.namespace}.samples_rejects (day = '{day}'); `samples` was left "
        "unchanged. Fix the records or the spec (a field that may be missing is `optional: true` with a "
        "`default`); raise SLIPSTREAM_SPARK_MAX_REJECT_RATE only if the data is known to be fine"
    )


def preprocess_day(spark: SparkSession, catalog: Catalog, opts: DayOptions, day: date,
                   side_tables: Any = None) -> DayResult:
    """Preprocess one raw day into `samples` (one commit) and `samples_rejects`. `side_tables`:
    the spec's side tables (a Spark broadcast of `tables_to_ipc` bytes, or tables), read once per
    job by the caller; None reads them here."""
    t0 = time.monotonic()
    spec = opts.spec
    ev = spec.events
    ev_files = list_raw_files(spark, [day_dir(opts.raw_dir, ev.name, day)])
    if not ev_files:
        log.warning("day %s: no %s files under %s: day skipped (nothing committed; a window over it trains "
                    "without it)", day, ev.name, day_dir(opts.raw_dir, ev.name, day))
        return DayResult(str(day), None, 0, 0, 0, 0, round(time.monotonic() - t0, 3), empty=True)
    files = {ev.name: ev_files}
    lab_src = spec.label_source
    if lab_src is not None:
        files[lab_src.name] = list_raw_files(spark, _label_dirs(opts, lab_src, day))
        if not files[lab_src.name]:
            log.warning("day %s: no %s files found; every sample of the day will have label 0", day, lab_src.name)
    log.info("day %s: %s", day, ", ".join(f"{len(v)} {k} files" for k, v in files.items()))
    drift = _parquet_drift(files, spec, opts.raw_io)
    if drift:
        raise RawDataError(
            f"schema drift in the raw data of day {day}: {'; '.join(drift[:WORST_FILES_SHOWN])}. "
            "Fix the producer or the files; `samples` was left unchanged"
        )
    if side_tables is None:
        side_tables = read_side_tables(spec, opts.raw_dir, opts.raw_io)
    classified = {ev.name: classify(read_raw(spark, ev_files, spark_schema(ev)), ev, day)}
    if lab_src is not None:
        classified[lab_src.name] = classify(read_raw(spark, files[lab_src.name], spark_schema(lab_src)), lab_src)
    seen = {name: _observed(df, name) for name, df in classified.items()}
    good_events = with_sample_id(good(seen[ev.name][0]), spec)
    good_labels = good(seen[lab_src.name][0]) if lab_src is not None else None
    table = samples_table(catalog, opts.namespace, spec)
    props = {"day": str(day), "run_id": opts.run_id, "spec": f"{spec.name}@{spec.version}:{spec.digest}"}

    if opts.write_mode == "native":
        # Spark's Iceberg writer commits as it writes: decide on the rejects first (one more pass).
        per_file = _collect_stats(stats_of(classified, spec), day)
        raw_records = sum(fs.records for fs in per_file.values())
        n_rejects = sum(fs.rejects for fs in per_file.values())
        _settle_rejects(spark, catalog, opts, day, classified, n_rejects, raw_records, props, per_file, files)
        finisher = SampleFinisher(spec, sort_key(spec), side_tables)
        samples = exact_rows(good_events, good_labels, spec).mapInArrow(
            finisher, arrow_to_spark(sample_arrow_schema(spec)))
        rows = samples.count()
        props.update(rows=str(rows), rejects=str(n_rejects))
        if ids_can_repeat_across_days(spec):  # Spark's writer commits as it writes: check the ids first
            ids = good_events.select(SAMPLE_ID).distinct().toArrow().column(SAMPLE_ID)
            check_unique_ids(table.refresh(), spec, {day: ids})
        _write_native(samples, opts, props)
        snapshot_id, n_files = _native_snapshot_id(catalog, opts, day), -1
    else:
        t_write = time.monotonic()
        directory = f"{table.location()}/data/event_time_day={day}"
        try:
            written = _write_samples(good_events, good_labels, opts, table, directory, side_tables)
        except (PySparkException, Py4JJavaError) as e:
            raise RawDataError(
                f"raw data of day {day} could not be read: {_read_error(e)}. Replace or remove that file "
                "and re-run the day; `samples` was left unchanged"
            ) from e
        raw_records, n_rejects = 0, 0
        for df, obs in seen.values():
            got = _observation(obs, df)
            raw_records += got["records"]
            n_rejects += got["rejects"]
        log.info("day %s: read %d raw records and wrote %d samples in %.1fs (%.0f records/s)", day, raw_records,
                 written.rows, time.monotonic() - t_write, raw_records / max(time.monotonic() - t_write, 1e-9))
        try:
            _settle_rejects(spark, catalog, opts, day, classified, n_rejects, raw_records, props, None, files)
            check_unique_ids(table.refresh(), spec, {day: _written_ids(table.io, written.paths)})
        except (RejectRateExceeded, DuplicateSampleIds):
            for path in written.paths:  # never committed: remove them so no orphan files remain
                table.io.delete(path)
            raise
        rows, n_files = written.rows, len(written.paths)
        props.update(rows=str(rows), rejects=str(n_rejects))
        snapshot_id = commit_day_overwrite(table, day, written.paths, snapshot_properties=props)
    seconds = time.monotonic() - t0
    log.info("day %s: %d samples, %d rejects in %.1fs (%.0f rows/s), snapshot %s",
             day, rows, n_rejects, seconds, rows / max(seconds, 1e-9), snapshot_id)
    return DayResult(str(day), snapshot_id, rows, n_rejects, raw_records, n_files, round(seconds, 3))


def _observed(df: DataFrame, name: str) -> tuple[DataFrame, Observation]:
    obs = Observation(f"{name}-{uuid.uuid4().hex[:8]}")  # unique: a session runs many days
    return df.observe(obs, F.count(F.lit(1)).alias("records"), F.count(F.col(REASON)).alias("rejects")), obs


def _observation(obs: Observation, df: DataFrame) -> dict[str, int]:
    """The counts the write pass observed; counted again when Spark skipped the observation (a
    plan that read no row of the source, e.g. when every record was rejected)."""
    try:
        got = obs.get
    except Exception:  # the observed metrics were not collected  # noqa: BLE001
        got = {}
    if "records" in got:
        return {"records": int(got["records"]), "rejects": int(got["rejects"])}
    row = df.agg(F.count(F.lit(1)).alias("records"), F.count(F.col(REASON)).alias("rejects")).collect()[0]
    return {"records": int(row["records"]), "rejects": int(row["rejects"])}


def _write_samples(events: DataFrame, labels: DataFrame | None, opts: DayOptions, table: Any,
                   directory: str, side_tables: Any) -> WrittenFiles:
    """Write the day's samples (uncommitted) and return the files.

    First with ONE shuffle (by the spec's key; `one_shuffle_rows`): the writer drops the copies of
    an event that sort next to the copy to keep, which is every copy with the same key and time
    (log replays). Then the written sample ids are checked; a duplicate left means copies that
    differ in key or time, and only then the day is written again with the exact dedupe (a
    cogroup by id, a second shuffle), after deleting the first files. Either way the rows equal
    the exact plan's. The writer's tasks compute the features (spark_jobs.finisher)."""
    spec = opts.spec
    common = dict(directory=directory, run_tag=opts.run_id, io_properties=dict(table.io.properties),
                  schema=sample_arrow_schema(spec), target_bytes=opts.target_bytes, columns=finisher_columns(spec))
    key = sort_key(spec)
    written = write_parquet_files(
        one_shuffle_rows(events, labels, spec),
        prepare=functools.partial(SampleFinisher, spec, key, side_tables, True), **common,
    )
    surplus, examples = _duplicates_in(table.io, written.paths)
    if not surplus:
        return written
    log.info("%d sample ids are duplicated across keys or event times (e.g. %s): writing the day again "
             "with the dedupe by id", surplus, ", ".join(examples))
    for path in written.paths:
        table.io.delete(path)
    return write_parquet_files(
        exact_rows(events, labels, spec), prepare=functools.partial(SampleFinisher, spec, key, side_tables), **common,
    )


def _written_ids(io: Any, paths: list[str]) -> Any:
    """The sample ids of the written files (one column read), as one chunked array."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = []
    for path in paths:
        with io.new_input(path).open() as f:
            parts.append(pq.read_table(f, columns=[SAMPLE_ID]).column(SAMPLE_ID))
    return pa.chunked_array([c for p in parts for c in p.chunks], type=pa.string())


def _duplicates_in(io: Any, paths: list[str]) -> tuple[int, list[str]]:
    """(surplus copies, a few ids) of the sample ids in the written files (one column read)."""
    from slipstream.quality.metrics import duplicate_ids

    if not paths:
        return 0, []
    return duplicate_ids(_written_ids(io, paths))


def _settle_rejects(spark: SparkSession, catalog: Catalog, opts: DayOptions, day: date,
                    classified: dict[str, DataFrame], n_rejects: int, raw_records: int, props: dict[str, str],
                    per_file: dict[str, FileStats] | None, files: Mapping[str, list[str]]) -> None:
    """Replace the day's rejects (each with its file and line), then refuse the day when there are
    too many of them."""
    rate = n_rejects / max(raw_records, 1)
    failing = rate > opts.max_reject_rate
    if n_rejects and (failing or per_file is not None):
        per_file = per_file or _collect_stats(stats_of(classified, opts.spec), day)
        log.warning("day %s: %d of %d raw records rejected (%.3f%%): %s; worst files: %s",
                    day, n_rejects, raw_records, 100 * rate, _reasons(per_file), _worst_files(per_file))
    elif n_rejects:
        log.warning("day %s: %d of %d raw records rejected (%.3f%%); see %s.samples_rejects",
                    day, n_rejects, raw_records, 100 * rate, opts.namespace)
    offsets = {name: line_offsets(spark, paths) for name, paths in files.items()} if n_rejects else None
    _commit_rejects(spark, catalog, opts, day, rejects_of(classified, opts.spec, day, opts.run_id, offsets), n_rejects,
                    {**props, "rejects": str(n_rejects)})
    if failing:
        raise _fail_on_rejects(per_file or {}, opts, day, n_rejects, raw_records)
