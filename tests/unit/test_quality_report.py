"""The insight report renders from a run folder written the way the trainer writes it."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from slipstream.errors import ConfigError
from slipstream.lake.iceberg import get_catalog
from slipstream.quality.config import GateConfig
from slipstream.quality.gate import run_gate
from slipstream.quality.report import render_report
from slipstream.samples.schema import DEFAULT_SPEC as SPEC
from slipstream.settings import Settings
from tests.quality_fixtures import DAYS, day_of, fill_samples, reference_days, write_fake_run

FAST = GateConfig(data_docs=False)
"""GX Data Docs cost ~1 s per gate; one test checks them, the rest skip them."""


def _t_handoff() -> datetime:
    d = day_of(DAYS - 1)
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def _setup(settings: Settings) -> tuple[int, dict]:  # type: ignore[type-arg]
    days = reference_days()
    snap = fill_samples(get_catalog(settings), settings.namespace, {k: v for k, v in days.items() if k != str(day_of(DAYS - 1))})
    window = {k: v for k, v in days.items() if k != str(day_of(DAYS - 1))}
    return snap, window


def _sections(text: str) -> set[str]:
    return set(re.findall(r'<section id="([a-z]+)">', text))


def test_full_report_has_plots_and_clean_audit(settings: Settings) -> None:
    snap, window = _setup(settings)
    for i in range(DAYS - 1):  # the pipeline gates (and profiles) each day after preprocessing
        run_gate(settings, spec=SPEC, day=day_of(i), window=None, snapshot_id=snap, run_id="run-1", config=FAST)
    stream = reference_days()[str(day_of(DAYS - 1))]
    write_fake_run(Path(settings.runs_dir), "run-1", window, snapshot_id=snap, t_handoff=_t_handoff(), stream=stream)
    path = render_report(settings, "run-1")
    assert path == Path(settings.runs_dir) / "run-1" / "report.html"
    text = path.read_text()
    assert {"summary", "freshness", "quality", "audit", "sources", "shuffle", "distributions", "drift", "ctr", "skew",
            "training"} <= _sections(text)
    assert len(re.findall(r'<img alt="[^"]+" src="data:image/png;base64,', text)) == 5
    assert "Exactly once: 0 lost, 0 duplicated." in text
    assert "no stream phase (no Kafka offsets range" in text  # no offsets recorded in this fake run
    score = float(re.search(r"Shuffle score ([0-9.]+)", text).group(1))  # type: ignore[union-attr]
    assert score > 0.9
    assert "0 failed" in text  # the gates ran clean under this run id
    assert "SKEW" not in text  # the stream comes from the same generator


def test_report_names_lost_and_duplicated_ids(settings: Settings) -> None:
    snap, window = _setup(settings)
    run = write_fake_run(Path(settings.runs_dir), "run-2", window, snapshot_id=snap, t_handoff=_t_handoff(), lose=3, duplicate=2)
    text = render_report(settings, "run-2").read_text()
    assert "NOT exactly once" in text
    row = re.search(r"<tr[^>]*><td>iceberg</td><td>0</td><td>[\d,]+</td><td>[\d,]+</td><td>(\d+)</td><td>(\d+)</td>", text)
    assert row is not None and row.groups() == ("3", "2")
    audit_ids = __import__("pyarrow.parquet").parquet.read_table(run / "audit" / "rank-0.parquet").column("sample_id").to_pylist()
    assert "imp-" in text.split("NOT exactly once")[-1]  # the audit section, after the summary
    assert audit_ids  # the fake trainer wrote per-rank files
    assert "profiled now:" in text  # no stored profiles: the report profiled the window itself


def test_minimal_run_folder_degrades_gracefully(settings: Settings) -> None:
    snap, _ = _setup(settings)
    run = Path(settings.runs_dir) / "run-3"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({
        "run_id": "run-3", "snapshot_id": snap, "t_handoff": _t_handoff().isoformat(),
        "window_start": datetime(2026, 11, 1, tzinfo=UTC).isoformat(),
    }))
    text = render_report(settings, "run-3").read_text()
    assert "no stream phase: the run has no stream_profile.json" in text
    assert "no audit/rank-*.parquet in the run folder" in text
    assert text.count("<img") == 3  # distributions, drift, CTR
    empty = Path(settings.runs_dir) / "run-4"
    empty.mkdir()
    assert "No metrics.json" in render_report(settings, "run-4").read_text()
    with pytest.raises(ConfigError, match="run folder .* does not exist"):
        render_report(settings, "nope")


def test_the_report_shows_the_prequential_curve_and_the_forward_tail_decision_with_intervals(settings: Settings) -> None:
    """Scores built by the trainer's own judging code (a bootstrap over users) on synthetic rows:
    the report shows every set with its rows and intervals, the prequential curve per window (plot
    and table), and the forward tail with the registry's decision."""
    import numpy as np

    from slipstream.pipeline.run_metrics import Evaluation, build_run_metrics
    from trainers.eval.judge import judge
    from trainers.eval.prequential import judge_columns, windows

    rng = np.random.default_rng(2)
    n = 3000
    t0 = int(_t_handoff().timestamp() * 1_000_000)
    y = (rng.random(n) < 0.25).astype(np.float32)
    cols = {"label": y, "model": (0.4 * y + rng.random(n)).astype(np.float32), "baseline": rng.random(n).astype(np.float32),
            "batch_only": rng.random(n).astype(np.float32), "popularity": np.full(n, np.nan, np.float32),
            "best": np.full(n, np.nan, np.float32), "user": rng.integers(0, 400, n),
            "event_us": t0 + np.sort(rng.integers(0, 6 * 3600, n)) * 1_000_000}
    tail = judge(y[:800].astype(float), cols["user"][:800], {"model": cols["model"][:800].astype(float),
                                                                "baseline": cols["baseline"][:800].astype(float)})
    ev = Evaluation(prequential=judge_columns(cols), prequential_windows=windows(cols), forward_tail=tail,
                    prequential_kept=n, prequential_seen=n)
    run = Path(settings.runs_dir) / "run-5"
    run.mkdir(parents=True)
    m = build_run_metrics({"run_id": "run-5", "evaluation": ev, "auc_on": "forward_tail", "auc": tail.model.auc})  # type: ignore[union-attr]
    (run / "metrics.json").write_text(m.to_json())
    (run / "summary.json").write_text(json.dumps({"publish": {"promoted": False, "rule": "significant", "reason":
                                                              "registered, not promoted: its advantage is not significant"}}))
    text = render_report(settings, "run-5").read_text()
    assert {"model", "prequential", "decision"} <= _sections(text)
    assert "3,000 rows, 400 users" in text and ev.prequential.model.text() in text  # type: ignore[union-attr]
    assert 'alt="prequential AUC per window with 95% intervals"' in text
    assert text.count("<tr>") >= 12 + len(ev.prequential_windows)  # one table row per window
    assert tail.vs_baseline is not None and tail.vs_baseline.text() in text
    assert "registered, not promoted — registered, not promoted: its advantage is not significant" in text


