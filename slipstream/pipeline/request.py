"""What a person asks of a training run: the knobs of `daily_retrain` (and `stream_train`).

`KNOBS` is the single table of their types, bounds and descriptions, from which the Airflow Params
are built; `TrainRequest` holds one run's values, checked against the same bounds (a run created
through the API skips the form's validation). A run's plan records its request
(`slipstream.pipeline.runplan`), and `trainer_overrides` turns it into the trainer's settings.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from slipstream.errors import ConfigError
from slipstream.settings import BACKENDS

MAX_WINDOW_DAYS = 3650
"""A sanity bound (ten years of days), not a tuning: the window is the data set's choice."""


@dataclass(frozen=True)
class Knob:
    """One user-settable knob of a training run, as a JSON-schema property.

    `title`, `section` and `unit` are how the trigger form shows it: a title in words, grouped
    under its section, with its bounds and unit written into its description (`help_text`)."""

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
    title: str = ""
    """The knob in words, as the trigger form titles it ("Learning rate")."""
    section: str = ""
    """The trigger form's section that holds it."""
    unit: str = ""
    """What one of its values counts ("days", "samples"), said with its bounds."""
    trainer_key: str = ""
    """The trainer config's dotted key this knob sets (`data.batch_size`): the trainer's field takes
    its default and bounds from here (`trainers.config.schema`), so the two cannot disagree."""

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

    def bounds_text(self) -> str:
        """Its type, bounds and unit in words: "A whole number of days from 1 to 3650"."""
        unit = f" of {self.unit}" if self.unit else ""
        if self.enum is not None:
            return f"One of: {', '.join(self.enum)}"
        if self.type == "boolean":
            return "On or off"
        if self.type == "string":
            return ""  # a pattern's meaning is in the description, in words
        what = ("A whole number" if self.type == "integer" else "A number") + unit
        low = (f"greater than {_num(self.exclusive_minimum)}" if self.exclusive_minimum is not None
               else f"at least {_num(self.minimum)}" if self.minimum is not None else "")
        high = f"at most {_num(self.maximum)}" if self.maximum is not None else ""
        if self.minimum is not None and self.maximum is not None and self.exclusive_minimum is None:
            return f"{what} from {_num(self.minimum)} to {_num(self.maximum)}"
        return " ".join(x for x in (what, ", ".join(b for b in (low, high) if b)) if x)

    def help_text(self, description: str | None = None, default: Any = None) -> str:
        """The description the trigger form shows: what it does (`description`: a DAG's own words),
        then its bounds, unit and default (`default`: a DAG's own, else the knob's)."""
        value = self.default if default is None else default
        shown = "empty" if value is None else str(value).lower() if isinstance(value, bool) \
            else _num(value) if isinstance(value, (int, float)) else value
        bounds = self.bounds_text() + ("; may be empty" if self.nullable else "")
        return f"{description or self.description}{' ' + bounds + '.' if bounds else ''} Default: {shown}."

    def check(self, value: Any, name: str = "") -> Any:
        """The value converted to the knob's type, or a ConfigError naming the knob (`name`: as the
        caller knows it, e.g. `data.batch_size`) and its bounds."""
        if name and name != self.name:
            try:
                return replace(self, name=name).check(value)
            except ConfigError as e:
                raise ConfigError(f"{e} (the {self.name!r} param)") from None
        if value is None and self.nullable:
            return None
        if self.type == "integer" and isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON-schema counts 5.0 as an integer; forms may send it so
        if not _of_type(value, self.type):
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


_TYPES: dict[str, type | tuple[type, ...]] = {"integer": int, "number": (int, float), "boolean": bool, "string": str}
"""The Python types each JSON-schema type of a knob accepts."""


def _of_type(value: Any, type_name: str) -> bool:
    """Whether `value` is of the knob type `type_name` (a bool is no number)."""
    return isinstance(value, _TYPES[type_name]) and (type_name == "boolean" or not isinstance(value, bool))


def _num(value: float | None) -> str:
    """3.0 -> '3', 0.003 -> '0.003', 65536 -> '65536'."""
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


DATA, TRAINING, STREAM, RESOURCES, GATE, RUN = (
    "Data window", "Training", "Stream phase", "Resources", "Quality gate", "Run")
"""The trigger form's sections, in the order it shows them (the order of KNOBS)."""

