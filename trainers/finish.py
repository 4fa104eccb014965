"""The end of a run: held-out evaluation, export, stream profile, metrics.json.

Evaluation sets are rebuilt from data, not from memory, so they are the same whether the run
went straight through or was killed and resumed: before T, the held-out rows of the window at
the pinned snapshot (rank r reads units r, r+world, ...); after T, the held-out Kafka records in
[handoff offset, final offset) of each partition (rank r reads its partitions).
"""

from __future__ import annotations

import json
import logging
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from slipstream.samples.codec import decode_samples
from slipstream.samples.schema import HOLDOUT_MODULO
from trainers.audit import merge_parts
from trainers.data.holdout import holdout_mask
from trainers.data.iceberg_source import ChunkStats, read_units, select_rows
from trainers.data.kafka_source import assigned_partitions, read_range
from trainers.evaluate import auc_logloss, score
from trainers.export import export_model
from trainers.metrics import percentile
from trainers.model import build_model
from trainers.rows import Rows
from trainers import stream_profile

if TYPE_CHECKING:
    from trainers.trainer import Trainer

log = logging.getLogger(__name__)


def holdout_before_t(tr: "Trainer", units: list[Any], cap: int) -> Rows:
    mine = units[tr.d.rank :: tr.d.world]
    out: list[Rows] = []
    n = 0
    for s in range(0, len(mine), 32):
        table = read_units(mine[s : s + 32], tr.open_file)
        _, hold = select_rows(table, tr.start_us, tr.t_us, ChunkStats())
        out.append(Rows.from_arrow(hold, source=0))
        n += hold.num_rows
        if n >= cap:
            break
    rows = Rows.concat(out) if out else Rows.empty()
    return rows.slice(0, cap) if len(rows) > cap else rows


