"""One training job, described once, launched by any backend.

`TrainJobSpec` is the launch description of a planned run (`slipstream.pipeline.runplan`): the
path of its plan.json, image, processes, resources, cache placement, credentials. Its
`torchrun_args()` is an argument *list* — never a shell string — that the local backend runs as a
subprocess and the Kubernetes backends put into a pod or a PyTorchJob. What the job trains on and
with which knobs is in the plan, not in the command.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from slipstream.errors import ConfigError
from slipstream.pipeline import elastic
from slipstream.pipeline.cluster import ClusterSettings, SecretEnv, VolumeSource
from slipstream.pipeline.elastic import RDZV_CONF, check_bounds, rdzv_conf_arg
from slipstream.pipeline.runlayout import run_dir
from slipstream.pipeline.runplan import PLAN_FILE, RunPlan, plan_path
from slipstream.settings import Settings

TRAINER_MODULE = "trainers.train"
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LOOPBACK = "127.0.0.1"
K8S_NAME_MAX = 52
"""Pod and job names leave room for the suffixes Kubernetes and the training operator add."""
OVERRIDE_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


@dataclass(frozen=True, kw_only=True)
class TrainJobSpec:
    run_id: str
    plan_path: str = ""
    """The run's plan.json as the trainer sees it (`--plan`); empty: the trainer plans from --config/--set."""
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
    min_nodes: int | None = None
    """Elastic jobs: the fewest nodes the job trains on (None: nnodes)."""
    max_nodes: int | None = None
    """Elastic jobs: the most nodes that may join (None: nnodes). A job is elastic when its bounds differ."""
    max_restarts: int = 3
    """Elastic jobs: worker restarts torchrun allows each node after a failure or a node leaving
    (a node joining costs none)."""
    stop_grace_s: int = 60
    """Elastic jobs: seconds the workers have to reach a step boundary and commit a checkpoint
    after SIGTERM before torchrun kills them (`--shutdown-timeout`)."""

    def __post_init__(self) -> None:
        if not RUN_ID_RE.match(self.run_id):
            raise ConfigError(
                f"run_id {self.run_id!r} must be 1-128 letters, digits, '.', '_' or '-' starting with a "
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
        check_bounds(self.nnodes, *self.node_bounds)
        if self.max_restarts < 0 or self.stop_grace_s < 1:
            raise ConfigError(f"max_restarts must be >= 0 and stop_grace_s >= 1, got {self.max_restarts} and {self.stop_grace_s}")

    @property
    def node_bounds(self) -> tuple[int, int]:
        """(fewest, most) nodes of the job."""
        return (self.nnodes if self.min_nodes is None else self.min_nodes,
                self.nnodes if self.max_nodes is None else self.max_nodes)

    @property
    def elastic(self) -> bool:
        """Nodes may join and leave while it runs (`torchrun --nnodes MIN:MAX`)."""
        low, high = self.node_bounds
        return low != high

    @property
    def nproc_per_node(self) -> int:
        return self.gpus if self.gpus > 0 else self.cpu_processes

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def k8s_name(self) -> str:
        """run_id as a DNS-1123 label (pod/job names): lowercase, '-' for anything else; a long one
        keeps its head and ends with a hash of the whole id (two attempts never share a pod name)."""
        name = re.sub(r"[^a-z0-9-]+", "-", self.run_id.lower()).strip("-") or "slipstream-train"
        if len(name) <= K8S_NAME_MAX:
            return name
        digest = hashlib.sha1(self.run_id.encode()).hexdigest()[:8]
        return f"{name[: K8S_NAME_MAX - 9].rstrip('-')}-{digest}"

    def torchrun_args(self, *, rdzv_host: str | None = None, rdzv_port: int | None = None) -> list[str]:
        """`torchrun ... -m trainers.train [--plan P] [--config F] [--set k=v ...]` as an argument list.

        One node meets at a c10d rendezvous on 127.0.0.1 (`rdzv_port`: a free port the local
        launcher picked, so two local runs never collide; else SLIPSTREAM_RDZV_PORT, a pod's own
        network), with `--local-addr 127.0.0.1` so the workers meet there too — never
        `--standalone`, whose stores listen on every interface. Several nodes, or an elastic job,
        meet at `rdzv_host:rdzv_port` (the PyTorchJob's first pod; 127.0.0.1 and a free port on one
        machine). An elastic job runs `--nnodes MIN:MAX` with its restart budget, its grace for a
        graceful stop and the rendezvous timings of `slipstream.pipeline.elastic.RDZV_CONF`.
        """
        low, high = self.node_bounds
        nnodes = f"{low}:{high}" if self.elastic else str(self.nnodes)
        args = ["torchrun", "--nnodes", nnodes, "--nproc-per-node", str(self.nproc_per_node)]
        port = rdzv_port or self.rdzv_port
        if self.nnodes == 1 and not self.elastic:
            args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{LOOPBACK}:{port}", "--rdzv-id", self.k8s_name,
                     "--local-addr", LOOPBACK]
        else:
            if not rdzv_host:
                raise ConfigError(f"a {nnodes}-node job needs a rendezvous host (the PyTorchJob's first pod)")
            args += [
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{rdzv_host}:{port}",
                "--rdzv-id", self.k8s_name,
            ]
        if self.elastic:
            args += ["--rdzv-conf", rdzv_conf_arg(RDZV_CONF), "--max-restarts", str(self.max_restarts),
                     "--shutdown-timeout", str(self.stop_grace_s)]
        args += ["-m", self.module]
        if self.plan_path:
            args += ["--plan", self.plan_path]
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
    def from_dict(cls, d: Mapping[str, Any]) -> TrainJobSpec:
        d = dict(d)
        d["secret_env"] = tuple(SecretEnv(**s) for s in d.get("secret_env") or ())
        for name in ("cache_volume", "runs_volume"):
            if d.get(name):
                d[name] = VolumeSource.parse(d[name], setting=name)
        return cls(**d)


