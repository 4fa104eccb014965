"""The walking skeleton end to end: `slipstream demo` runs daily_retrain through `airflow dags test`
on a real broker, a real Spark job, a real 2-process torchrun, and stops everything it started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slipstream.dev.stack import StackState, pid_alive
from slipstream.pipeline.run_metrics import read_run_metrics

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_demo_runs_daily_retrain_end_to_end(tmp_path: Path) -> None:
    env = dict(os.environ, SLIPSTREAM_HOME=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "plugins")]))
    proc = subprocess.run(
        [sys.executable, "-m", "slipstream.cli", "demo", "--json", "--days", "3",
         "--impressions-per-day", "20000", "--stream-minutes", "120", "--epochs", "4"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])

    # All three days were preprocessed into Iceberg with about the generated number of impressions.
    assert sorted(summary["rows_per_day"]) == ["2026-11-01", "2026-11-02", "2026-11-03"]
    assert all(15_000 < n <= 20_000 for n in summary["rows_per_day"].values()), summary["rows_per_day"]
    assert isinstance(summary["snapshot_id"], int)

    # The trainer read the window from Iceberg (every epoch), less the validation day before T
    # that chooses the epoch, and the stream after T from Kafka.
    days = sorted(summary["rows_per_day"])
    train_rows = sum(summary["rows_per_day"][d] for d in days[:-1])
    assert summary["samples_iceberg"] >= train_rows
    assert 0 < summary["samples_kafka"] <= summary["produced_to_kafka"]

    # It learned something real: held-out AUC before T well above chance and not above the best
    # achievable there (the generator's truth on the same rows, with its interval). After T the
    # demo's world drifts and its stream is short: the forward tail (its last fifth by event
    # time, never trained) is the headline and decides promotion, on lower bounds, whichever way.
    m = read_run_metrics(Path(summary["metrics"]))
    before, tail, pre = m.evaluation.holdout_before_t, m.evaluation.forward_tail, m.evaluation.prequential
    assert before is not None and before.model is not None and before.best is not None
    assert 0.6 < (before.model.auc or 0) <= (before.best.hi or 0) + 0.02, before
    assert summary["auc_on"] == "forward_tail" and tail is not None and tail.rows > 0 and m.forward_tail_start
    assert pre is not None and pre.rows == summary["samples_kafka"] > 0  # every trained stream row scored first
    decision = summary["publish"]
    assert decision["evaluated_on"] == "forward_tail" and decision["registered"] and decision["reason"], decision
    shown = tail.vs_baseline is not None and tail.vs_baseline.lo is not None and tail.vs_baseline.lo > 0
    assert decision["promoted"] is shown, decision

    # The gate passed the window, warmup cached it and the trainer read it from the cache; the
    # insight report was written.
    assert summary["quality_passed"] is True
    assert summary["warmup_files"] >= 2 and summary["cache_hit_ratio"] == 1.0
    assert "Exactly once: 0 lost, 0 duplicated." in Path(summary["report"]).read_text()

    assert Path(summary["checkpoint"]).exists()
    metrics = json.loads(Path(summary["metrics"]).read_text())
    assert metrics["handoff_offsets"] and metrics["final_offsets"]

    # The run folder holds the plan the run was rendered with, and the trainer trained exactly it.
    run = Path(summary["metrics"]).parent
    plan = json.loads((run / "plan.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert plan["snapshot_id"] == summary["snapshot_id"] == config["plan"]["snapshot_id"]
    assert plan["t_handoff"] == metrics["t_handoff"] == config["plan"]["t_handoff"] == "2026-11-04T00:00:00+00:00"
    assert plan["window_start"] == "2026-11-01T00:00:00+00:00" and plan["file_count"] == len(plan["files"]) >= 2

    # Nothing the demo started is left running.
    state = StackState.load(Path(summary["home"]))
    assert not state.services
    assert all(not pid_alive(p) for p in _pids_in(tmp_path / "home"))


def _pids_in(home: Path) -> list[int]:
    pids = []
    for f in home.rglob("*.pid"):
        try:
            pids.append(int(f.read_text().strip()))
        except ValueError:
            pass
    return pids
