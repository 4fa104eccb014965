"""One day of preprocessing: read the raw day, validate, build samples, write, commit.

The raw data is read ONCE on the happy path: the pass that writes the sample files also counts
records and rejects (Spark observed metrics). Nothing is committed until those counts pass the
reject-rate check, so bad input leaves `samples` exactly as it was (the uncommitted files are
deleted). Rejected records cost a second pass only when there are any; per-file diagnostics are
computed only when the run fails. Parquet inputs are checked for missing columns from their
footers before Spark reads them (schema drift).
"""

from __future__ import annotations

import functools
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Mapping

from py4j.protocol import Py4JJavaError
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from slipstream.errors import RawDataError, RejectRateExceeded
from slipstream.lake.iceberg import REJECTS_SCHEMA, commit_day_overwrite, rejects_table, samples_table
from slipstream.lake.raw_zone import IMPRESSIONS, click_dirs, day_dir
from slipstream.samples.schema import ARROW_SCHEMA
from spark_jobs.arrow_finish import SampleFinisher
from spark_jobs.raw_input import CLICK_SCHEMA, IMPRESSION_SCHEMA, SOURCE, list_raw_files, read_raw
from spark_jobs.transforms import (
    REASON,
    UNFINISHED_COLUMNS,
    build_samples,
    classify_clicks,
    classify_impressions,
    good,
    rejects_of,
    stats_of,
    unfinished_samples,
    unfinished_samples_one_shuffle,
)
from spark_jobs.writer import WrittenFiles, write_parquet_files

log = logging.getLogger(__name__)

REJECTS_ARROW_SCHEMA = schema_to_pyarrow(REJECTS_SCHEMA, include_field_ids=False)
WORST_FILES_SHOWN = 5


@dataclass(frozen=True, kw_only=True)
class DayOptions:
    raw_dir: str
    namespace: str
    run_id: str
    attribution_s: int
    max_reject_rate: float
    target_bytes: int
    write_mode: str = "pyarrow"
    spark_catalog: str = ""
    raw_io: Mapping[str, str] = field(default_factory=dict)
    """FileIO properties (S3 endpoint, keys) the driver reads raw Parquet footers with."""


@dataclass(frozen=True)
class DayResult:
    day: str
    snapshot_id: int | None
    rows: int
    rejects: int
    raw_records: int
    files: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FileStats:
    kind: str
    records: int = 0
    parsed: int = 0
    rejects: int = 0


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


def _parquet_drift(files: list[str], io_properties: Mapping[str, str]) -> list[str]:
    """Parquet files whose footer lacks a required column (read on the driver, no data)."""
    import pyarrow.parquet as pq

    from slipstream.lake.raw_zone import filesystem

    found: list[str] = []
    for path in files:
        if not path.endswith(".parquet"):
            continue
        schema = IMPRESSION_SCHEMA if f"/{IMPRESSIONS}/" in path else CLICK_SCHEMA
        fs, inner = filesystem(path, io_properties)
        try:
            names = set(pq.read_schema(inner, filesystem=fs).names)
        except (OSError, ValueError) as e:  # ArrowInvalid is a ValueError
            raise RawDataError(f"raw data could not be read: file {path} ({e}). Replace or remove that "
                               "file and re-run the day; `samples` was left unchanged") from e
        missing = [c for c in schema.fieldNames() if c not in names]
        if missing:
            found.append(f"{path}: required column(s) {', '.join(missing)} missing")
    return found


def _observed(df: DataFrame, name: str) -> tuple[DataFrame, Observation]:
    obs = Observation(f"{name}-{uuid.uuid4().hex[:8]}")  # unique: a session runs many days
    return df.observe(obs, F.count(F.lit(1)).alias("records"), F.count(F.col(REASON)).alias("rejects")), obs


def _fail_on_rejects(per_file: dict[str, FileStats], opts: DayOptions, day: date, n_rejects: int,
                     raw_records: int) -> RejectRateExceeded:
    rate = n_rejects / max(raw_records, 1)
    return RejectRateExceeded(
        f"day {day}: {n_rejects} of {raw_records} raw records rejected ({100 * rate:.2f}%), above "
        f"the limit {100 * opts.max_reject_rate:.2f}%. Worst files: {_worst_files(per_file)}. "
        f"Inspect them in {opts.namespace}.samples_rejects (day = '{day}'); `samples` was left "
        "unchanged. Raise SLIPSTREAM_SPARK_MAX_REJECT_RATE only if the data is known to be fine"
    )