def trainer_cache_dir(settings: Settings, cluster: ClusterSettings, backend: str) -> str:
    """The cache folder as the trainer (and its warmup) see it: a pod's mount, or this machine's."""
    return cluster.cache_mount_path if backend == "kubernetes" else settings.cache_dir


def trainer_plan_path(settings: Settings, cluster: ClusterSettings, plan: RunPlan) -> str:
    """Where the trainer (and the warmup pod) read the run's plan.json: the run folder on this
    machine, or on the runs volume as a pod mounts it."""
    if plan.request is None or plan.request.backend != "kubernetes":
        return str(plan_path(run_dir(settings, plan.run_id)))
    if not cluster.runs_volume:
        raise ConfigError(
            f"run {plan.run_id}: a training pod reads the run's {PLAN_FILE} from the shared runs volume; set "
            "SLIPSTREAM_RUNS_VOLUME (e.g. pvc:slipstream-runs) and mount it on the Airflow workers at SLIPSTREAM_RUNS_DIR"
        )
    return f"{cluster.runs_mount_path.rstrip('/')}/{plan.run_id}/{PLAN_FILE}"


def build_train_spec(
    settings: Settings,
    cluster: ClusterSettings,
    plan: RunPlan,
    *,
    config_path: str = "",
    extra_overrides: Mapping[str, str] | None = None,
) -> TrainJobSpec:
    """The job spec of a planned run: `torchrun ... -m trainers.train --plan <plan.json>`; the
    trainer takes the run's ids, data and knobs from the plan. Local runs see this machine's
    paths; pods see the mounted volumes."""
    if plan.request is None:
        raise ConfigError(f"the plan of run {plan.run_id} has no request (the trainer planned it): launch it with --config")
    request = plan.request
    # the plan's dead-letter topic: the trainer's default is `<topic>.dlq`, the data set may name another
    overrides: dict[str, str] = {"data.dlq_topic": plan.dlq_topic}
    env = settings.as_env()
    env["SLIPSTREAM_TRAINING_BACKEND"] = request.backend
    secret_env = cluster.secret_env() if request.backend == "kubernetes" else ()
    if len(set(request.node_range)) > 1:
        # torch 2.14's agents share a store whose address a later rendezvous round never re-publishes:
        # a node joining a running job would wait for it until it timed out (slipstream.pipeline.elastic)
        env[elastic.SHARED_STORE_OFF[0]] = elastic.SHARED_STORE_OFF[1]
    if request.backend == "kubernetes":
        # the worker's local folders mean nothing inside the pod
        for name in ("SLIPSTREAM_HOME", "SLIPSTREAM_RAW_DIR", "SLIPSTREAM_SPECS_DIR"):
            env.pop(name, None)
        env["SLIPSTREAM_CACHE_DIR"] = cluster.cache_mount_path
        if cluster.runs_volume:
            env["SLIPSTREAM_RUNS_DIR"] = cluster.runs_mount_path
        for secret in secret_env:  # a Secret sets it: one env var of a name, never two
            env.pop(secret.env, None)
    else:
        manifest = settings.home / "generator" / "manifest.json"
        if manifest.exists():  # the demo's generator knows the best achievable AUC
            overrides["data.generator_manifest"] = str(manifest)
    overrides.update(extra_overrides or {})
    return TrainJobSpec(
        run_id=plan.run_id,
        plan_path=trainer_plan_path(settings, cluster, plan),
        image=cluster.trainer_image,
        module=cluster.trainer_module,
        gpus=request.gpus,
        cpu_processes=request.cpu_processes,
        nnodes=request.nnodes,
        min_nodes=request.min_nodes,
        max_nodes=request.max_nodes,
        max_restarts=request.max_restarts,
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


def warmup_args(plan_path: str) -> list[str]:
    """The cache warmup of a planned run as an argument list, for a pod on the cache nodes: it
    copies exactly the plan's files into the plan's cache folder."""
    return ["python", "-m", "slipstream.cli", "cache", "warm", "--plan", plan_path]


_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_WORKER_LOCAL_ENV = {
    "SLIPSTREAM_WAREHOUSE": "the warehouse",
    "SLIPSTREAM_KAFKA_BOOTSTRAP": "the Kafka bootstrap",
    "SLIPSTREAM_S3_ENDPOINT": "the S3 endpoint",
    "SLIPSTREAM_CATALOG_URI": "the Iceberg REST catalog",
    "SLIPSTREAM_REGISTRY": "the model registry",
}


def worker_local_values(spec: TrainJobSpec, plan: RunPlan | None = None) -> list[str]:
    """What a pod of `spec` would be handed that only means something on the Airflow worker that
    rendered it: a loopback address (`127.0.0.1`, `localhost`) or a local path (`file://`, `/...`)
    for the warehouse, the broker, the S3 endpoint, the catalog or the registry, the embedded
    SQLite catalog, and the plan's broker and data files. One sentence each, naming the variable
    and what to set instead; empty for a launch that runs here."""
    out: list[str] = []
    for name, what in _WORKER_LOCAL_ENV.items():
        value = str(spec.env.get(name, ""))
        if any(h in value for h in _LOOPBACK_HOSTS):
            out.append(f"{name}={value}: {what} is on this worker's loopback, which a pod cannot reach; "
                       "set it to an address the cluster resolves")
        elif value.startswith("file:") or value.startswith("/"):
            out.append(f"{name}={value}: {what} is a folder of this worker, which a pod does not mount; "
                       "use shared storage (s3://...)")
    if spec.env.get("SLIPSTREAM_CATALOG", "") == "local" and not spec.env.get("SLIPSTREAM_CATALOG_URI"):
        out.append("SLIPSTREAM_CATALOG=local: the embedded SQLite catalog lives in this worker's home; "
                   "use a catalog the pod can reach (SLIPSTREAM_CATALOG_URI or a named pyiceberg catalog)")
    if plan is not None:
        if any(h in plan.bootstrap for h in _LOOPBACK_HOSTS):
            out.append(f"the plan's Kafka bootstrap {plan.bootstrap} is this worker's loopback; "
                       "set SLIPSTREAM_KAFKA_BOOTSTRAP to the cluster's brokers and render a new plan")
        local = [f.path for f in plan.files if f.path.startswith("file:") or f.path.startswith("/")]
        if local:
            out.append(f"{len(local)} of the plan's {len(plan.files)} data files are on this worker's disk "
                       f"({local[0]}{' ...' if len(local) > 1 else ''}); a pod reads the warehouse, so put it on shared storage")
    return out
