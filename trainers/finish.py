"""The end of a run: held-out evaluation, export, stream profile, metrics.json.

Evaluation sets are rebuilt from data, not from memory, so they are the same whether the run
went straight through or was killed and resumed: before T, the held-out rows of the planned window
(rank r reads units r, r+world, ...); after T, the held-out Kafka records in [handoff offset,
final offset) of each partition (rank r reads its partitions).

`finish` takes what it reports as one `RunOutcome`, built by the trainer: nothing here reaches
into the trainer.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slipstream.pipeline.runplan import RunPlan
from slipstream.quality.profiles import FeatureProfile
from slipstream.samples.codec import decode_samples
from slipstream.samples.schema import HOLDOUT_MODULO
from slipstream.samples.spec import Spec
from slipstream.settings import Settings
from trainers.observe.sample_audit import merge_parts
from trainers.observe.stream_verify import verify_stream
from trainers.config.schema import TrainConfig
from trainers.data.holdout import holdout_mask
from trainers.data.iceberg_source import ChunkStats, read_units, select_rows
from trainers.data.kafka_source import assigned_partitions, read_range
from trainers.data.units import Opener, WorkUnit
from trainers.parallel.dist import Dist
from trainers.optim.drift_gauge import DriftGauge
from trainers.eval.baselines import Baselines
from trainers.eval.judge import judged, load_champion
from trainers.eval.new_ids import evaluate_id_tables
from trainers.eval.validation import EarlyStopping, scores, validation_rows
from trainers.models.export import export_model
from trainers.observe.run_metrics import MetricsLogger, percentile
from trainers.models import build_model
from trainers.data.rows import RowLayout, Rows
from trainers.data.progress import Throughput, TrainState
from trainers.data import stream_profile

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
    """Newest event time this rank read from Kafka (-1: none)."""
    cache: dict[str, float] | None
    """The cache reader's statistics (None: files read directly)."""
    amp: bool
    settings: Settings
    """The deployment's settings (where the model registry is, to re-score the champion)."""
    baselines: Baselines
    early: EarlyStopping
    train_end: datetime
    """The batch phase trained rows before this (T minus the validation days)."""


def holdout_before_t(run: RunOutcome, d: Dist, cap: int) -> Rows:
    layout = RowLayout.from_spec(run.plan.spec)
    mine = run.units[d.rank :: d.world]
    start_us, t_us = (int(t.timestamp() * 1_000_000) for t in run.plan.window)
    out: list[Rows] = []
    n = 0
    for s in range(0, len(mine), 32):
        table = read_units(mine[s : s + 32], run.open_file, layout=layout)
        _, hold = select_rows(table, start_us, t_us, ChunkStats())
        out.append(Rows.from_arrow(hold, layout, source=0))
        n += hold.num_rows
        if n >= cap:
            break
    return Rows.first(out, layout, cap)