KNOBS: tuple[Knob, ...] = (
    Knob("window_days", "integer", 7, "Days of Iceberg history (ending at T, the data interval's end) "
         "trained on before switching to the Kafka stream. Days without data in it are skipped.",
         minimum=1, maximum=MAX_WINDOW_DAYS, title="Training window", section=DATA, unit="days",
         trainer_key="data.window_days"),
    Knob("epochs", "integer", 10, "At most this many passes over the Iceberg window; the validation day "
         "before T stops it earlier (the epoch with the lowest validation loss is kept).", minimum=1, maximum=50,
         title="Epochs (at most)", section=TRAINING, unit="passes over the window", trainer_key="data.epochs"),
    Knob("batch_size", "integer", 1024, "Samples per step per training process.", minimum=8, maximum=65_536,
         title="Batch size", section=TRAINING, unit="samples per process", trainer_key="data.batch_size"),
    Knob("lr", "number", 0.003, "Learning rate of the optimizer (Adam by default).", exclusive_minimum=0.0, maximum=1.0,
         title="Learning rate", section=TRAINING, trainer_key="optim.lr"),
    Knob("stream_stop", "string", "caught_up", "Must be 'caught_up' or a whole number of seconds (0 to 999999): "
         "when the Kafka phase after the handoff ends. 'caught_up' stops once the consumer lag is 0; "
         "N stops after N seconds of stream training; 0 skips the stream phase.",
         pattern=r"^(caught_up|[0-9]{1,6})$", title="Stop the stream phase", section=STREAM, unit="seconds"),
    Knob("replay_share", "number", 0.2, "Share of each stream-phase batch replayed from the Iceberg "
         "window (0.2: a fifth of each batch), against forgetting.", minimum=0.0, maximum=0.9, title="Replay share",
         section=STREAM, trainer_key="data.replay_share"),
    Knob("exchange", "boolean", False, "Stream phase: exchange fresh rows between training processes "
         "(all-to-all) so every process's batches mix all Kafka partitions, not only the ones it reads.",
         title="Exchange fresh rows", section=STREAM, trainer_key="data.exchange"),
    Knob("backend", "string", "local", "Where training runs: a local torchrun subprocess, or "
         "Kubernetes (a pod, or a PyTorchJob when nnodes > 1).", enum=BACKENDS, title="Backend", section=RESOURCES),
    Knob("gpus", "integer", 0, "GPUs per node; one training process per GPU. 0 trains on CPU "
         "with cpu_processes processes (gloo).", minimum=0, maximum=16, title="GPUs per node", section=RESOURCES,
         unit="GPUs"),
    Knob("cpu_processes", "integer", 2, "Training processes per node when gpus is 0.", minimum=1, maximum=16,
         title="CPU processes per node", section=RESOURCES, unit="processes"),
    Knob("nnodes", "integer", 1, "Nodes (Kubernetes backend). More than 1 launches a Kubeflow "
         "PyTorchJob with torchrun rendezvous across pods.", minimum=1, maximum=64, title="Nodes", section=RESOURCES,
         unit="nodes"),
    Knob("min_nodes", "integer", None, "Elastic training: the fewest nodes the job goes on with when "
         "nodes leave; empty for nnodes. A job whose min_nodes and max_nodes differ is elastic.",
         minimum=1, maximum=64, nullable=True, title="Fewest nodes (elastic)", section=RESOURCES, unit="nodes"),
    Knob("max_nodes", "integer", None, "Elastic training: the most nodes that may join the running job "
         "(on the local backend, with `slipstream elastic join`); empty for nnodes.", minimum=1, maximum=64,
         nullable=True, title="Most nodes (elastic)", section=RESOURCES, unit="nodes"),
    Knob("max_restarts", "integer", 3, "Elastic training: how often torchrun may restart a node's workers "
         "after a failure or another node leaving (a node joining does not count).", minimum=0, maximum=100,
         title="Restarts (elastic)", section=RESOURCES, unit="restarts"),
    Knob("gate_ctr_min", "number", None, "This run's lowest allowed label rate (CTR) of a day or "
         "window; empty for the data set's (learned from its history, else its spec's).",
         minimum=0.0, maximum=1.0, nullable=True, title="Lowest CTR", section=GATE, unit="labels per row"),
    Knob("gate_ctr_max", "number", None, "This run's highest allowed label rate (CTR); empty for the "
         "data set's.", minimum=0.0, maximum=1.0, nullable=True, title="Highest CTR", section=GATE,
         unit="labels per row"),
    Knob("gate_rows_ratio_min", "number", None, "This run's lowest allowed ratio of a day's rows to the "
         "rows expected of it (its history's median); empty for the data set's.", minimum=0.0, maximum=1000.0,
         nullable=True, title="Lowest row-count ratio", section=GATE, unit="times the rows expected"),
    Knob("gate_rows_ratio_max", "number", None, "This run's highest allowed ratio of a day's rows to the "
         "rows expected of it; empty for the data set's.", exclusive_minimum=0.0, maximum=1000.0, nullable=True,
         title="Highest row-count ratio", section=GATE, unit="times the rows expected"),
    Knob("dry_run", "boolean", False, "Skip training and publishing: the data steps run, and the "
         "launch task writes the exact command, pod or PyTorchJob it would start into its log and XCom.",
         title="Dry run", section=RUN),
)
KNOBS_BY_NAME = {k.name: k for k in KNOBS}
GATE_KNOBS = ("gate_ctr_min", "gate_ctr_max", "gate_rows_ratio_min", "gate_rows_ratio_max")
TRAINER_KNOBS = {k.trainer_key: k for k in KNOBS if k.trainer_key}
"""The knobs that set a trainer config field, by its dotted key."""