def _short_run(settings: Settings, run_id: str, last_line: bool) -> Path:
    """What a 40-step run with log_every_steps 50 leaves: metrics.json with its last step, a
    metrics.jsonl without a line (the trainer logs every 50 steps) or with the last step's line,
    and the registry's decision on 232 rows whose interval includes 0."""
    run = Path(settings.runs_dir) / run_id
    run.mkdir(parents=True)
    from slipstream.pipeline.run_metrics import AucScore, Difference, EpochScores
    from tests.metrics_fixtures import run_metrics, scored_set

    tail = scored_set(0.6101, baseline=0.5981, rows=232, users=31)
    tail.vs_baseline = Difference(diff=0.012, lo=-0.019, hi=0.058)
    tail.best, tail.best_gap = AucScore(auc=0.7305, lo=0.70, hi=0.76), Difference(diff=0.1204, lo=0.09, hi=0.15)
    tail.model.logloss = 0.6612  # type: ignore[union-attr]
    metrics = run_metrics(
        run_id, forward_tail=tail, validation=scored_set(0.62, baseline=0.6, rows=1200), step=40,
        samples_per_s=51234.5678, data_wait_share=0.0812, chosen_epoch=1, epochs_run=1, epochs=1, samples_iceberg=2560,
        samples_kafka=0, validation_curve=[EpochScores(epoch=1, loss=0.65, auc=0.62, baseline_loss=0.66, baseline_auc=0.6)])
    (run / "metrics.json").write_text(metrics.to_json())
    line = {"step": 40, "phase": "batch", "epoch": 0, "loss": 0.671, "samples_per_s": 50100.0, "data_wait_share": 0.07}
    (run / "metrics.jsonl").write_text(json.dumps(line) + "\n" if last_line else "")
    reason = ("no champion yet: the first model is promoted; AUC 0.6101 beats its baseline 0.5981, "
              "95% CI [-0.0190, +0.0580] on 232 rows after T")
    (run / "summary.json").write_text(json.dumps({"publish": {"promoted": True, "reason": reason}}))
    return run


@pytest.mark.parametrize("last_line", [False, True], ids=["trainer-logs-every-50", "trainer-logs-its-last-step"])
def test_a_40_step_run_has_a_training_curve_and_honest_words(settings: Settings, last_line: bool) -> None:
    _short_run(settings, "short", last_line)
    text = render_report(settings, "short").read_text()
    training = text.split('<section id="training">')[1].split("</section>")[0]
    assert training.count('<img alt="training curve"') == 1
    assert ("metrics.jsonl has no line; the run ended at step 40" in training) is (not last_line)
    # the model is not shown better than its baseline: the summary and the model section say so
    # in the same words, and a promotion that called it better is a red finding with what to do
    words = ("not shown better than its logistic baseline: +0.0120 AUC, 95 % CI [-0.0190, +0.0580] on the same "
             "232 rows (the interval includes 0)")
    assert text.count(words) == 2
    assert "beats its baseline" not in text.replace(json.loads((Path(settings.runs_dir) / "short" / "summary.json")
                                                               .read_text())["publish"]["reason"], "")
    assert '<tr class="bad"><td>Promotion</td>' in text and "What to do: Keep the champion" in text
    # numbers with units and rows, no raw floats or dict reprs
    assert "{&#39;" not in text and "{'" not in text and "51234.5678" not in text
    assert "51,235 samples/s; 8.1 % of the training time waiting for data" in text
    assert "AUC 0.7305 on 232 rows, 95 % CI [0.7000, 0.7600] (the generator&#39;s hidden model on the same rows)" in text
    assert "One epoch: validation logloss 0.6500" in text and 'alt="validation curve"' not in text  # one point: a number
