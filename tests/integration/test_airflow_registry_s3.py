"""The model registry on S3 (the local SeaweedFS server): publish, champion, list, show."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.airflow_fixtures import write_run

pytestmark = pytest.mark.integration


def test_registry_on_s3(tmp_path: Path) -> None:
    s3server = pytest.importorskip("slipstream.dev.s3server", reason="the S3 server module (cache team) is not merged yet")
    from slipstream.pipeline.registry import ModelRegistry

    server = s3server.S3Server(tmp_path / "s3home")
    endpoint = server.start()
    try:
        registry = ModelRegistry("s3://models/registry", env=endpoint.env())
        runs = tmp_path / "runs"
        assert registry.publish(write_run(runs, "daily-1", 0.70))["decision"]["promoted"]
        second = registry.publish(write_run(runs, "daily-2", 0.60), tolerance=0.01)
        assert not second["decision"]["promoted"]
        assert registry.champion()["run_id"] == "daily-1"
        assert [p["run_id"] for p in registry.list_packages()] == ["daily-1", "daily-2"]
        with registry.fs.open_input_stream("models/registry/models/daily-2/model.pt") as f:
            assert f.read() == b"weights-daily-2"
    finally:
        server.stop()
