"""The Spark preprocessing job with its warehouse on S3 (a real SeaweedFS server on 127.0.0.1):
Spark's executors write the day's Parquet files straight to the bucket through the catalog's
FileIO (no Hadoop S3 jars), the driver commits them, and the table read back from S3 equals the
generator's reference; a re-run replaces the day and leaves no orphan visible in the table."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import pytest

from slipstream.dev.datagen import GeneratorConfig, generate, reference_samples
from slipstream.dev.s3server import S3Endpoint
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.pipeline.preprocess_launch import run_preprocess_days
from tests.cache_fixtures import s3_endpoint, s3_server, s3_settings  # noqa: F401 - fixtures
from tests.preprocess_fixtures import content_checksum, day_rows

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("java") is None, reason="Java 17 is needed by the Spark preprocessing"),
]

CFG = GeneratorConfig(start_day=date(2026, 5, 1), days=2, impressions_per_day=2000, users=200, items=60, seed=17)


def test_preprocess_into_an_s3_warehouse(tmp_path: Path, s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    settings = s3_settings(tmp_path / "home", s3_endpoint, monkeypatch)
    assert settings.warehouse.startswith("s3://")
    generate(CFG, settings.raw_dir)
    days = [CFG.start_day, date(2026, 5, 2)]

    results = run_preprocess_days(settings, days, "s3-run-1", max_reject_rate=0.05, timeout_s=600)

    table = samples_table(get_catalog(settings), settings.namespace)
    files = [t.file.file_path for t in table.scan().plan_files()]
    assert files and all(f.startswith(f"s3://{s3_endpoint.bucket}/") for f in files), files
    reference = reference_samples(CFG)
    for res in results:
        got = day_rows(table, res.day)
        ref = reference[res.day.isoformat()]
        assert got.num_rows == ref.num_rows == res.rows
        assert got["sample_id"].to_pylist() == ref.sort_by("sample_id")["sample_id"].to_pylist()
        assert got["label"].to_pylist() == ref.sort_by("sample_id")["label"].to_pylist()

    before = {d: content_checksum(day_rows(table, d)) for d in days}
    again = run_preprocess_days(settings, days[:1], "s3-run-2", max_reject_rate=0.05, timeout_s=600)
    table.refresh()
    assert again[0].snapshot_id == table.current_snapshot().snapshot_id
    assert {d: content_checksum(day_rows(table, d)) for d in days} == before
    live = [t.file.file_path for t in table.scan().plan_files()]
    assert len(live) == len(files) and set(live) != set(files)  # the day's file was replaced, not added to
