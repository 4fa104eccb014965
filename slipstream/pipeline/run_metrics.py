"""`metrics.json`, the summary a training run leaves in its folder: one typed contract shared by
its writer (`trainers.finish`) and every reader (the model registry, the insight report, the
demo, the benches).

Every key is a field here, with its unit and meaning; the writer fills `RunMetrics` (a key it
does not declare is an error) and readers parse it (`read_run_metrics`) and use attributes, never
raw string keys. `version` changes when a field changes meaning; a file of an older version still
parses (what it lacks is None) and says so.

Every AUC is an `AucScore`: the point estimate with its 95% interval from a bootstrap over users
and the rows it was computed on (an `EvalSet` carries the rows, users and positives). The sets:

- `forward_tail`: the last part of the stream after T *by event time*, never trained; the final
  model, its baselines and the champion scored on it in the same step. The future: it decides
  promotion.
- `prequential`: every stream row scored by the model as it was just before the step that
  trained on it (test-then-train), by the logistic baseline updated online on the same rows in
  the same order, by item popularity counted online and by the frozen batch-only model.
- `holdout_after_t`: the hash hold-out (`slipstream.samples.schema.is_holdout`) among the
  stream rows before the forward tail, scored by the final model: interleaved with the rows it
  trained on (later rows of the same users), so *not* the future.
- `validation`: the validation days before T (never trained), scored by the final model.
- `holdout_before_t`: the hash hold-out of the batch window (interpolation).
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, ValidationError

from slipstream.errors import MetricsContractError
from slipstream.scoring import Estimate

METRICS_VERSION = 2
"""2: evaluation sets with row counts and intervals, prequential and forward tail (1: flat
`auc_after_t` & co. on the interleaved hold-out)."""

SetName = Literal["forward_tail", "prequential", "holdout_after_t", "validation", "holdout_before_t"]
SET_TITLES: dict[str, str] = {
    "forward_tail": "forward tail after T (the future: never trained)",
    "prequential": "stream after T, each row scored before it trained (prequential)",
    "holdout_after_t": "interleaved hold-out after T (not the future: the model trained on neighbouring rows)",
    "validation": "validation days before T (never trained)",
    "holdout_before_t": "hold-out before T (interpolation)",
}
"""What each evaluation set is, in words a summary prints."""


Time = Annotated[datetime, PlainSerializer(lambda t: t.isoformat(), return_type=str, when_used="json")]
"""A datetime written as Python's ISO text (`2026-11-04T00:00:00+00:00`), as every other file of a run."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True, ser_json_inf_nan="null")


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class AucScore(_Model):
    """One model's scores on one evaluation set."""

    auc: float | None = None
    """ROC AUC (0.5: chance); None when the set holds one class only."""
    lo: float | None = None
    """Lower bound of the 95% interval of `auc` (bootstrap over users; None: too few rows)."""
    hi: float | None = None
    """Upper bound of the 95% interval of `auc`."""
    logloss: float | None = None
    """Mean binary cross-entropy, nats per row."""

    @classmethod
    def of(cls, est: Estimate, logloss: float | None = None) -> AucScore:
        return cls(auc=_finite(est.value), lo=_finite(est.lo), hi=_finite(est.hi), logloss=_finite(logloss))

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None

    def text(self) -> str:
        """`0.6512 [0.6391, 0.6630]`, or `n/a`."""
        if self.auc is None:
            return "n/a"
        return f"{self.auc:.4f}" + (f" [{self.lo:.4f}, {self.hi:.4f}]" if self.has_interval else "")


class Difference(_Model):
    """AUC(a) − AUC(b) on the same rows, with its paired 95% interval (bootstrap over users)."""

    diff: float | None = None
    lo: float | None = None
    hi: float | None = None

    @classmethod
    def of(cls, est: Estimate) -> Difference:
        return cls(diff=_finite(est.value), lo=_finite(est.lo), hi=_finite(est.hi))

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None

    def text(self) -> str:
        if self.diff is None:
            return "n/a"
        return f"{self.diff:+.4f}" + (f" [{self.lo:+.4f}, {self.hi:+.4f}]" if self.has_interval else "")


