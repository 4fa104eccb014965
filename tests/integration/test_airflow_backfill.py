"""`airflow backfill create` over preprocess_samples creates one run per day, and a second
backfill over the same range creates nothing new.

The Airflow CLI commands run in ONE subprocess (through Airflow's own CLI parser, exactly the
commands a person types) to pay Airflow's import cost once. Running the created runs needs the
Spark preprocessing and a scheduler; the daily_retrain end-to-end test covers preprocessing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.airflow_fixtures import airflow_cli_env, migrated_airflow_db, use_airflow_db  # noqa: F401

pytestmark = pytest.mark.integration

SCRIPT = r"""
import contextlib, io, json, sys
from airflow.cli import cli_parser

def cli(*argv):
    buf = io.StringIO()
    args = cli_parser.get_parser().parse_args(list(argv))
    with contextlib.redirect_stdout(buf):
        args.func(args)
    return buf.getvalue()

cli("dags", "reserialize")
cli("backfill", "create", "--dag-id", "preprocess_samples", "--from-date", "2025-01-01", "--to-date", "2025-01-03")
runs = json.loads(cli("dags", "list-runs", "preprocess_samples", "-o", "json"))
again = cli("backfill", "create", "--dag-id", "preprocess_samples", "--from-date", "2025-01-01", "--to-date", "2025-01-03", "--dry-run")
wider = cli("backfill", "create", "--dag-id", "preprocess_samples", "--from-date", "2025-01-01", "--to-date", "2025-01-04", "--dry-run")
print("RESULT " + json.dumps({"runs": runs, "again": again, "wider": wider}))
"""


def test_backfill_creates_one_run_per_day_once(tmp_path: Path, migrated_airflow_db: Path) -> None:  # noqa: F811
    use_airflow_db(migrated_airflow_db, tmp_path / "home")
    env = airflow_cli_env(tmp_path / "home")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(line.removeprefix("RESULT "))
    runs = result["runs"]
    assert sorted(r["logical_date"][:10] for r in runs) == ["2025-01-01", "2025-01-02", "2025-01-03"]
    assert all(r["run_id"].startswith("backfill__") for r in runs)
    # each run owns its data interval's day: it becomes runnable once that day is over
    assert {r["logical_date"][:10]: r["run_after"][:10] for r in runs}["2025-01-01"] == "2025-01-02"
    # the same range again: no run to attempt; a wider range: only the new day
    assert "Runs to be attempted" in result["again"]
    assert "2025-01-0" not in result["again"].split("Runs to be attempted")[-1]
    attempted = result["wider"].split("Runs to be attempted")[-1]
    assert "2025-01-04" in attempted and "2025-01-01" not in attempted