def _default(name: str) -> Any:
    return KNOBS_BY_NAME[name].default
"""The quality gate's per-run bounds (`slipstream.quality.bounds.GateOverrides`)."""


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    """One run's values of the knobs (each field's default is its knob's)."""

    window_days: int = field(default=_default("window_days"))
    epochs: int = field(default=_default("epochs"))
    stream_stop: str = field(default=_default("stream_stop"))
    gpus: int = field(default=_default("gpus"))
    nnodes: int = field(default=_default("nnodes"))
    min_nodes: int | None = field(default=_default("min_nodes"))
    max_nodes: int | None = field(default=_default("max_nodes"))
    max_restarts: int = field(default=_default("max_restarts"))
    cpu_processes: int = field(default=_default("cpu_processes"))
    batch_size: int = field(default=_default("batch_size"))
    lr: float = field(default=_default("lr"))
    replay_share: float = field(default=_default("replay_share"))
    exchange: bool = field(default=_default("exchange"))
    backend: str = field(default=_default("backend"))
    dry_run: bool = field(default=_default("dry_run"))
    gate_ctr_min: float | None = field(default=_default("gate_ctr_min"))
    gate_ctr_max: float | None = field(default=_default("gate_ctr_max"))
    gate_rows_ratio_min: float | None = field(default=_default("gate_rows_ratio_min"))
    gate_rows_ratio_max: float | None = field(default=_default("gate_rows_ratio_max"))

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
    def from_params(cls, params: Mapping[str, Any], other_params: Collection[str] = ()) -> TrainRequest:
        """From DAG params (or any mapping); missing keys take defaults. A key that is neither a knob
        nor one of the DAG's `other_params` is refused with the valid names: a misspelt key
        (`learning_rate` for `lr`) would otherwise be ignored and the run train with the default."""
        names = {f.name for f in fields(cls)}
        problem = unknown_keys_message(params, names | set(other_params))
        if problem:
            raise ConfigError(problem)
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


def unknown_keys_message(conf: Collection[str], valid: Collection[str]) -> str:
    """'' when every key of a run's conf is a valid name; else one line naming the unknown keys, the
    near miss of each, and every valid name (what the API refuses a trigger with, and what the
    first task fails with when the trigger did not pass the API)."""
    unknown = sorted(set(conf) - set(valid))
    if not unknown:
        return ""
    names = sorted(valid)
    # a knob is also found by its title in words: `learning_rate` is the "Learning rate", `lr`
    by_title = {re.sub(r"\W+", "_", re.sub(r"\(.*?\)", "", k.title)).strip("_").lower(): k.name
                for k in KNOBS if k.title and k.name in valid}
    candidates = {**by_title, **{n: n for n in names}}
    near = {k: difflib.get_close_matches(k.lower(), list(candidates), n=1, cutoff=0.6) for k in unknown}
    hints = "".join(f" ({k!r}: did you mean {candidates[m[0]]!r}?)" for k, m in near.items() if m)
    return (f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} in the run's "
            f"conf{hints}; the valid names are: {', '.join(names)}")


def trainer_overrides(request: TrainRequest) -> dict[str, Any]:
    """The request's knobs as the trainer config's dotted keys and typed values (the knobs name the
    keys: `Knob.trainer_key`): how the trainer applies a plan's request. A run's ids, snapshot and
    window are not knobs: the trainer takes them from the plan."""
    out: dict[str, Any] = {key: getattr(request, k.name) for key, k in TRAINER_KNOBS.items()}
    seconds = request.stream_seconds
    if seconds is None:
        out["data.stop.mode"] = "caught_up"
    elif seconds == 0:
        out["data.stream"] = False
    else:
        out["data.stop.mode"] = "duration"
        out["data.stop.duration_s"] = float(seconds)
    return out


def knobs_markdown() -> str:
    """The params table of docs/params.md, from the knobs (a test keeps the page equal to it)."""
    rows = ["| param | title | section | type, bounds | default | trainer key | meaning |",
            "|---|---|---|---|---|---|---|"]
    for k in KNOBS:
        bounds = k.bounds_text() or (k.description.split(":")[0] if k.pattern else k.type)
        default = "empty" if k.default is None else str(k.default).lower() if isinstance(k.default, bool) else (
            _num(k.default) if isinstance(k.default, (int, float)) else f"`{k.default}`")
        rows.append(f"| `{k.name}` | {k.title} | {k.section} | {bounds}{'; may be empty' if k.nullable else ''} | "
                    f"{default} | {f'`{k.trainer_key}`' if k.trainer_key else ''} | {k.description} |")
    return "\n".join(rows) + "\n"