class EvalSet(_Model):
    """One evaluation set: its rows and every model scored on exactly those rows."""

    rows: int = 0
    """Rows scored (all ranks)."""
    users: int = 0
    """Distinct users among them (the bootstrap's groups; rows when the spec names no user)."""
    positives: int = 0
    """Rows with label 1."""
    model: AucScore | None = None
    """The trained model (`prequential`: as it was before each row's step)."""
    baseline: AucScore | None = None
    """The logistic-regression baseline trained on the same rows as the model."""
    popularity: AucScore | None = None
    """Each item's smoothed click rate over the rows trained so far."""
    batch_only: AucScore | None = None
    """The model as it was at the handoff (before any stream row)."""
    champion: AucScore | None = None
    """The registry's champion, re-scored on these rows in the same step."""
    best: AucScore | None = None
    """The data generator's hidden click probability: the best any model can do (generated data only)."""
    vs_baseline: Difference | None = None
    """model − baseline."""
    vs_champion: Difference | None = None
    """model − champion."""
    vs_batch_only: Difference | None = None
    """model − batch-only: what the stream phase added (the stream lift)."""
    best_gap: Difference | None = None
    """best − model: what is left to learn, where the generator's truth is known."""

    @property
    def scored(self) -> bool:
        return self.rows > 0 and self.model is not None and self.model.auc is not None

    def best_is_informative(self) -> bool:
        """Show "best achievable" only where its interval is narrower than the gap it explains."""
        b, g = self.best, self.best_gap
        if b is None or g is None or not b.has_interval or g.diff is None:
            return False
        return (b.hi or 0.0) - (b.lo or 0.0) < abs(g.diff)


class WindowScores(_Model):
    """The prequential scores of one window of event time."""

    start: Time
    end: Time
    scores: EvalSet


class ProgressScores(_Model):
    """The prequential scores of the rows scored by the model after steps first_step..last_step."""

    first_step: int
    last_step: int
    scores: EvalSet


class EpochScores(_Model):
    """One batch epoch on the validation days."""

    epoch: int
    loss: float | None = None
    """Validation logloss of the model after this epoch (nats per row)."""
    auc: float | None = None
    baseline_loss: float | None = None
    baseline_auc: float | None = None


class Evaluation(_Model):
    """Every evaluation set of the run (None: the run had no such rows)."""

    forward_tail: EvalSet | None = None
    prequential: EvalSet | None = None
    holdout_after_t: EvalSet | None = None
    validation: EvalSet | None = None
    holdout_before_t: EvalSet | None = None
    prequential_windows: list[WindowScores] = Field(default_factory=list)
    """The prequential scores per window of event time, oldest first."""
    prequential_progress: list[ProgressScores] = Field(default_factory=list)
    """The prequential scores in blocks of rows in the order the model scored them: how it improved
    as it trained (a replay trains its buffered rows in random order of event time)."""
    prequential_kept: int = 0
    """Prequential rows kept for scoring (the newest, up to data.prequential_max_rows); `prequential.rows` are these."""
    prequential_seen: int = 0
    """Stream rows scored before training in the whole run (kept or not)."""
    champion_run_id: str | None = None
    champion_note: str | None = None
    """Why the champion was not re-scored (none yet, another feature spec, unreadable)."""
    truth_note: str | None = None
    """Where "best" comes from, or why there is none."""

    def get(self, name: str) -> EvalSet | None:
        value = getattr(self, name, None)
        return value if isinstance(value, EvalSet) else None


class Freshness(_Model):
    """How fresh the exported model was: from an event to a model that has trained on it."""

    exports: int = 0
    """Models exported by the run (continuous mode: one every data.stop.export_every_min)."""
    event_to_export_s_p50: float | None = None
    """Seconds from a trained row's event time to the export of the first model trained on it, median."""
    event_to_export_s_p99: float | None = None
    consume_to_train_ms_p50: float | None = None
    """Milliseconds from a record's consumption to the step that trained it, median."""
    consume_to_train_ms_p99: float | None = None
    live_prequential: EvalSet | None = None
    """The prequential scores of the rows since the previous export (the live model's quality)."""


