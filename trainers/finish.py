"""The end of a run: evaluation (`trainers.eval.evaluate`), export, stream profile, metrics.json.

`finish` takes what it reports as one `RunOutcome`, built by the trainer (nothing here reaches
into the trainer), has the evaluation scored, and assembles `metrics.json` through its typed
contract (`slipstream.pipeline.run_metrics.RunMetrics`): a key the contract does not declare is
an error, not a new key a reader may miss.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slipstream.pipeline.run_metrics import EpochScores, Evaluation, RunMetrics, build_run_metrics
from slipstream.pipeline.runplan import RunPlan
from slipstream.quality.profiles import FeatureProfile
from slipstream.settings import Settings
from trainers.config.schema import TrainConfig
from trainers.data import stream_profile
from trainers.data.progress import Throughput, TrainState
from trainers.data.units import Opener, WorkUnit
from trainers.eval.baselines import Baselines
from trainers.eval.evaluate import EvalInputs, evaluate, headline
from trainers.eval.online import StreamEvaluator
from trainers.eval.validation import EarlyStopping
from trainers.models.export import export_model
from trainers.observe.freshness import FreshnessTracker
from trainers.observe.run_metrics import MetricsLogger, percentile
from trainers.observe.sample_audit import merge_parts, write_final
from trainers.observe.stream_verify import verify_stream
from trainers.optim.drift_gauge import DriftGauge
from trainers.parallel.dist import Dist

log = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    """What a finished training leaves for its evaluation and summary (this rank's view)."""

    cfg: TrainConfig
    plan: RunPlan
    run_dir: Path
    broker: Any
    """The run's broker and its security settings (`slipstream.stream.kafka.KafkaAccess`)."""
    model: torch.nn.Module
    """The trained model (a sharded one's forward is collective: every rank scores)."""
    whole: torch.nn.Module | None
    """On rank 0, the model with every table whole, to export (the model itself when not sharded)."""
    units: list[WorkUnit]
    """The planned window's work units (the held-out rows before T are read from them)."""
    open_file: Opener
    state: TrainState
    """With every rank's final positions (`Trainer.global_positions`)."""
    throughput: Throughput
    profile: FeatureProfile
    drift: DriftGauge
    newest_event_us: int
    """Newest event time this rank trained from Kafka (-1: none)."""
    cache: dict[str, float] | None
    """The cache reader's statistics (None: files read directly)."""
    amp: bool
    settings: Settings
    """The deployment's settings (where the model registry is, to re-score the champion)."""
    baselines: Baselines
    early: EarlyStopping
    train_end: datetime
    """The batch phase trained rows before this (T minus the validation days)."""
    online: StreamEvaluator
    """The stream phase's prequential scores."""
    sharded: bool
    freshness: FreshnessTracker
    """Event-to-export latencies of the exports so far (`trainers.observe.freshness`)."""


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The metrics.json of a run that already finished (a resume of it changes nothing), or None."""
    import json

    try:
        summary = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def _iso(us: float) -> str | None:
    return datetime.fromtimestamp(us / 1e6, tz=UTC).isoformat() if us > 0 else None


def _evaluation_fields(ev: Evaluation, early: EarlyStopping, state: TrainState) -> dict[str, Any]:
    on = headline(ev)
    top = ev.get(on) if on else None
    m = top.model if top is not None else None
    return {
        "evaluation": ev, "auc_on": on, "auc": m.auc if m else None, "auc_lo": m.lo if m else None,
        "auc_hi": m.hi if m else None, "logloss": m.logloss if m else None, "auc_rows": top.rows if top else 0,
        "baseline_auc": top.baseline.auc if top is not None and top.baseline is not None else None,
        "validation_curve": [EpochScores.model_validate(c) for c in early.curve],
        "chosen_epoch": early.best_epoch if early.curve else None, "epochs_run": state.epoch, "stopped_early": early.stopped,
    }


def verify_committed(run: RunOutcome) -> dict[str, Any]:
    """Rank 0: the stream phase against what was committed in its range (`verify_stream`); the
    forward tail's records are scored, never trained, so they are not expected in training."""
    st, dc = run.state, run.cfg.data
    tail = (datetime.fromtimestamp(st.forward_tail_start_us / 1e6, tz=UTC)
            if st.forward_tail_start_us is not None else None)
    return verify_stream(run.run_dir, run.broker, dc.topic, run.plan.spec, run.plan.t_handoff, st.handoff_offsets,
                         st.positions, st.stop_offsets, forward_tail_start=tail)


def finish(run: RunOutcome, d: Dist, metrics: MetricsLogger, wall_s: float) -> dict[str, Any]:
    """Collective: evaluate, then rank 0 writes audit files, profile, export and metrics.json."""
    st, tp = run.state, run.throughput
    profiles = d.gather(run.profile)
    waits = d.sum([tp.wait_s, tp.train_s, tp.exchange_s, float(tp.exchanged_rows)])
    counters = d.sum([float(st.counters[k]) for k in sorted(st.counters)])
    newest = d.max([float(run.newest_event_us)])[0]
    result = evaluate(EvalInputs(cfg=run.cfg, plan=run.plan, run_dir=run.run_dir, broker=run.broker, model=run.model,
                                 units=run.units, open_file=run.open_file, state=st, settings=run.settings,
                                 baselines=run.baselines, train_end=run.train_end, online=run.online,
                                 sharded=run.sharded), d)
    write_final(run.run_dir / "evaluated", d.rank, result.scored, st.step)
    exported_events = run.freshness.collect(d.gather)
    if not d.is_main:
        return {}
    assert exported_events is not None
    assert result.evaluation is not None
    dc, plan = run.cfg.data, run.plan
    merge_parts(run.run_dir / "audit")
    merge_parts(run.run_dir / "evaluated")
    verified = verify_committed(run)  # before anything is exported: a lost record stops the run here
    stream_profile.merge(profiles, run.plan.spec).write(run.run_dir / "stream_profile.json")
    lat = np.concatenate(tp.latencies_ms).tolist() if tp.latencies_ms else []
    values: dict[str, Any] = {
        "run_id": plan.run_id, "snapshot_id": plan.snapshot_id, "t_handoff": plan.t_handoff,
        "window_start": plan.window_start, "window_days": plan.window_days, "train_end": run.train_end,
        "forward_tail_start": (datetime.fromtimestamp(st.forward_tail_start_us / 1e6, tz=UTC)
                               if st.forward_tail_start_us is not None else None),
        # where the data came from, so the report audits this run's sources, not the deployment's defaults
        "catalog": dc.catalog, "namespace": dc.namespace, "table": dc.table,
        "kafka_bootstrap": dc.bootstrap, "topic": dc.topic, "dlq_topic": dc.dlq_topic,
        **dict(zip(sorted(st.counters), (int(x) for x in counters), strict=True)),
        "handoff_offsets": {str(k): v for k, v in (st.handoff_offsets or {}).items()},
        "handoff_methods": {str(k): v for k, v in st.handoff_methods.items()},
        "final_offsets": {str(k): v for k, v in sorted(st.positions.items())} if st.handoff_offsets is not None else {},
        **_evaluation_fields(result.evaluation, run.early, st),
        **({"id_tables": result.id_tables} if result.id_tables else {}),
        "samples_per_s": tp.trained_global / max(waits[1] / d.world, 1e-9),
        "data_wait_share": waits[0] / max(waits[1], 1e-9),
        "newest_event_time": _iso(newest),
        "kafka_lag_at_stop": st.lag_at_stop,
        "latency_consume_to_train_ms_p50": percentile(lat, 50),
        "latency_consume_to_train_ms_p99": percentile(lat, 99),
        "drift_excess": run.drift.excess, "drift_level": run.drift.level, "drift_new_user_share": run.drift.new_share,
        "exchange": dc.exchange, "exchange_s": waits[2] / d.world, "exchanged_rows": int(waits[3]),
        "stop_reason": st.stop_reason, "step": st.step, "epochs": dc.epochs, "validation_days": dc.validation_days,
        "world_size": d.world, "device": str(d.device), "backend": d.backend, "amp": run.amp, "wall_s": wall_s,
        "trained_this_process": tp.trained_global, "checkpoint": st.last_checkpoint, "cache": run.cache,
    }
    summary = build_run_metrics({**values, **verified})
    assert run.whole is not None
    summary.export = str(export_model(run.whole, run.cfg, run.plan.spec, run.run_dir, step=st.step, phase=st.phase,
                                      positions=st.positions, metrics=summary.to_dict()))
    run.freshness.exported(exported_events, step=st.step, record=dc.stop.mode == "continuous")
    summary.freshness = run.freshness.summary(lat)
    out = summary.to_dict()
    metrics.summary(out)
    _log_headline(summary)
    return out


def _log_headline(m: RunMetrics) -> None:
    ev = m.evaluation
    for name in ("forward_tail", "prequential", "holdout_after_t", "validation", "holdout_before_t"):
        s = ev.get(name)
        if s is not None and s.model is not None:
            base = f", baseline {s.baseline.text()}" if s.baseline is not None else ""
            log.info("%s: AUC %s on %d rows of %d users%s", name, s.model.text(), s.rows, s.users, base)
