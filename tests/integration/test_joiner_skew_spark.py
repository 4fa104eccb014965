"""Batch/stream skew, measured end to end: the same raw events go through the Spark job (raw zone ->
Iceberg `samples`) and through the joiner (Kafka topics -> the sample topic); every sample agrees
field by field (floats within rounding). Real Spark local, SQLite Iceberg catalog, noida-db."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from joiner_fixtures import make_events, produce_raw, read_topic, start_joiner, write_raw_zone

from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.samples.codec import decode_samples
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings
from tests.integration.test_joiner import _stop, assert_same_samples
from tests.preprocess_fixtures import day_rows

pytestmark = pytest.mark.integration

DAY = date(2026, 11, 1)


def test_spark_and_the_joiner_make_the_same_samples_of_the_same_events(kafka_bootstrap: str, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession  # noqa: F401 (skip cleanly where pyspark is missing)

    from slipstream.pipeline.spark_settings import SparkSettings
    from spark_jobs.day_job import DayOptions, preprocess_day
    from spark_jobs.preprocess import start_spark

    spec = load_spec("synthetic")
    imps, clicks, _ = make_events(1500, users=30, seed=21, span_s=3 * 3600)
    settings = Settings(home=tmp_path / "home")
    write_raw_zone(Path(settings.raw_dir), imps, clicks)
    spark = start_spark(SparkSettings(shuffle_partitions=2), "test-joiner-skew")
    try:
        opts = DayOptions(spec=spec, raw_dir=settings.raw_dir, namespace=settings.namespace, run_id="skew",
                          max_reject_rate=0.0, target_bytes=64 << 20)
        assert preprocess_day(spark, get_catalog(settings), opts, DAY).rows == len(imps)
    finally:
        spark.stop()
    batch = day_rows(samples_table(get_catalog(settings), settings.namespace, spec), DAY).to_pylist()

    produce_raw(kafka_bootstrap, imps, clicks, "imp-spark", "clk-spark")
    proc = start_joiner(tmp_path, kafka_bootstrap, "samples-spark", "--impressions-topic", "imp-spark",
                        "--clicks-topic", "clk-spark", "--group", "spark-skew")
    try:
        msgs = read_topic(kafka_bootstrap, "samples-spark", len(imps), idle_s=2)
    finally:
        assert _stop(proc) == 0
    stream = decode_samples([m.value() for m in msgs], spec).table.to_pylist()
    assert sum(r["label"] for r in batch) > 50 and sum(len(r["hist_items"]) > 0 for r in batch) > 1000
    assert_same_samples(stream, batch)
