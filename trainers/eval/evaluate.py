"""The end of a run's evaluation: every set of `slipstream.pipeline.run_metrics.Evaluation`.

Collective: each rank reads and scores its share of every set (`trainers.eval.sets`), the scores
are gathered once, and rank 0 judges them (`trainers.eval.judge`): the model, the logistic
baseline, item popularity, the batch-only model, the champion (forward tail) and the generator's
truth on exactly the same rows, each AUC with its interval over users. The prequential scores
the stream phase recorded (`trainers.eval.online`) are gathered here too.

Which set is the headline (`auc_on`): the forward tail when the run has one, else the
prequential stream, else the validation days, else the hold-out before T. The interleaved
hold-out after T is reported, never as the future.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from slipstream.pipeline.run_metrics import EvalSet, Evaluation
from slipstream.pipeline.runplan import RunPlan
from slipstream.settings import Settings
from trainers.config.schema import TrainConfig
from trainers.data.progress import TrainState
from trainers.data.rows import RowLayout, Rows
from trainers.data.units import Opener, WorkUnit
from trainers.eval.baselines import Baselines
from trainers.eval.judge import judge, load_champion
from trainers.eval.new_ids import evaluate_id_tables
from trainers.eval.online import StreamEvaluator
from trainers.eval.prequential import gather_columns, judge_columns, progress, windows
from trainers.eval.scoring import Gather, gathered, score, score_everywhere, user_groups
from trainers.eval.sets import StreamSets, holdout_before_t, validation_rows
from trainers.eval.truth import GeneratorTruth
from trainers.models import build_model
from trainers.parallel.dist import Dist

log = logging.getLogger(__name__)

HEADLINE_ORDER = ("forward_tail", "prequential", "validation", "holdout_before_t")


@dataclass
class EvalInputs:
    """What the evaluation reads (this rank's view of a finished run)."""

    cfg: TrainConfig
    plan: RunPlan
    run_dir: Path
    broker: Any
    model: nn.Module
    """The trained model (a sharded one's forward is collective: every rank scores)."""
    units: list[WorkUnit]
    open_file: Opener
    state: TrainState
    """With every rank's final positions."""
    settings: Settings
    baselines: Baselines
    train_end: datetime
    online: StreamEvaluator
    sharded: bool


@dataclass
class EvalResult:
    evaluation: Evaluation | None
    """Rank 0's judgement (None on the other ranks)."""
    scored: list[tuple[Rows, str]]
    """This rank's rows of each end-of-run set (for the ids of `evaluated/`)."""
    id_tables: dict[str, Any]
    """metrics.json's `id_tables` (`trainers.eval.new_ids`; {} without a managed table)."""


def _us(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


def _batch_only(x: EvalInputs, device: torch.device) -> nn.Module | None:
    """The model at the handoff: the stream evaluator's copy, else rebuilt from its file."""
    if x.online.batch_only is not None:
        return x.online.batch_only
    path = x.run_dir / "checkpoint" / "batch_only" / "model.pt"
    if not path.exists():
        return None
    m = build_model(x.plan.spec, x.cfg.model, x.cfg.data.seed).to(device)
    m.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["model"])
    return m


def evaluation_sets(x: EvalInputs, rank: int, world: int) -> dict[str, Rows]:
    """This rank's rows of every end-of-run set, in the same order on every rank."""
    dc, plan = x.cfg.data, x.plan
    cap = max(1, dc.eval_max_rows // world)
    layout = RowLayout.from_spec(plan.spec)
    out = {"holdout_before_t": holdout_before_t(x.units, x.open_file, layout, plan.window, rank, world, cap),
           "validation": (validation_rows(x.units, x.open_file, layout, _us(x.train_end), _us(plan.t_handoff), rank,
                                          world, cap) if x.train_end < plan.t_handoff else Rows.empty(layout))}
    st = x.state
    if st.handoff_offsets:
        stream = StreamSets(x.broker, dc.topic, plan.spec, f"slipstream-eval-{x.cfg.run.run_id}", st.handoff_offsets,
                            st.positions, _us(plan.t_handoff), st.forward_tail_start_us, dc.max_lateness_s, rank, world)
        out["forward_tail"] = stream.forward_tail(cap)
        out["holdout_after_t"] = stream.holdout_after_t(cap)
    return out


def evaluate(x: EvalInputs, d: Dist) -> EvalResult:
    """Collective: every evaluation set scored and gathered; rank 0 judges."""
    gather: Gather = d.gather
    rank, world, device = d.rank, d.world, d.device
    spec = x.plan.spec
    sets = evaluation_sets(x, rank, world)
    batch_only = _batch_only(x, device)
    truth = GeneratorTruth.load(x.cfg.data.generator_manifest)
    champ_id, champ, note = (load_champion(x.settings, spec, x.cfg.model, x.plan.run_id, device)
                             if "forward_tail" in sets else (None, None, ""))
    views, clicks = x.baselines.popularity_counts()
    pop = x.baselines.popularity
    judged: dict[str, EvalSet] = {}
    after_t: dict[str, np.ndarray] = {}
    for name, rows in sets.items():
        probs: dict[str, np.ndarray | None] = {
            "model": score_everywhere(gather, x.model, rows, device),
            "baseline": score(x.baselines.logistic, rows, device),
            "batch_only": score(batch_only, rows, device) if batch_only is not None else None,
            "champion": score(champ, rows, device) if champ is not None and name == "forward_tail" else None,
            "popularity": pop.score(rows, views, clicks) if pop.available else None,
            "best": truth.lookup(rows.sample_id) if truth is not None else None,
        }
        given = {k: v for k, v in probs.items() if v is not None}
        cols = gathered(gather, rows.label.astype(np.float64), user_groups(rows, spec), *given.values())
        if name == "holdout_after_t":  # the new ids' scores (managed tables) are on these rows
            after_t = {"label": cols[0], "user": cols[1], **dict(zip(given, cols[2:], strict=True))}
        if rank == 0 and len(cols[0]):
            judged[name] = judge(cols[0], cols[1], dict(zip(given, cols[2:], strict=True)))
    pre = gather_columns(gather, x.online.scores.columns())
    seen = int(sum(gather(x.online.scores.seen)))
    empty = np.zeros(0)
    id_tables = evaluate_id_tables(
        spec, x.model, batch_only, sets.get("holdout_after_t", Rows.empty(RowLayout.from_spec(spec))),
        after_t.get("label", empty), after_t.get("model", empty), after_t.get("batch_only"), after_t.get("user", empty),
        x.units, x.open_file, (_us(x.plan.window_start), _us(x.plan.t_handoff)), d)
    if rank != 0:
        return EvalResult(None, list((r, n) for n, r in sets.items()), {})
    ev = Evaluation.model_validate({
        **judged, "champion_run_id": champ_id, "champion_note": note or None,
        "truth_note": f"the generator's p_true ({truth.source})" if truth is not None else None,
        "prequential_kept": len(pre["label"]), "prequential_seen": seen})
    if len(pre["label"]):
        ev.prequential = judge_columns(pre)
        ev.prequential_windows = windows(pre)
        ev.prequential_progress = progress(pre)
    if x.sharded and x.state.handoff_offsets:
        log.info("prequential: the batch-only model is not scored per step with sharded tables (it is at the end)")
    return EvalResult(ev, list((r, n) for n, r in sets.items()), id_tables.get("id_tables", {}))


def headline(ev: Evaluation) -> str | None:
    """The set the headline AUC comes from (see the module docstring)."""
    for name in HEADLINE_ORDER:
        s = ev.get(name)
        if s is not None and s.scored:
            return name
    return None
