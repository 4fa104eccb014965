"""One training job, described once, launched by any backend.

`TrainRequest` holds the knobs a person sets for a run (the `daily_retrain` DAG params; `KNOBS` is
the single table of their types, bounds and descriptions, from which the Airflow Params are built).
`TrainJobSpec` is the launch description: image, processes, resources, cache placement,
credentials. Its `torchrun_args()` is an argument *list* — never a shell string — that the local
backend runs as a subprocess and the Kubernetes backends put into a pod or a PyTorchJob.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any, Collection, Mapping

from slipstream.pipeline.cluster import ClusterSettings, SecretEnv, VolumeSource
from slipstream.errors import ConfigError
from slipstream.settings import BACKENDS, Settings

TRAINER_MODULE = "trainers.train"
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
OVERRIDE_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


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

    def json_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": self.type}
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
         "trained on before switching to the Kafka stream.", minimum=1, maximum=90),
    Knob("epochs", "integer", 1, "Passes over the Iceberg window before the stream phase.", minimum=1, maximum=50),
    Knob("stream_stop", "string", "caught_up", "Must be 'caught_up' or a whole number of seconds: "
         "when the Kafka phase after the handoff ends. 'caught_up' stops once the consumer lag is 0; "
         "N stops after N seconds of stream training; 0 skips the stream phase.",
         pattern=r"^(caught_up|[0-9]{1,6})$"),
    Knob("gpus", "integer", 0, "GPUs per node; one training process per GPU. 0 trains on CPU "
         "with cpu_processes processes (gloo).", minimum=0, maximum=16),
    Knob("nnodes", "integer", 1, "Nodes (Kubernetes backend). More than 1 launches a Kubeflow "
         "PyTorchJob with torchrun rendezvous across pods.", minimum=1, maximum=64),
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
)
KNOBS_BY_NAME = {k.name: k for k in KNOBS}


@dataclass(frozen=True, kw_only=True)
class TrainRequest:
    window_days: int = 7
    epochs: int = 1
    stream_stop: str = "caught_up"
    gpus: int = 0
    nnodes: int = 1
    cpu_processes: int = 2
    batch_size: int = 1024
    lr: float = 0.003
    replay_share: float = 0.2
    exchange: bool = False
    backend: str = "local"
    dry_run: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, KNOBS_BY_NAME[f.name].check(getattr(self, f.name)))
        if self.backend == "local" and self.nnodes > 1:
            raise ConfigError(f"nnodes={self.nnodes} needs backend=kubernetes; the local backend runs one node")

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
    def stream_seconds(self) -> int | None:
        """Seconds of stream phase, or None for "until caught up"."""
        return None if self.stream_stop == "caught_up" else int(self.stream_stop)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trainer_overrides(
    request: TrainRequest, *, run_id: str, snapshot_id: int | None, t_handoff: datetime
) -> dict[str, str]:
    """The `--set section.key=value` pairs the trainer gets (trainers/config.py names them); the
    only place in the orchestrator where the trainer's config keys appear."""
    out = {
        "run.run_id": run_id,
        "data.t_handoff": t_handoff.isoformat(),
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
    if snapshot_id is not None:
        out["data.snapshot_id"] = str(snapshot_id)
    return out


@dataclass(frozen=True, kw_only=True)
class TrainJobSpec:
    run_id: str
    image: str = ClusterSettings.trainer_image
    gpus: int = 0
    cpu_processes: int = 2
    nnodes: int = 1
    module: str = TRAINER_MODULE
    config_path: str = ""
    overrides: Mapping[str, str] = field(default_factory=dict)
    cpu: str = ClusterSettings.trainer_cpu
    memory: str = ClusterSettings.trainer_memory
    shm_size: str = ClusterSettings.shm_size
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: tuple[SecretEnv, ...] = ()
    cache_volume: VolumeSource | None = None
    cache_mount_path: str = ClusterSettings.cache_mount_path
    runs_volume: VolumeSource | None = None
    runs_mount_path: str = ClusterSettings.runs_mount_path
    node_selector: Mapping[str, str] = field(default_factory=dict)
    gpu_resource: str = ClusterSettings.gpu_resource
    gpu_toleration: str = ClusterSettings.gpu_toleration
    run_as_user: int = ClusterSettings.run_as_user
    rdzv_port: int = ClusterSettings.rdzv_port

    def __post_init__(self) -> None:
        if not RUN_ID_RE.match(self.run_id):
            raise ConfigError(
                f"run_id {self.run_id!r} must be 1-63 letters, digits, '.', '_' or '-' starting with a "
                "letter or digit (it names the run folder and the pods)"
            )
        for name, low in (("gpus", 0), ("cpu_processes", 1), ("nnodes", 1)):
            if getattr(self, name) < low:
                raise ConfigError(f"{name} must be >= {low}, got {getattr(self, name)}")
        for key, value in self.overrides.items():
            if not OVERRIDE_KEY_RE.match(key):
                raise ConfigError(f"trainer override key {key!r} must be a dotted identifier")
            if "\n" in str(value):
                raise ConfigError(f"trainer override {key} must be one line, got {value!r}")

    @property
    def nproc_per_node(self) -> int:
        return self.gpus if self.gpus > 0 else self.cpu_processes

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def k8s_name(self) -> str:
        """run_id as a DNS-1123 label (pod/job names): lowercase, '-' for anything else."""
        return re.sub(r"[^a-z0-9-]+", "-", self.run_id.lower()).strip("-")[:52] or "slipstream-train"

    def torchrun_args(self, *, rdzv_host: str | None = None) -> list[str]:
        """`torchrun ... -m trainers.train [--config F] [--set k=v ...]` as an argument list.

        One node uses `--standalone` (a private rendezvous on a free port, so two local runs never
        collide); several nodes meet at `rdzv_host:rdzv_port` (the PyTorchJob master).
        """
        args = ["torchrun", "--nnodes", str(self.nnodes), "--nproc-per-node", str(self.nproc_per_node)]
        if self.nnodes == 1:
            args.append("--standalone")
        else:
            if not rdzv_host:
                raise ConfigError(f"a {self.nnodes}-node job needs a rendezvous host (the PyTorchJob master)")
            args += [
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{rdzv_host}:{self.rdzv_port}",
                "--rdzv-id", self.k8s_name,
            ]
        args += ["-m", self.module]
        if self.config_path:
            args += ["--config", self.config_path]
        for key in sorted(self.overrides):
            args += ["--set", f"{key}={self.overrides[key]}"]
        return args

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (an XCom between the planning task and the launch)."""
        d = asdict(self)
        d["overrides"] = dict(self.overrides)
        d["env"] = dict(self.env)
        d["node_selector"] = dict(self.node_selector)
        d["secret_env"] = [asdict(s) for s in self.secret_env]
        d["cache_volume"] = str(self.cache_volume) if self.cache_volume else None
        d["runs_volume"] = str(self.runs_volume) if self.runs_volume else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainJobSpec":
        d = dict(d)
        d["secret_env"] = tuple(SecretEnv(**s) for s in d.get("secret_env") or ())
        for name in ("cache_volume", "runs_volume"):
            if d.get(name):
                d[name] = VolumeSource.parse(d[name], setting=name)
        return cls(**d)


def build_train_spec(
    settings: Settings,
    cluster: ClusterSettings,
    request: TrainRequest,
    *,
    run_id: str,
    snapshot_id: int | None,
    t_handoff: datetime,
    config_path: str = "",
    extra_overrides: Mapping[str, str] | None = None,
) -> TrainJobSpec:
    """The job spec of one run. Local runs see this machine's paths; pods see the mounted volumes."""
    overrides = trainer_overrides(request, run_id=run_id, snapshot_id=snapshot_id, t_handoff=t_handoff)
    env = settings.as_env()
    env["SLIPSTREAM_TRAINING_BACKEND"] = request.backend
    if request.backend == "kubernetes":
        # the worker's local folders mean nothing inside the pod
        for name in ("SLIPSTREAM_HOME", "SLIPSTREAM_RAW_DIR"):
            env.pop(name)
        env["SLIPSTREAM_CACHE_DIR"] = cluster.cache_mount_path
        if cluster.runs_volume:
            env["SLIPSTREAM_RUNS_DIR"] = cluster.runs_mount_path
    else:
        manifest = settings.home / "generator" / "manifest.json"
        if manifest.exists():  # the demo's generator knows the best achievable AUC
            overrides["data.generator_manifest"] = str(manifest)
    overrides["data.cache_dir"] = env["SLIPSTREAM_CACHE_DIR"]
    overrides.update(extra_overrides or {})
    return TrainJobSpec(
        run_id=run_id,
        image=cluster.trainer_image,
        module=cluster.trainer_module,
        gpus=request.gpus,
        cpu_processes=request.cpu_processes,
        nnodes=request.nnodes,
        config_path=config_path,
        overrides=overrides,
        cpu=cluster.trainer_cpu,
        memory=cluster.trainer_memory,
        shm_size=cluster.shm_size,
        env=env,
        secret_env=cluster.secret_env(),
        cache_volume=cluster.cache_volume_source(),
        cache_mount_path=cluster.cache_mount_path,
        runs_volume=cluster.runs_volume_source(),
        runs_mount_path=cluster.runs_mount_path,
        node_selector=cluster.node_selector_labels(),
        gpu_resource=cluster.gpu_resource,
        gpu_toleration=cluster.gpu_toleration,
        run_as_user=cluster.run_as_user,
        rdzv_port=cluster.rdzv_port,
    )


def warmup_args(*, table: str, window_days: int, end: datetime, snapshot_id: int | None, cache_dir: str) -> list[str]:
    """The cache warmup as an argument list, for a pod on the cache nodes."""
    args = [
        "python", "-m", "slipstream.cli", "cache", "warm",
        "--table", table,
        "--window-days", str(window_days),
        "--end", end.isoformat(),
        "--cache-dir", cache_dir,
    ]
    if snapshot_id is not None:
        args += ["--snapshot", str(snapshot_id)]
    return args
