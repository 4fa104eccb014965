"""What a person asks of a training run: the knobs of `daily_retrain` (and `stream_train`).

`KNOBS` is the single table of their types, bounds and descriptions, from which the Airflow Params
are built; `TrainRequest` holds one run's values, checked against the same bounds (a run created
through the API skips the form's validation). A run's plan records its request
(`slipstream.pipeline.runplan`), and `trainer_overrides` turns it into the trainer's settings.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Collection, Mapping

from slipstream.errors import ConfigError
from slipstream.settings import BACKENDS

MAX_WINDOW_DAYS = 3650
"""A sanity bound (ten years of days), not a tuning: the window is the data set's choice."""


@dataclass(frozen=True)
class Knob:
    """One user-settable knob of a training run, as a JSON-schema property."""

    name: str
    type: str  # JSON-schema type: integer | number | boolean | string
    default: Any
    description: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    """A regular expression a string value must match (JSON-schema `pattern`)."""
    nullable: bool = False
    """None (null, an empty form field) is a value: "not set"."""

    def json_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": [self.type, "null"] if self.nullable else self.type}
        for key, value in (
            ("minimum", self.minimum),
            ("maximum", self.maximum),
            ("exclusiveMinimum", self.exclusive_minimum),
        ):
            if value is not None:
                schema[key] = value
        if self.enum is not None:
            schema["enum"] = list(self.enum)
        if self.pattern is not None:
            schema["pattern"] = self.pattern
        return schema

    def check(self, value: Any) -> Any:
        """The value converted to the knob's type, or a ConfigError naming the knob and its bounds."""
        if value is None and self.nullable:
            return None
        if self.type == "integer" and isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON-schema counts 5.0 as an integer; forms may send it so
        expect = {"integer": int, "number": (int, float), "boolean": bool, "string": str}[self.type]
        if isinstance(value, bool) and self.type != "boolean" or not isinstance(value, expect):
            raise ConfigError(f"{self.name} must be {self.type}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{self.name} must be >= {self.minimum}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(f"{self.name} must be <= {self.maximum}, got {value!r}")
        if self.exclusive_minimum is not None and value <= self.exclusive_minimum:
            raise ConfigError(f"{self.name} must be > {self.exclusive_minimum}, got {value!r}")
        if self.enum is not None and value not in self.enum:
            raise ConfigError(f"{self.name} must be one of {', '.join(self.enum)}, got {value!r}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise ConfigError(f"{self.name} {self.description.split(':')[0].lower()}, got {value!r}")
        return float(value) if self.type == "number" else value


KNOBS: tuple[Knob, ...] = (
    Knob("window_days", "integer", 7, "Days of Iceberg history (ending at the data interval's end) "
         "trained on before switching to the Kafka stream. Days without data in it are skipped.",
         minimum=1, maximum=MAX_WINDOW_DAYS),
    Knob("epochs", "integer", 10, "At most this many passes over the Iceberg window; the validation day "
         "before T stops it earlier (the epoch with the lowest validation loss is kept).", minimum=1, maximum=50),
    Knob("stream_stop", "string", "caught_up", "Must be 'caught_up' or a whole number of seconds: "
         "when the Kafka phase after the handoff ends. 'caught_up' stops once the consumer lag is 0; "
         "N stops after N seconds of stream training; 0 skips the stream phase.",
         pattern=r"^(caught_up|[0-9]{1,6})$"),
    Knob("gpus", "integer", 0, "GPUs per node; one training process per GPU. 0 trains on CPU "
         "with cpu_processes processes (gloo).", minimum=0, maximum=16),
    Knob("nnodes", "integer", 1, "Nodes (Kubernetes backend). More than 1 launches a Kubeflow "
         "PyTorchJob with torchrun rendezvous across pods.", minimum=1, maximum=64),
    Knob("min_nodes", "integer", None, "Elastic training: the fewest nodes the job goes on with when "
         "nodes leave; empty for nnodes. A job whose min_nodes and max_nodes differ is elastic.",
         minimum=1, maximum=64, nullable=True),
    Knob("max_nodes", "integer", None, "Elastic training: the most nodes that may join the running job "
         "(on the local backend, with `slipstream elastic join`); empty for nnodes.", minimum=1, maximum=64,
         nullable=True),
    Knob("max_restarts", "integer", 3, "Elastic training: how often torchrun may restart a node's workers "
         "after a failure or another node leaving (a node joining does not count).", minimum=0, maximum=100),
    Knob("cpu_processes", "integer", 2, "Training processes per node when gpus is 0.", minimum=1, maximum=16),
    Knob("batch_size", "integer", 1024, "Samples per step per process.", minimum=8, maximum=65_536),
    Knob("lr", "number", 0.003, "Learning rate of the optimizer (Adam by default).", exclusive_minimum=0.0, maximum=1.0),
    Knob("replay_share", "number", 0.2, "Share of each stream-phase batch replayed from the Iceberg "
         "window (guards against forgetting).", minimum=0.0, maximum=0.9),
    Knob("exchange", "boolean", False, "Stream phase: exchange fresh rows between training processes "
         "(all-to-all) so every process's batches mix all Kafka partitions, not only the ones it reads."),
    Knob("backend", "string", "local", "Where training runs: a local torchrun subprocess, or "
         "Kubernetes (a pod, or a PyTorchJob when nnodes > 1).", enum=BACKENDS),
    Knob("dry_run", "boolean", False, "Skip training and publishing: the data steps run, the "
         "training command is rendered into the run summary and the XCom, nothing is trained."),
    Knob("gate_ctr_min", "number", None, "Quality gate: this run's lowest allowed label rate (CTR) "
         "of a day or window; empty for the data set's (learned from its history, else its spec's).",
         minimum=0.0, maximum=1.0, nullable=True),
    Knob("gate_ctr_max", "number", None, "Quality gate: this run's highest allowed label rate (CTR); "
         "empty for the data set's.", minimum=0.0, maximum=1.0, nullable=True),
    Knob("gate_rows_ratio_min", "number", None, "Quality gate: this run's lowest allowed ratio of a "
         "day's rows to the trailing days' mean; empty for the data set's.", minimum=0.0, maximum=1000.0, nullable=True),
    Knob("gate_rows_ratio_max", "number", None, "Quality gate: this run's highest allowed ratio of a "
         "day's rows to the trailing days' mean; empty for the data set's.", exclusive_minimum=0.0, maximum=1000.0,
         nullable=True),
)
KNOBS_BY_NAME = {k.name: k for k in KNOBS}
GATE_KNOBS = ("gate_ctr_min", "gate_ctr_max", "gate_rows_ratio_min", "gate_rows_ratio_max")
"""The quality gate's per-run bounds (`slipstream.quality.bounds.GateOverrides`)."""


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    window_days: int = 7
    epochs: int = 10
    stream_stop: str = "caught_up"
    gpus: int = 0
    nnodes: int = 1
    min_nodes: int | None = None
    max_nodes: int | None = None
    max_restarts: int = 3
    cpu_processes: int = 2
    batch_size: int = 1024
    lr: float = 0.003
    replay_share: float = 0.2
    exchange: bool = False
    backend: str = "local"
    dry_run: bool = False
    gate_ctr_min: float | None = None
    gate_ctr_max: float | None = None
    gate_rows_ratio_min: float | None = None
    gate_rows_ratio_max: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, KNOBS_BY_NAME[f.name].check(getattr(self, f.name)))
        if self.backend == "local" and self.nnodes > 1:
            raise ConfigError(f"nnodes={self.nnodes} needs backend=kubernetes; the local backend runs one node "
                              "(set max_nodes for an elastic job that other launchers of this machine join)")
        low, high = self.node_range
        if not low <= self.nnodes <= high:
            raise ConfigError(f"min_nodes <= nnodes <= max_nodes must hold, got {low}, {self.nnodes}, {high}")
        for lo, hi in (("gate_ctr_min", "gate_ctr_max"), ("gate_rows_ratio_min", "gate_rows_ratio_max")):
            a, b = getattr(self, lo), getattr(self, hi)
            if a is not None and b is not None and not a < b:
                raise ConfigError(f"{lo} must be < {hi}, got {a} and {b}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any], other_params: Collection[str] = ()) -> "TrainRequest":
        """From DAG params (or any mapping); missing keys take defaults. A key that is neither a knob
        nor one of the DAG's `other_params` is refused with the valid names: a misspelt key
        (`learning_rate` for `lr`) would otherwise be ignored and the run train with the default."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - names - set(other_params))
        if unknown:
            valid = sorted(names | set(other_params))
            near = {k: difflib.get_close_matches(k, valid, n=1, cutoff=0.6) for k in unknown}
            hints = "".join(f" ({k!r}: did you mean {m[0]!r}?)" for k, m in near.items() if m)
            raise ConfigError(
                f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} in the run's "
                f"conf{hints}; the valid names are: {', '.join(valid)}"
            )
        return cls(**{k: v for k, v in params.items() if k in names})

    @property
    def node_range(self) -> tuple[int, int]:
        """(fewest, most) nodes: an elastic job's bounds, (nnodes, nnodes) for a fixed one."""
        return (self.nnodes if self.min_nodes is None else self.min_nodes,
                self.nnodes if self.max_nodes is None else self.max_nodes)

    @property
    def stream_seconds(self) -> int | None:
        """Seconds of stream phase, or None for "until caught up"."""
        return None if self.stream_stop == "caught_up" else int(self.stream_stop)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trainer_overrides(request: TrainRequest) -> dict[str, str]:
    """The request's knobs as the trainer's `--set section.key=value` pairs (trainers/config/schema.py
    names the keys): how the trainer applies a plan's request, and the only place outside
    `trainers/` where those keys appear. A run's ids, snapshot and window are not knobs: the
    trainer takes them from the plan."""
    out = {
        "data.window_days": str(request.window_days),
        "data.epochs": str(request.epochs),
        "data.batch_size": str(request.batch_size),
        "data.replay_share": repr(request.replay_share),
        "optim.lr": repr(request.lr),
    }
    if request.exchange:
        out["data.exchange"] = "true"
    seconds = request.stream_seconds
    if seconds is None:
        out["data.stop.mode"] = "caught_up"
    elif seconds == 0:
        out["data.stream"] = "false"
    else:
        out["data.stop.mode"] = "duration"
        out["data.stop.duration_s"] = str(seconds)
    return out
