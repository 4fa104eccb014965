"""A 3-day `airflow backfill create` over preprocess_samples, executed by a real scheduler
(LocalExecutor, api-server, dag-processor on 127.0.0.1): every day lands in the Iceberg table
`samples` equal to the generator's reference, and a second backfill that reprocesses a day
(`--reprocess-behavior completed`) leaves every day identical in row count and content checksum.

Spark runs once per task (three preprocessing jobs, then one more for the re-run), so this is one
of the slower tests; it is what a platform engineer does on day one.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from slipstream.settings import Settings
from tests.airflow_fixtures import airflow, airflow_cli_env

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("java") is None, reason="Java 17 is needed by the Spark preprocessing"),
]

FIRST = date(2025, 1, 1)
DAYS = [FIRST + timedelta(days=i) for i in range(3)]


@pytest.fixture
def scheduler_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Settings, dict[str, str]]]:
    """The stack's Airflow components on 127.0.0.1 (stopped by PID afterwards) and the CLI env."""
    from slipstream.dev import stack, ui
    from slipstream.dev.stack import free_port

    port = free_port()
    monkeypatch.setenv("SLIPSTREAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLIPSTREAM_KAFKA_PORT", str(port))
    monkeypatch.setenv("SLIPSTREAM_KAFKA_BOOTSTRAP", f"127.0.0.1:{port}")
    settings = Settings.from_env()
    try:
        ui.up(settings, port=free_port(), password="backfill-test-pass")
        yield settings, airflow_cli_env(settings.home)
    finally:
        ui.down(settings)
        stack.down(settings)