def holdout_after_t(run: RunOutcome, d: Dist, cap: int) -> Rows:
    start, final = run.state.handoff_offsets, run.state.positions
    spec = run.plan.spec
    layout = RowLayout.from_spec(spec)
    if not start:
        return Rows.empty(layout)
    parts = assigned_partitions(sorted(start), d.rank, d.world)
    per_part = max(1, cap * HOLDOUT_MODULO // max(len(start), 1))
    ranges = {p: (max(start[p], final.get(p, 0) - per_part), final.get(p, 0)) for p in parts}
    t_us = int(run.plan.t_handoff.timestamp() * 1_000_000)
    out: list[Rows] = []
    dc = run.cfg.data
    for values, _, _ in read_range(run.broker, dc.topic, ranges, f"slipstream-eval-{run.cfg.run.run_id}"):
        t = decode_samples(values, spec).table
        if t.num_rows == 0:
            continue
        rows = Rows.from_arrow(t, layout, source=1)
        out.append(rows.mask((rows.event_us >= t_us) & holdout_mask(rows.sample_id)))
    return Rows.first(out, layout, cap)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _user_groups(rows: Rows, spec: Spec) -> np.ndarray:
    """The bootstrap's groups: each row's user (the id feature with role user), else the row."""
    user = spec.with_role("user")
    if user is None:
        return np.arange(len(rows), dtype=np.int64)
    return rows.sparse[:, [f.name for f in spec.sparse].index(user.name)]


def evaluate(run: RunOutcome, d: Dist) -> dict[str, Any]:
    """Collective: every score of metrics.json. Three sets of rows none of the models trained on:
    the held-out rows before T (interpolation, for comparison with the generator's best), the
    validation days (what chose the epoch) and the held-out rows after T (the future: what decides
    promotion, with the baselines and the champion scored on exactly the same rows)."""
    cap = max(1, run.cfg.data.eval_max_rows // d.world)
    spec, dev = run.plan.spec, d.device
    layout = RowLayout.from_spec(spec)
    before = holdout_before_t(run, d, cap)
    after = holdout_after_t(run, d, cap)
    val = (validation_rows(run.units, run.open_file, layout, int(run.train_end.timestamp() * 1e6),
                           int(run.plan.t_handoff.timestamp() * 1e6), d.rank, d.world, cap)
           if run.train_end < run.plan.t_handoff else Rows.empty(layout))
    lr = run.baselines.logistic
    out: dict[str, Any] = {}
    a_b, ll_b, lab_b, p_b = scores(d.gather, run.model, before, dev)
    a_v, ll_v, lab_v, _ = scores(d.gather, run.model, val, dev)
    a_a, ll_a, lab_a, p_a = scores(d.gather, run.model, after, dev)
    out.update(auc_before_t=a_b, logloss_before_t=ll_b, eval_rows_before_t=len(lab_b),
               val_auc=a_v, val_logloss=ll_v, val_rows=len(lab_v),
               auc_after_t=a_a, logloss_after_t=ll_a, eval_rows_after_t=len(lab_a))
    bb, bv, ba = (scores(d.gather, lr, rows, dev) for rows in (before, val, after))
    out.update(baseline_auc_before_t=bb[0], baseline_auc_val=bv[0], baseline_val_auc=bv[0], baseline_val_logloss=bv[1],
               baseline_auc_after_t=ba[0], baseline_logloss_after_t=ba[1])
    views, clicks = run.baselines.popularity_counts()
    pop = d.gather(run.baselines.popularity.score(after, views, clicks))
    users = d.gather(_user_groups(after, spec))
    champ_id, champ, note = load_champion(run.settings, spec, run.cfg.model, run.plan.run_id, dev)
    champ_p = scores(d.gather, champ, after, dev)[3] if champ is not None and len(lab_a) else None
    out.update(champion_run_id=champ_id, champion_note=note or None)
    if len(lab_a):
        out.update(judged(lab_a, np.concatenate(users), p_a, ba[3],
                          np.concatenate(pop) if run.baselines.popularity.available else None, champ_p))
    # the headline: the future when the run has one, else the validation days, else the holdout
    # (rows of one class have no AUC: a few rows after T may hold no click)
    source = "after_t" if _finite(a_a) else ("validation" if _finite(a_v) else "holdout_before_t")
    pick = {"after_t": (a_a, ll_a, ba[0]), "validation": (a_v, ll_v, bv[0]), "holdout_before_t": (a_b, ll_b, bb[0])}
    out.update(auc=pick[source][0], logloss=pick[source][1], baseline_auc=pick[source][2], auc_on=source)
    batch_only = run.run_dir / "checkpoint" / "batch_only" / "model.pt"
    m, bo_a = None, None
    if batch_only.exists():
        m = build_model(spec, run.cfg.model, run.cfg.data.seed).to(dev)
        m.load_state_dict(torch.load(batch_only, map_location="cpu", weights_only=True)["model"])
        # before T too: what the stream phase cost (or gained) on the window's slice
        bo_b = scores(d.gather, m, before, dev)
        out.update(auc_before_t_batch_only=bo_b[0], logloss_before_t_batch_only=bo_b[1])
        if len(lab_a):
            bo_a = scores(d.gather, m, after, dev)
            out.update(auc_after_t_batch_only=bo_a[0], logloss_after_t_batch_only=bo_a[1])
    out.update(evaluate_id_tables(spec, run.model, m, after, lab_a, p_a, bo_a[3] if bo_a is not None else None,
                                  np.concatenate(users), run.units, run.open_file,
                                  (int(run.plan.window_start.timestamp() * 1e6), int(run.plan.t_handoff.timestamp() * 1e6)), d))
    e = run.early
    out.update(validation_curve=e.curve, chosen_epoch=e.best_epoch if e.curve else None,
               epochs_run=run.state.epoch, stopped_early=e.stopped, train_end=run.train_end.isoformat())
    return out


def best_auc(path: str) -> dict[str, Any]:
    p = Path(path)
    if not path or not p.exists():
        return {}
    try:
        best = json.loads(p.read_text()).get("best_auc", {})
    except (OSError, ValueError) as e:
        log.warning("generator manifest %s unreadable (%s): no best_auc in the summary", p, e)
        return {}
    return {"best_auc": best, "best_auc_before_t": best.get("holdout_before_t"), "best_auc_after_t": best.get("holdout_after_t")}


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The metrics.json of a run that already finished (a resume of it changes nothing), or None."""
    try:
        summary = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def verify_committed(run: RunOutcome) -> dict[str, Any]:
    """Rank 0: the stream phase against what was committed in its range (`verify_stream`)."""
    st, dc = run.state, run.cfg.data
    return verify_stream(run.run_dir, run.broker, dc.topic, run.plan.spec, run.plan.t_handoff, st.handoff_offsets,
                         st.positions, st.stop_offsets)


def finish(run: RunOutcome, d: Dist, metrics: MetricsLogger, wall_s: float) -> dict[str, Any]:
    """Collective: evaluate, then rank 0 writes audit files, profile, export and metrics.json."""
    st, tp = run.state, run.throughput
    profiles = d.gather(run.profile)
    waits = d.sum([tp.wait_s, tp.train_s, tp.exchange_s, float(tp.exchanged_rows)])
    counters = d.sum([float(st.counters[k]) for k in sorted(st.counters)])
    newest = d.max([float(run.newest_event_us)])[0]
    ev = evaluate(run, d)
    if not d.is_main:
        return {}
    dc, plan = run.cfg.data, run.plan
    merge_parts(run.run_dir / "audit")
    verified = verify_committed(run)  # before anything is exported: a lost record stops the run here
    stream_profile.merge(profiles, run.plan.spec).write(run.run_dir / "stream_profile.json")
    lat = np.concatenate(tp.latencies_ms).tolist() if tp.latencies_ms else []
    summary: dict[str, Any] = {
        "run_id": plan.run_id, "snapshot_id": plan.snapshot_id, "t_handoff": plan.t_handoff.isoformat(),
        "window_start": plan.window_start.isoformat(), "window_days": plan.window_days,
        # where the data came from, so the report audits this run's sources, not the deployment's defaults
        "catalog": run.cfg.data.catalog, "namespace": run.cfg.data.namespace, "table": run.cfg.data.table,
        "kafka_bootstrap": run.cfg.data.bootstrap, "topic": run.cfg.data.topic, "dlq_topic": run.cfg.data.dlq_topic,
        **dict(zip(sorted(st.counters), (int(x) for x in counters))),
        "handoff_offsets": {str(k): v for k, v in (st.handoff_offsets or {}).items()},
        "handoff_methods": {str(k): v for k, v in st.handoff_methods.items()},
        "final_offsets": {str(k): v for k, v in sorted(st.positions.items())} if st.handoff_offsets is not None else {},
        **ev, **best_auc(dc.generator_manifest),
        "samples_per_s": tp.trained_global / max(waits[1] / d.world, 1e-9),
        "data_wait_share": waits[0] / max(waits[1], 1e-9),
        "newest_event_time": (datetime.fromtimestamp(newest / 1e6, tz=timezone.utc).isoformat() if newest > 0 else None),
        "kafka_lag_at_stop": st.lag_at_stop,
        "latency_consume_to_train_ms_p50": percentile(lat, 50),
        "latency_consume_to_train_ms_p99": percentile(lat, 99),
        "drift_excess": run.drift.excess, "drift_level": run.drift.level, "drift_new_user_share": run.drift.new_share,
        "exchange": dc.exchange, "exchange_s": waits[2] / d.world, "exchanged_rows": int(waits[3]),
        "stop_reason": st.stop_reason, "step": st.step, "epochs": dc.epochs, "validation_days": dc.validation_days,
        "world_size": d.world,
        "device": str(d.device), "backend": d.backend, "amp": run.amp, "wall_s": wall_s,
        "trained_this_process": tp.trained_global,
        "checkpoint": st.last_checkpoint,
        "cache": run.cache,
    }
    summary.update(verified)
    assert run.whole is not None
    summary["export"] = str(export_model(run.whole, run.cfg, run.plan.spec, run.run_dir, step=st.step, phase=st.phase,
                                         positions=st.positions, metrics=summary))
    metrics.summary(summary)
    for k in ("auc", "baseline_auc", "auc_after_t", "auc_after_t_batch_only"):
        v = summary.get(k)
        if isinstance(v, float) and not math.isnan(v):
            log.info("%s = %.4f", k, v)
    return summary