def preprocess_day(spark: SparkSession, catalog: Catalog, opts: DayOptions, day: date) -> DayResult:
    """Preprocess one raw day into `samples` (one commit) and `samples_rejects`."""
    t0 = time.monotonic()
    imp_dir = day_dir(opts.raw_dir, IMPRESSIONS, day)
    imp_files = list_raw_files(spark, [imp_dir])
    if not imp_files:
        raise RawDataError(
            f"no impression files for day {day} under {imp_dir}: land the raw day there (or run "
            "`slipstream generate`), or point SLIPSTREAM_RAW_DIR at the raw zone"
        )
    click_files = list_raw_files(spark, click_dirs(opts.raw_dir, day, opts.attribution_s))
    if not click_files:
        log.warning("day %s: no click files found; every sample of the day will have label 0", day)
    log.info("day %s: %d impression files, %d click files", day, len(imp_files), len(click_files))
    drift = _parquet_drift(imp_files + click_files, opts.raw_io)
    if drift:
        raise RawDataError(
            f"schema drift in the raw data of day {day}: {'; '.join(drift[:WORST_FILES_SHOWN])}. "
            "Fix the producer or the files; `samples` was left unchanged"
        )

    imps = classify_impressions(read_raw(spark, imp_files, IMPRESSION_SCHEMA), day)
    clicks = classify_clicks(read_raw(spark, click_files, CLICK_SCHEMA))
    imps_seen, imp_obs = _observed(imps, "impressions")
    clicks_seen, click_obs = _observed(clicks, "clicks")
    good_imps, good_clicks = good(imps_seen), good(clicks_seen)
    table = samples_table(catalog, opts.namespace)
    props = {"day": str(day), "run_id": opts.run_id}

    if opts.write_mode == "native":
        # Spark's Iceberg writer commits as it writes: decide on the rejects first (one more pass).
        per_file = _collect_stats(stats_of(imps, clicks), day)
        raw_records = sum(fs.records for fs in per_file.values())
        n_rejects = sum(fs.rejects for fs in per_file.values())
        _settle_rejects(spark, catalog, opts, day, imps, clicks, n_rejects, raw_records, props, per_file)
        samples = build_samples(good_imps, good_clicks, opts.attribution_s)
        rows = samples.count()
        props.update(rows=str(rows), rejects=str(n_rejects))
        _write_native(samples, opts, props)
        snapshot_id, n_files = _native_snapshot_id(catalog, opts, day), -1
    else:
        t_write = time.monotonic()
        directory = f"{table.location()}/data/event_time_day={day}"
        try:
            written = _write_samples(good_imps, good_clicks, opts, table, directory)
        except (PySparkException, Py4JJavaError) as e:
            raise RawDataError(
                f"raw data of day {day} could not be read: {_read_error(e)}. Replace or remove that file "
                "and re-run the day; `samples` was left unchanged"
            ) from e
        raw_records = imp_obs.get["records"] + click_obs.get["records"]
        n_rejects = imp_obs.get["rejects"] + click_obs.get["rejects"]
        log.info("day %s: read %d raw records and wrote %d samples in %.1fs (%.0f records/s)", day, raw_records,
                 written.rows, time.monotonic() - t_write, raw_records / max(time.monotonic() - t_write, 1e-9))
        try:
            _settle_rejects(spark, catalog, opts, day, imps, clicks, n_rejects, raw_records, props, None)
        except RejectRateExceeded:
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


def _write_samples(good_imps: DataFrame, good_clicks: DataFrame, opts: DayOptions, table: Any,
                   directory: str) -> WrittenFiles:
    """Write the day's samples (uncommitted) and return the files.

    First with ONE shuffle (by user; `unfinished_samples_one_shuffle`): the writer drops the
    copies of an impression that sort next to the copy to keep, which is every copy of the same
    user and time (log replays). Then the written `sample_id`s are checked; a duplicate left
    means copies that differ in user or time, and only then the day is written again with the
    exact dedupe (a cogroup by id, a second shuffle), after deleting the first files. Either way
    the rows equal `build_samples`'. The writer completes the rows (hist_items, hashes): see
    spark_jobs.arrow_finish."""
    common = dict(directory=directory, run_tag=opts.run_id, io_properties=dict(table.io.properties),
                  schema=ARROW_SCHEMA, target_bytes=opts.target_bytes, columns=UNFINISHED_COLUMNS)
    written = write_parquet_files(
        unfinished_samples_one_shuffle(good_imps, good_clicks, opts.attribution_s),
        prepare=functools.partial(SampleFinisher, dedupe=True), **common,
    )
    surplus, examples = _duplicates_in(table.io, written.paths)
    if not surplus:
        return written
    log.info("%d sample ids are duplicated across users or event times (e.g. %s): writing the day again "
             "with the dedupe by id", surplus, ", ".join(examples))
    for path in written.paths:
        table.io.delete(path)
    return write_parquet_files(
        unfinished_samples(good_imps, good_clicks, opts.attribution_s), prepare=SampleFinisher, **common,
    )


def _duplicates_in(io: Any, paths: list[str]) -> tuple[int, list[str]]:
    """(surplus copies, a few ids) of the sample ids in the written files (one column read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slipstream.quality.metrics import duplicate_ids

    parts = []
    for path in paths:
        with io.new_input(path).open() as f:
            parts.append(pq.read_table(f, columns=["sample_id"]).column("sample_id"))
    if not parts:
        return 0, []
    return duplicate_ids(pa.chunked_array([c for p in parts for c in p.chunks], type=parts[0].type))


def _settle_rejects(spark: SparkSession, catalog: Catalog, opts: DayOptions, day: date, imps: DataFrame,
                    clicks: DataFrame, n_rejects: int, raw_records: int, props: dict[str, str],
                    per_file: dict[str, FileStats] | None) -> None:
    """Replace the day's rejects, then refuse the day when there are too many of them."""
    rate = n_rejects / max(raw_records, 1)
    failing = rate > opts.max_reject_rate
    if n_rejects and (failing or per_file is not None):
        per_file = per_file or _collect_stats(stats_of(imps, clicks), day)
        log.warning("day %s: %d of %d raw records rejected (%.3f%%); worst files: %s",
                    day, n_rejects, raw_records, 100 * rate, _worst_files(per_file))
    elif n_rejects:
        log.warning("day %s: %d of %d raw records rejected (%.3f%%); see %s.samples_rejects",
                    day, n_rejects, raw_records, 100 * rate, opts.namespace)
    _commit_rejects(spark, catalog, opts, day, rejects_of(imps, clicks, day, opts.run_id), n_rejects,
                    {**props, "rejects": str(n_rejects)})
    if failing:
        raise _fail_on_rejects(per_file or {}, opts, day, n_rejects, raw_records)