def _runs(env: dict[str, str]) -> list[dict[str, Any]]:
    """The DAG's backfill runs (unpausing it also schedules its latest interval: not ours)."""
    out = airflow(["dags", "list-runs", "preprocess_samples", "-o", "json"], env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    # the JSON array is the last line that is one (Airflow logs warnings to stdout before it)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[") and ln.rstrip().endswith("]") and "{" in ln or ln == "[]"]
    runs = json.loads(lines[-1]) if lines else []
    return [r for r in runs if r["run_id"].startswith("backfill__")]


def _wait_for_runs(env: dict[str, str], done: Callable[[list[dict[str, Any]]], bool], timeout_s: float) -> list[dict[str, Any]]:
    """Poll the backfill runs until `done(runs)` holds and none is unfinished; fail naming the states."""
    deadline = time.monotonic() + timeout_s
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = _runs(env)
        if done(runs) and all(r["state"] in ("success", "failed") for r in runs):
            return runs
        time.sleep(5)
    pytest.fail(f"backfill runs did not finish within {timeout_s:.0f}s: {[(r['logical_date'], r['state']) for r in runs]}")


def _interval_day(run: dict[str, Any]) -> str:
    return str(run["logical_date"])[:10]  # = the data interval start (CronDataIntervalTimetable)


def _day_state(settings: Settings) -> dict[date, tuple[int, str]]:
    from slipstream.lake.iceberg import get_catalog, samples_table
    from tests.preprocess_fixtures import content_checksum, day_rows

    table = samples_table(get_catalog(settings), settings.namespace)
    out = {}
    for d in DAYS:
        rows = day_rows(table, d)
        out[d] = (rows.num_rows, content_checksum(rows))
    return out


def _airflow_retrying(argv: list[str], env: dict[str, str], retryable: tuple[str, ...], timeout_s: float) -> Any:
    """`airflow <argv>` again (every 2 s, up to `timeout_s`) while it fails with one of the
    `retryable` messages: a clash with the scheduler's or dag-processor's own writes to the
    embedded SQLite database, not a wrong command."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = airflow(argv, env)
        text = out.stdout + out.stderr
        if out.returncode == 0 or not any(r in text for r in retryable) or time.monotonic() > deadline:
            return out
        time.sleep(2.0)


def _create_backfill(env: dict[str, str], *args: str, timeout_s: float = 600.0) -> Any:
    """`airflow backfill create` as docs/airflow.md tells users to run it on the embedded SQLite
    stack: again when SQLite answers `database is locked` (a write of the scheduler's got in
    between; Airflow removes the partial backfill before it exits, for exactly this retry), and
    again while the previous backfill is still running (the scheduler marks it complete on a
    later loop than the one that saw its last run succeed). A create that failed half-way can
    leave a backfill without runs, which the scheduler clears only 2 minutes after its creation
    (seen once in CI-like load), and on a machine at load 15 the previous backfill stayed running
    for over 5 minutes after its last run: hence 600 s."""
    return _airflow_retrying(["backfill", "create", "--dag-id", "preprocess_samples", *args], env,
                             ("database is locked", "Another backfill is running"), timeout_s)


def test_backfill_of_three_days_runs_and_a_reprocess_changes_nothing(scheduler_stack: tuple[Settings, dict[str, str]]) -> None:
    from slipstream.dev.datagen import GeneratorConfig, generate, reference_samples
    from slipstream.lake.iceberg import get_catalog, samples_table

    settings, env = scheduler_stack
    cfg = GeneratorConfig(start_day=FIRST, days=len(DAYS), impressions_per_day=1500, users=200, items=60, seed=3)
    generate(cfg, settings.raw_dir)
    expected = {date.fromisoformat(d): t.num_rows for d, t in reference_samples(cfg).items()}

    # the dag-processor may not have parsed the folder yet; DAGs start paused, and the scheduler
    # leaves a paused DAG's backfill runs queued. `dags reserialize` can clash with the running
    # dag-processor inserting the same DAG rows (IntegrityError, seen once): then it runs again.
    for argv in (["dags", "reserialize"], ["dags", "unpause", "preprocess_samples"]):
        out = _airflow_retrying(argv, env, ("database is locked", "IntegrityError"), timeout_s=60)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    out = _create_backfill(env, "--from-date", str(DAYS[0]), "--to-date", str(DAYS[-1]))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    runs = _wait_for_runs(env, lambda rs: len(rs) >= len(DAYS), timeout_s=900)
    assert sorted(_interval_day(r) for r in runs) == [str(d) for d in DAYS]
    assert all(r["state"] == "success" for r in runs), [(r["logical_date"], r["state"]) for r in runs]

    first = _day_state(settings)
    assert {d: n for d, (n, _) in first.items()} == expected
    # each run gated its day after writing it: one passed result set per day, none critical-failed
    from slipstream.quality.store import read_results

    results = read_results(get_catalog(settings), settings.namespace).to_pylist()
    assert {r["run_id"] for r in results} == {f"preprocess-{d:%Y%m%d}" for d in DAYS}
    assert {r["day"] for r in results} == set(DAYS)
    assert not [r for r in results if r["severity"] == "critical" and not r["success"]]
    table = samples_table(get_catalog(settings), settings.namespace)
    days_committed = [s.summary.additional_properties.get("day") for s in table.snapshots()]
    assert sorted(d for d in days_committed if d) == [str(d) for d in DAYS]  # one commit per day

    # reprocess the middle day from the CLI: a new commit of that day, identical contents everywhere
    out = _create_backfill(env, "--from-date", str(DAYS[1]), "--to-date", str(DAYS[1]),
                           "--reprocess-behavior", "completed")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    before = {r["run_id"]: r["end_date"] for r in runs}
    runs = _wait_for_runs(env, lambda rs: any(before.get(r["run_id"]) != r["end_date"] for r in rs), timeout_s=600)
    assert all(r["state"] == "success" for r in runs), [(r["logical_date"], r["state"]) for r in runs]
    table.refresh()
    days_committed = [s.summary.additional_properties.get("day") for s in table.snapshots()]
    assert days_committed[-1] == str(DAYS[1]) and days_committed.count(str(DAYS[1])) > 1  # committed again
    assert _day_state(settings) == first
