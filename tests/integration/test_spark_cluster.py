"""The local stack's cluster profile (`stack up --profile cluster`: a Spark standalone master
with two workers, SeaweedFS S3 and its Iceberg REST catalog, the broker): a day preprocessed
through spark-submit on the cluster into the REST catalog on S3 equals the same day
preprocessed in local mode into the SQLite catalog on local disk, row for row; the executors
import Slipstream from the zip the launcher shipped (not from the checkout), and `stack down`
stops every server by PID."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import pytest

from slipstream.dev import stack
from slipstream.dev.datagen import GeneratorConfig, generate
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.pipeline.preprocess_launch import run_preprocess_days
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.processes import pid_alive
from slipstream.settings import Settings
from tests.preprocess_fixtures import content_checksum, day_rows

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("java") is None, reason="Java 17 is needed by Spark"),
]

CFG = GeneratorConfig(start_day=date(2026, 6, 1), days=1, impressions_per_day=3000, users=200, items=60, seed=23)


def _settings(home: Path, raw: Path, monkeypatch: pytest.MonkeyPatch, port: int) -> Settings:
    monkeypatch.setenv("SLIPSTREAM_HOME", str(home))
    monkeypatch.setenv("SLIPSTREAM_RAW_DIR", str(raw))
    monkeypatch.setenv("SLIPSTREAM_KAFKA_PORT", str(port))
    for name in ("SLIPSTREAM_SPARK_MASTER", "SLIPSTREAM_SPARK_PY_FILES", "SLIPSTREAM_SPARK_SUBMIT", "SLIPSTREAM_CATALOG",
                 "SLIPSTREAM_CATALOG_URI", "SLIPSTREAM_WAREHOUSE", "SLIPSTREAM_S3", "SLIPSTREAM_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return Settings.from_env()


def test_a_day_on_the_cluster_profile_equals_local_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = tmp_path / "raw"
    generate(CFG, raw)
    day = CFG.start_day

    local = _settings(tmp_path / "local", raw, monkeypatch, stack.free_port())
    (want,) = run_preprocess_days(local, [day], "local-1", max_reject_rate=0.05, timeout_s=600,
                                  spark=SparkSettings(driver_memory="1g"))
    want_rows = day_rows(samples_table(get_catalog(local), local.namespace), day)

    settings = _settings(tmp_path / "cluster", raw, monkeypatch, stack.free_port())
    state = stack.up(settings, airflow=False, profile="cluster")
    try:
        procs = {n: s.pid for n, s in state.services.items()}
        assert sorted(procs) == ["kafka", "s3", "spark-master", "spark-worker-0", "spark-worker-1"]
        settings = stack.effective_settings(settings)
        assert settings.catalog_uri.startswith("http://127.0.0.1:") and settings.warehouse == "s3://lake/"
        spark = SparkSettings.for_home(settings.home)
        assert spark.master == state.services["spark-master"].address and spark.master.startswith("spark://127.0.0.1:")
        (got,) = run_preprocess_days(settings, [day], "cluster-1", max_reject_rate=0.05, timeout_s=600,
                                     summary_out=str(tmp_path / "summary.json"))
        table = samples_table(get_catalog(settings), settings.namespace)
        files = [t.file.file_path for t in table.scan().plan_files()]
        assert files and all(f.startswith("s3://lake/") for f in files), files
        got_rows = day_rows(table, day)
    finally:
        stack.down(settings)
    assert not any(pid_alive(p) for p in procs.values())

    assert got.rows == want.rows == got_rows.num_rows == want_rows.num_rows > 1000
    assert got_rows["sample_id"].to_pylist() == want_rows["sample_id"].to_pylist()
    assert content_checksum(got_rows) == content_checksum(want_rows)

    import json

    summary = json.loads((tmp_path / "summary.json").read_text())
    shipped = summary["executor_code"]
    assert shipped and all(".zip/slipstream/" in where for where in shipped), shipped