class RunMetrics(_Model):
    """`<run_dir>/metrics.json`."""

    version: int = 1
    """The contract's version (METRICS_VERSION when written by this Slipstream; 1: an older file)."""
    run_id: str = ""
    snapshot_id: int | None = None
    """The Iceberg snapshot the batch window was read at."""
    t_handoff: Time | None = None
    """T: the batch window ends before it, the stream starts at it."""
    window_start: Time | None = None
    window_days: int | None = None
    train_end: Time | None = None
    """The batch phase trained rows before this (T minus the validation days)."""
    catalog: str | None = None
    namespace: str | None = None
    table: str | None = None
    kafka_bootstrap: str | None = None
    topic: str | None = None
    dlq_topic: str | None = None
    # what was trained (all ranks)
    samples_iceberg: int = 0
    """Batch rows trained, all epochs."""
    samples_kafka: int = 0
    """Fresh stream rows trained."""
    samples_replay: int = 0
    """Replayed rows trained in the stream phase (repeats of batch rows)."""
    dropped_before_t: int = 0
    """Stream records with event time before T (the batch trained them)."""
    dead_letters: int = 0
    holdout_stream: int = 0
    """Stream records held out by hash (never trained)."""
    forward_tail_stream: int = 0
    """Stream records in the forward tail (never trained)."""
    records_kafka: int = 0
    duplicates: int = 0
    """Stream records repeating a sample id admitted within data.dedupe_horizon_s: dead-lettered, not trained."""
    handoff_offsets: dict[str, int] = Field(default_factory=dict)
    handoff_methods: dict[str, str] = Field(default_factory=dict)
    final_offsets: dict[str, int] = Field(default_factory=dict)
    """Per partition, the next offset after what the run read."""
    stop_offsets: dict[str, int] | None = None
    """Per partition, the committed end when the stream phase stopped (the audit reads up to it;
    None: not recorded)."""
    stream_committed: int | None = None
    """Committed records in [handoff_offsets, stop_offsets), counted by a fresh reader (the stream audit)."""
    stream_verified: bool = False
    """The stream audit found every committed record trained, held out or rejected (a run it does not is stopped)."""
    # the headline
    auc: float | None = None
    """The headline AUC: of `auc_on`'s set (the forward tail when the run has one)."""
    auc_lo: float | None = None
    auc_hi: float | None = None
    auc_rows: int = 0
    logloss: float | None = None
    baseline_auc: float | None = None
    """The logistic baseline's AUC on the headline set."""
    auc_on: SetName | None = None
    evaluation: Evaluation = Field(default_factory=Evaluation)
    forward_tail_start: Time | None = None
    """Stream rows with event time at or after this are the forward tail: never trained (None: no tail)."""
    validation_curve: list[EpochScores] = Field(default_factory=list)
    chosen_epoch: int | None = None
    epochs_run: int = 0
    stopped_early: bool = False
    # freshness and speed
    freshness: Freshness = Field(default_factory=Freshness)
    samples_per_s: float | None = None
    """Rows trained per second of training time (all ranks)."""
    data_wait_share: float | None = None
    """Share of training time spent waiting for data."""
    newest_event_time: Time | None = None
    kafka_lag_at_stop: int | None = None
    latency_consume_to_train_ms_p50: float | None = None
    latency_consume_to_train_ms_p99: float | None = None
    drift_excess: float | None = None
    """The drift gauge at the end: relative excess of fresh over reference loss."""
    drift_level: float | None = None
    """Where the gauge put the shared stream rate, 0 (batch rate) to 1 (optim.stream_lr)."""
    drift_new_user_share: float | None = None
    exchange: bool = False
    exchange_s: float | None = None
    exchanged_rows: int = 0
    stop_reason: str = ""
    step: int = 0
    epochs: int | None = None
    validation_days: float | None = None
    world_size: int = 1
    device: str | None = None
    backend: str | None = None
    amp: bool = False
    wall_s: float | None = None
    trained_this_process: int = 0
    checkpoint: str | None = None
    export: str | None = None
    cache: dict[str, float] | None = None
    """The cache reader's statistics (None: files read directly)."""
    id_tables: dict[str, dict[str, Any]] | None = None
    """Per managed id table's feature: its counts and the new-at-T ids' share and AUCs on the
    interleaved hold-out after T (`trainers.eval.new_ids`; None: no managed table)."""

    @property
    def headline(self) -> EvalSet | None:
        return self.evaluation.get(self.auc_on) if self.auc_on else None

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (NaN as null, datetimes as ISO text)."""
        out: dict[str, Any] = json.loads(self.model_dump_json())
        return out


def build_run_metrics(values: dict[str, Any]) -> RunMetrics:
    """The writer's check: every key is declared, every value fits its field."""
    unknown = sorted(set(values) - set(RunMetrics.model_fields))
    if unknown:
        raise MetricsContractError(f"metrics.json keys not in the contract (slipstream.pipeline.run_metrics): {unknown}")
    try:
        return RunMetrics.model_validate({**values, "version": METRICS_VERSION})
    except ValidationError as e:
        raise MetricsContractError(f"metrics.json does not fit its contract: {e}") from None


def parse_run_metrics(data: Any, where: str = "metrics.json") -> RunMetrics:
    try:
        return RunMetrics.model_validate(data)
    except ValidationError as e:
        raise MetricsContractError(f"{where} does not fit the metrics contract (slipstream.pipeline.run_metrics): {e}") from None


def read_run_metrics(path: Path) -> RunMetrics:
    """Parse `<run_dir>/metrics.json` (a folder: its metrics.json)."""
    path = path / "metrics.json" if path.is_dir() else path
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise MetricsContractError(f"{path} not found: the training run did not finish; see its log") from None
    except json.JSONDecodeError as e:
        raise MetricsContractError(f"{path} is not valid JSON ({e}): re-run the training") from None
    return parse_run_metrics(data, str(path))
