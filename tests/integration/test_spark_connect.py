"""The warm Spark: the local stack's Spark Connect server on 127.0.0.1, and preprocessing runs that
submit to it (a thin client, no Spark of their own) producing the same samples as a Spark of
their own, two runs in a row on the same server."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import psutil
import pytest

from slipstream.dev.datagen import GeneratorConfig, generate
from slipstream.dev.spark_connect import start_connect_server
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.pipeline.preprocess_launch import run_preprocess_days
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.processes import pid_alive, stop_process
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings

pytestmark = pytest.mark.integration

START = date(2026, 4, 1)


def _listeners(pid: int) -> set[str]:
    """The addresses the server's processes listen on."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return {c.laddr.ip for p in procs for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def test_runs_submitted_to_the_spark_connect_server_equal_a_local_spark(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    generate(GeneratorConfig(start_day=START, days=3, impressions_per_day=200, stream_minutes=1.0), raw)
    days = [START + timedelta(days=i) for i in range(3)]
    local = Settings(home=tmp_path / "local", raw_dir=str(raw))
    want = run_preprocess_days(local, days, "local-1", spark=SparkSettings(shuffle_partitions=2), timeout_s=600)

    server = start_connect_server(tmp_path / "server", SparkSettings(shuffle_partitions=2))
    try:
        assert {ip.removeprefix("::ffff:") for ip in _listeners(server.pid)} == {"127.0.0.1"}
        remote = Settings(home=tmp_path / "remote", raw_dir=str(raw))
        spark = SparkSettings(remote=server.url, shuffle_partitions=2)
        for run in ("remote-1", "remote-2"):  # the second run finds the server warm; it replaces the days
            got = run_preprocess_days(remote, days, run, spark=spark, timeout_s=600)
            assert [(r.day, r.rows, r.rejects) for r in got] == [(r.day, r.rows, r.rejects) for r in want]
        assert pid_alive(server.pid)  # the runs ended their sessions, not the server
    finally:
        stop_process(server.pid)
    spec = load_spec()
    rows = {}
    for name, settings in (("local", local), ("remote", remote)):
        table = samples_table(get_catalog(settings), settings.namespace, spec)
        rows[name] = table.scan().to_arrow().sort_by([("sample_id", "ascending")])
    assert rows["remote"].num_rows == sum(r.rows for r in want) > 0
    assert rows["remote"].equals(rows["local"])