def holdout_after_t(tr: "Trainer", final: dict[int, int], cap: int) -> Rows:
    if not tr.handoff_offsets:
        return Rows.empty()
    parts = assigned_partitions(sorted(tr.handoff_offsets), tr.d.rank, tr.d.world)
    per_part = max(1, cap * HOLDOUT_MODULO // max(len(tr.handoff_offsets), 1))
    ranges = {p: (max(tr.handoff_offsets[p], final.get(p, 0) - per_part), final.get(p, 0)) for p in parts}
    out: list[Rows] = []
    for values, _, _ in read_range(tr.broker, tr.cfg.data.topic, ranges, f"slipstream-eval-{tr.cfg.run.run_id}"):
        t = decode_samples(values).table
        if t.num_rows == 0:
            continue
        rows = Rows.from_arrow(t, source=1)
        out.append(rows.mask((rows.event_us >= tr.t_us) & holdout_mask(rows.sample_id)))
    rows = Rows.concat(out) if out else Rows.empty()
    return rows.slice(0, cap) if len(rows) > cap else rows


def _gathered_metrics(tr: "Trainer", model: Any, rows: Rows) -> tuple[float, float, int, np.ndarray, np.ndarray]:
    probs = score(model, rows, tr.d.device)
    everything = tr.d.gather((rows.label, probs))
    labels = np.concatenate([e[0] for e in everything]) if everything else np.zeros(0)
    p = np.concatenate([e[1] for e in everything]) if everything else np.zeros(0)
    a, ll = auc_logloss(labels, p)
    return a, ll, len(labels), labels, p


def evaluate(tr: "Trainer", units: list[Any], final_offsets: dict[int, int]) -> dict[str, Any]:
    cap = max(1, tr.cfg.data.eval_max_rows // tr.d.world)
    before = holdout_before_t(tr, units, cap)
    after = holdout_after_t(tr, final_offsets, cap)
    out: dict[str, Any] = {}
    a_b, ll_b, n_b, lab_b, p_b = _gathered_metrics(tr, tr.model, before)
    a_a, ll_a, n_a, lab_a, p_a = _gathered_metrics(tr, tr.model, after)
    a, ll = auc_logloss(np.concatenate([lab_b, lab_a]), np.concatenate([p_b, p_a]))
    out.update(auc=a, logloss=ll, auc_before_t=a_b, logloss_before_t=ll_b, eval_rows_before_t=n_b,
               auc_after_t=a_a, logloss_after_t=ll_a, eval_rows_after_t=n_a)
    batch_only = tr.run_dir / "checkpoint" / "batch_only" / "model.pt"
    if batch_only.exists():
        import torch

        m = build_model(tr.cfg.model, tr.cfg.data.seed).to(tr.d.device)
        m.load_state_dict(torch.load(batch_only, map_location="cpu", weights_only=True)["model"])
        # before T too: what the stream phase cost (or gained) on the window's slice
        a_bb, ll_bb, _, _, _ = _gathered_metrics(tr, m, before)
        out.update(auc_before_t_batch_only=a_bb, logloss_before_t_batch_only=ll_bb)
        if n_a > 0:
            a_bo, ll_bo, _, _, _ = _gathered_metrics(tr, m, after)
            out.update(auc_after_t_batch_only=a_bo, logloss_after_t_batch_only=ll_bo)
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


def finish(tr: "Trainer", units: list[Any], wall_s: float) -> dict[str, Any]:
    """Collective: evaluate, then rank 0 writes audit files, profile, export and metrics.json."""
    final = tr.global_positions()
    profiles = tr.d.gather(tr.profile)
    waits = tr.d.sum([tr.wait_s, tr.train_s, tr.exchange_s, float(tr.exchanged_rows)])
    counters = tr.d.sum([float(tr.c[k]) for k in sorted(tr.c)])
    newest = tr.d.max([float(tr.kafka.counters.newest_event_us if tr.kafka else -1)])[0]
    ev = evaluate(tr, units, final)
    if not tr.d.is_main:
        return {}
    dc = tr.cfg.data
    c = dict(zip(sorted(tr.c), (int(x) for x in counters)))
    merge_parts(tr.run_dir / "audit")
    stream_profile.merge(profiles).write(tr.run_dir / "stream_profile.json")
    lat = np.concatenate(tr.latencies_ms).tolist() if tr.latencies_ms else []
    summary: dict[str, Any] = {
        "run_id": tr.cfg.run.run_id, "snapshot_id": dc.snapshot_id, "t_handoff": dc.handoff_time.isoformat(),
        "window_start": dc.window_start.isoformat(), "window_days": dc.window_days,
        # where the data came from, so the report audits this run's sources, not the deployment's defaults
        "catalog": dc.catalog, "namespace": dc.namespace, "table": dc.table,
        "kafka_bootstrap": dc.bootstrap, "topic": dc.topic, "dlq_topic": dc.dlq_topic,
        **c,
        "handoff_offsets": {str(k): v for k, v in (tr.handoff_offsets or {}).items()},
        "handoff_methods": {str(k): v for k, v in tr.handoff_methods.items()},
        "final_offsets": {str(k): v for k, v in sorted(final.items())},
        **ev, **best_auc(dc.generator_manifest),
        "samples_per_s": tr.trained_global / max(waits[1] / tr.d.world, 1e-9),
        "data_wait_share": waits[0] / max(waits[1], 1e-9),
        "newest_event_time": (datetime.fromtimestamp(newest / 1e6, tz=timezone.utc).isoformat() if newest > 0 else None),
        "kafka_lag_at_stop": getattr(tr, "lag_at_stop", None),
        "latency_consume_to_train_ms_p50": percentile(lat, 50),
        "latency_consume_to_train_ms_p99": percentile(lat, 99),
        "drift_excess": tr.drift.excess, "drift_level": tr.drift.level,
        "exchange": dc.exchange, "exchange_s": waits[2] / tr.d.world, "exchanged_rows": int(waits[3]),
        "stop_reason": tr.stop_reason, "step": tr.step, "epochs": dc.epochs, "world_size": tr.d.world,
        "device": str(tr.d.device), "backend": tr.d.backend, "amp": tr.amp, "wall_s": wall_s,
        "trained_this_process": tr.trained_global,
        "checkpoint": tr.last_checkpoint,
        "cache": tr.cache_reader.stats() if tr.cache_reader is not None else None,
    }
    summary["export"] = str(export_model(tr.model, tr.cfg, tr.run_dir, step=tr.step, phase=tr.phase,
                                         positions=tr.positions, metrics=summary))
    tr.metrics.summary(summary)
    for k in ("auc", "auc_after_t", "auc_after_t_batch_only"):
        v = summary.get(k)
        if isinstance(v, float) and not math.isnan(v):
            log.info("%s = %.4f", k, v)
    return summary
