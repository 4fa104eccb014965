"""The launcher without Spark: command lines, settings, the readiness rule, and how a job's
summary line and exit status become results or domain errors (a stand-in `spark-submit` script
prints what the real job prints; the real job is covered by tests/integration/test_preprocess_job.py)."""

from __future__ import annotations

import json
import stat
import sys
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from slipstream.errors import ConfigError, PreprocessError, RejectRateExceeded
from slipstream.pipeline.preprocess_launch import preprocess_command, preprocess_days_command, raw_day_ready, run_preprocess
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.settings import Settings

DAY = date(2026, 11, 1)


def _touch(raw: Path, rel: str) -> None:
    p = raw / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"x")


@pytest.mark.parametrize(
    ("files", "now", "ready"),
    [
        ([], datetime(2030, 1, 1, tzinfo=UTC), False),
        (["impressions/day=2026-11-01/hour=23/part-0.jsonl.gz"], datetime(2026, 11, 2, 0, 20, tzinfo=UTC), False),
        (["impressions/day=2026-11-01/hour=23/part-0.jsonl.gz", "clicks/day=2026-11-02/hour=00/part-1.jsonl.gz"],
         datetime(2026, 11, 2, 1, 5, tzinfo=UTC), True),
        (["impressions/day=2026-11-01/hour=23/part-0.jsonl.gz", "clicks/day=2026-11-03/hour=05/part-1.parquet"],
         datetime(2026, 11, 3, 6, tzinfo=UTC), True),
        (["impressions/day=2026-11-01/hour=23/part-0.jsonl.gz", "clicks/day=2026-11-02/hour=00/_SUCCESS"],
         datetime(2026, 11, 2, 1, 0, tzinfo=UTC), False),
        # a quiet last hour and no spill-over clicks: ready once the day is old enough
        (["impressions/day=2026-11-01/hour=05/part-0.jsonl.gz"], datetime(2026, 11, 2, 1, tzinfo=UTC), False),
        (["impressions/day=2026-11-01/hour=05/part-0.jsonl.gz"], datetime(2026, 11, 2, 2, tzinfo=UTC), True),
    ],
)
def test_raw_day_ready(tmp_path: Path, files: list[str], now: datetime, ready: bool) -> None:
    for f in files:
        _touch(tmp_path, f)
    assert raw_day_ready(str(tmp_path), DAY, 1800, now=now) is ready


def test_local_command_runs_the_job_module(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    cmd = preprocess_command(s, DAY, "r1", max_reject_rate=0.05, spark=SparkSettings())
    assert cmd[:3] == [sys.executable, "-m", "spark_jobs.preprocess"]
    assert cmd[3:] == ["--day", "2026-11-01", "--run-id", "r1", "--max-reject-rate", "0.05"]
    many = preprocess_days_command(s, [DAY, date(2026, 11, 2)], "r2", spark=SparkSettings())
    assert many.count("--day") == 2 and "--day-by-day" not in many
    daily = preprocess_days_command(s, [DAY, date(2026, 11, 2)], "r3", spec="ratings", day_by_day=True, spark=SparkSettings())
    assert daily[3:] == ["--day", "2026-11-01", "--day", "2026-11-02", "--run-id", "r3", "--spec", "ratings", "--day-by-day"]


def test_cluster_command_uses_spark_submit_with_the_job_file(tmp_path: Path) -> None:
    spark = SparkSettings(master="spark://10.0.0.5:7077", py_files="s3://b/slipstream.zip",
                          conf={"spark.executor.memory": "8g"}, write_mode="native")
    cmd = preprocess_command(Settings(home=tmp_path), DAY, "r1", spark=spark)
    assert cmd[0].endswith("spark-submit") and cmd[1:5] == ["--master", "spark://10.0.0.5:7077", "--deploy-mode", "client"]
    assert "spark.executor.memory=8g" in cmd and "spark.sql.session.timeZone=UTC" in cmd
    assert cmd[cmd.index("--py-files") + 1] == "s3://b/slipstream.zip"
    job = cmd.index("--day") - 1
    assert cmd[job].endswith("spark_jobs/preprocess.py")
    assert not any(c.startswith("spark.driver.host") for c in cmd)  # loopback binding is for local runs only


def test_bad_options_and_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown preprocess option"):
        preprocess_command(Settings(home=tmp_path), DAY, "r1", max_rejects=3)
    with pytest.raises(ConfigError, match="run_id"):
        preprocess_command(Settings(home=tmp_path), DAY, "has space")
    with pytest.raises(ConfigError, match="SLIPSTREAM_SPARK_WRITE_MODE"):
        SparkSettings.from_env({"SLIPSTREAM_SPARK_WRITE_MODE": "jdbc"})
    with pytest.raises(ConfigError, match="JSON object"):
        SparkSettings.from_env({"SLIPSTREAM_SPARK_CONF": "[1]"})
    assert SparkSettings.from_env({"SLIPSTREAM_SPARK_MAX_REJECT_RATE": "0.2"}).max_reject_rate == 0.2


def _stand_in(tmp_path: Path, stdout: str, rc: int) -> SparkSettings:
    script = tmp_path / "spark-submit"
    script.write_text(
        "#!/bin/sh\n"
        "echo 'INFO starting' >&2\necho 'ERROR the real cause' >&2\n"
        f"cat <<'EOF'\n{stdout}\nEOF\nexit {rc}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return SparkSettings(submit=str(script))


def test_summary_line_becomes_a_result(tmp_path: Path) -> None:
    line = json.dumps({"run_id": "r", "error": None, "days": [
        {"day": "2026-11-01", "snapshot_id": 42, "rows": 10, "rejects": 1, "seconds": 1.5}]})
    res = run_preprocess(Settings(home=tmp_path), DAY, "r", spark=_stand_in(tmp_path, line, 0))
    assert (res.day, res.snapshot_id, res.rows, res.rejects) == (DAY, 42, 10, 1)
    assert res.to_dict()["day"] == "2026-11-01"


def test_job_errors_become_domain_errors(tmp_path: Path) -> None:
    line = json.dumps({"run_id": "r", "days": [], "error": "day 2026-11-01: 9 of 10 rejected. Worst files: a.gz",
                       "error_type": "RejectRateExceeded"})
    with pytest.raises(RejectRateExceeded, match="Worst files: a.gz"):
        run_preprocess(Settings(home=tmp_path), DAY, "r", spark=_stand_in(tmp_path, line, 1))
    with pytest.raises(PreprocessError, match=r"(?s)status 3 without a summary.*the real cause"):
        run_preprocess(Settings(home=tmp_path), DAY, "r", spark=_stand_in(tmp_path, "no json", 3))
