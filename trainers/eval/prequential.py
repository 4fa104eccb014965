"""Prequential (test-then-train) evaluation of the stream phase.

Every fresh stream row is scored by the model as it is just before the optimizer step that trains
on it, on the rank that trains it; the same rows are scored in the same step by the logistic
baseline (updated online on the same rows in the same order), by item popularity counted online,
by the frozen batch-only model and, on generated data, by the generator's hidden probability.
Each row is a forecast, so the whole stream is an honest evaluation set, at the cost of one
forward pass per step.

`PrequentialScores` keeps a small record per scored row (label, user, event time, each model's
probability): a `data` checkpoint piece (`trainers.checkpoint.pieces`), saved with the step that
trained the rows, so a resumed run re-scores exactly the rows it trains again and neither loses
nor double-counts a score. On another world size an old rank's record goes to exactly one new
rank (old rank r to r % world); at the end every rank's record is gathered once, on rank 0.
Past `max_rows` per rank the oldest rows are dropped (a continuous run keeps its newest rows); the
count of all rows scored is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from slipstream.pipeline.run_metrics import EvalSet, ProgressScores, WindowScores
from trainers.checkpoint.stateful import check_version
from trainers.eval.judge import judge

STATE_VERSION = 1
FLOAT_COLUMNS = ("label", "model", "baseline", "batch_only", "popularity", "best")
INT_COLUMNS = ("user", "event_us", "step")
COLUMNS = FLOAT_COLUMNS + INT_COLUMNS
MODELS = ("model", "baseline", "batch_only", "popularity", "best")
WINDOW_CHOICES_S = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 7 * 86400)
MAX_WINDOWS = 12
PROGRESS_BLOCKS = 10
"""The training-progress curve cuts the scored rows, in step order, into this many blocks."""


def _empty() -> dict[str, np.ndarray]:
    return {c: np.zeros(0, dtype=np.float32 if c in FLOAT_COLUMNS else np.int64) for c in COLUMNS}


class PrequentialScores:
    """This rank's scored stream rows (see the module docstring)."""

    def __init__(self, max_rows: int, rank: int, world: int) -> None:
        self.max_rows, self.rank, self.world = max_rows, rank, world
        self.cols = _empty()
        self.seen = 0
        """Rows scored on this rank, kept or not."""
        self.live_from = 0
        """Index of the first row scored since the last export (the live model's window)."""
        self._pending: list[dict[str, np.ndarray]] = []

    def __len__(self) -> int:
        self._merge()
        return len(self.cols["label"])

    def add(self, label: np.ndarray, user: np.ndarray, event_us: np.ndarray, step: int = 0,
            **probs: np.ndarray | None) -> None:
        """One step's rows: their labels, users, event times, the step whose model scored them and
        each model's probabilities (`model` required; a model not given, or not scorable here, is NaN)."""
        n = len(label)
        if n == 0:
            return
        part = {"label": label, "user": user, "event_us": event_us, "step": np.full(n, step, dtype=np.int64)}
        for m in MODELS:
            p = probs.get(m)
            part[m] = np.full(n, np.nan) if p is None else p
        self._pending.append({c: np.asarray(part[c], dtype=self.cols[c].dtype) for c in COLUMNS})
        self.seen += n
        if sum(len(p["label"]) for p in self._pending) >= 4096:
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        self.cols = {c: np.concatenate([self.cols[c], *(p[c] for p in self._pending)]) for c in COLUMNS}
        self._pending = []
        over = len(self.cols["label"]) - self.max_rows
        if over > 0:
            self.cols = {c: v[over:] for c, v in self.cols.items()}
            self.live_from = max(0, self.live_from - over)

    def columns(self, since_live: bool = False) -> dict[str, np.ndarray]:
        self._merge()
        return {c: v[self.live_from:] for c, v in self.cols.items()} if since_live else dict(self.cols)

    def mark_live(self) -> None:
        """Start the next live window here (at an export)."""
        self._merge()
        self.live_from = len(self.cols["label"])

    def state_dict(self) -> dict[str, Any] | None:
        self._merge()
        if not self.seen:
            return None
        return {"version": STATE_VERSION, "columns": dict(self.cols), "seen": self.seen, "live_from": self.live_from}

    def load_rank_states(self, states: Sequence[dict[str, Any] | None]) -> None:
        """The records of the old ranks r with r % world == rank, in rank order."""
        mine = [s for r, s in enumerate(states) if r % self.world == self.rank and s is not None]
        self.cols, self.seen, self.live_from, self._pending = _empty(), 0, 0, []
        for s in mine:
            check_version("prequential scores", s, STATE_VERSION)
            self._pending.append({c: np.asarray(s["columns"][c], dtype=self.cols[c].dtype) for c in COLUMNS})
            self.seen += int(s["seen"])
        same = len(states) == self.world and len(mine) == 1
        self._merge()
        self.live_from = int(mine[0]["live_from"]) if same else 0


def gather_columns(gather: Any, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Collective: every rank's columns concatenated (rank order)."""
    everything = gather(cols)
    return {c: np.concatenate([e[c] for e in everything]) if everything else np.zeros(0) for c in COLUMNS}


def judge_columns(cols: dict[str, np.ndarray], seed: int = 0) -> EvalSet:
    """The prequential `EvalSet` of gathered columns (a model whose scores hold NaN is left out)."""
    probs = {m: cols[m].astype(np.float64) for m in MODELS}
    return judge(cols["label"].astype(np.float64), cols["user"], probs, seed=seed)


def window_seconds(span_s: float) -> int:
    """The shortest usual window that cuts `span_s` into at most MAX_WINDOWS windows."""
    for w in WINDOW_CHOICES_S:
        if span_s / w <= MAX_WINDOWS:
            return w
    return WINDOW_CHOICES_S[-1]


def windows(cols: dict[str, np.ndarray], seed: int = 0) -> list[WindowScores]:
    """The prequential scores per window of event time (aligned to the window length), oldest first."""
    ev = cols["event_us"]
    if not len(ev):
        return []
    lo, hi = int(ev.min()), int(ev.max())
    width_us = window_seconds(max((hi - lo) / 1e6, 1.0)) * 1_000_000
    first = lo - lo % width_us
    index = (ev - first) // width_us
    out = []
    for k in np.unique(index).tolist():
        sel = index == k
        start = first + k * width_us
        part = {c: v[sel] for c, v in cols.items()}
        out.append(WindowScores(start=_dt(start), end=_dt(start + width_us), scores=judge_columns(part, seed)))
    return out


def progress(cols: dict[str, np.ndarray], seed: int = 0) -> list[ProgressScores]:
    """The prequential scores in blocks of about equal rows in the order the model scored them
    (cut between steps): how the model improved as it trained, whatever order the stream came in."""
    steps = cols["step"]
    if not len(steps):
        return []
    order = np.argsort(steps, kind="stable")
    cuts = np.unique(np.searchsorted(steps[order], steps[order][np.linspace(0, len(steps), PROGRESS_BLOCKS + 1,
                                                                          dtype=int)[1:-1]]))
    out = []
    for part_idx in np.split(order, cuts):
        if not len(part_idx):
            continue
        part = {c: v[part_idx] for c, v in cols.items()}
        out.append(ProgressScores(first_step=int(part["step"].min()), last_step=int(part["step"].max()),
                                  scores=judge_columns(part, seed)))
    return out


def _dt(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, tz=UTC)
