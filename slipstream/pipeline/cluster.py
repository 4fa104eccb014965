"""Where training runs on a Kubernetes cluster: image, namespace, GPUs, cache nodes, credentials.

Parsed once from `SLIPSTREAM_*` environment variables at the orchestration edge, like
`slipstream.settings.Settings`, and handed to the job-spec builder. Only the *names* of Kubernetes
Secrets live here; the credentials themselves reach the pod as `secretKeyRef` env vars and are
never read by Airflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slipstream.env_settings import env_names, settings_from_env
from slipstream.errors import ConfigError

VOLUME_KINDS = ("hostPath", "pvc")


@dataclass(frozen=True)
class VolumeSource:
    """A volume the training pod mounts: `hostPath:/path` or `pvc:claim-name`."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in VOLUME_KINDS:
            raise ConfigError(f"volume kind must be one of {', '.join(VOLUME_KINDS)}, got {self.kind!r}")
        if not self.source:
            raise ConfigError(f"a {self.kind} volume needs a {'path' if self.kind == 'hostPath' else 'claim name'}")

    @classmethod
    def parse(cls, text: str, *, setting: str) -> VolumeSource:
        kind, sep, source = text.partition(":")
        if not sep:
            raise ConfigError(f"{setting} must look like 'hostPath:/var/cache/x' or 'pvc:claim-name', got {text!r}")
        return cls(kind, source)

    def __str__(self) -> str:
        return f"{self.kind}:{self.source}"


@dataclass(frozen=True)
class SecretEnv:
    """An env var of the training container filled from a key of a Kubernetes Secret."""

    env: str
    secret: str
    key: str


def parse_labels(text: str, *, setting: str) -> dict[str, str]:
    """`a=b,c=d` → {"a": "b", "c": "d"}; an empty string is no labels."""
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ConfigError(f"{setting} must be comma-separated key=value labels, got {part!r} in {text!r}")
        labels[key.strip()] = value.strip()
    return labels


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    trainer_image: str = "slipstream-trainer:0.1.0"
    """SLIPSTREAM_TRAINER_IMAGE: image holding `trainers/` and `slipstream/` (the repo Dockerfile)."""

    trainer_module: str = "trainers.train"
    """SLIPSTREAM_TRAINER_MODULE: the module torchrun runs (`-m`); tests point it at a stand-in."""

    k8s_namespace: str = "slipstream"
    """SLIPSTREAM_K8S_NAMESPACE: namespace of training/warmup pods and PyTorchJobs."""

    k8s_conn_id: str = "kubernetes_default"
    """SLIPSTREAM_K8S_CONN_ID: Airflow connection to the cluster (in-cluster config when empty extras)."""

    service_account: str = "slipstream-trainer"
    """SLIPSTREAM_K8S_SERVICE_ACCOUNT: service account of the pods."""

    gpu_resource: str = "nvidia.com/gpu"
    """SLIPSTREAM_GPU_RESOURCE: extended resource name requested per GPU."""

    gpu_toleration: str = "nvidia.com/gpu"
    """SLIPSTREAM_GPU_TOLERATION: taint key of GPU nodes that training pods tolerate (NoSchedule)."""

    cache_node_selector: str = "slipstream.io/cache=true"
    """SLIPSTREAM_CACHE_NODE_SELECTOR: labels of the nodes holding the warm cache (`k=v,k2=v2`);
    warmup and training pods both require them (cache-aware scheduling). The three cache
    placement settings and their defaults are the cache team's (`slipstream.cache.settings`)."""

    cache_volume: str = "hostPath:/mnt/slipstream-cache"
    """SLIPSTREAM_CACHE_VOLUME: the node-local cache, `hostPath:/path` or `pvc:claim`."""

    cache_mount_path: str = "/mnt/slipstream-cache"
    """SLIPSTREAM_CACHE_MOUNT_PATH: where pods see the cache (their SLIPSTREAM_CACHE_DIR)."""

    runs_volume: str = ""
    """SLIPSTREAM_RUNS_VOLUME: shared run artifacts volume (`pvc:claim`), mounted at
    SLIPSTREAM_RUNS_MOUNT_PATH; empty when SLIPSTREAM_RUNS_DIR is an object store."""

    runs_mount_path: str = "/runs"
    """SLIPSTREAM_RUNS_MOUNT_PATH: where pods see the runs volume (their SLIPSTREAM_RUNS_DIR)."""

    kafka_secret: str = "slipstream-kafka"
    """SLIPSTREAM_KAFKA_SECRET: Secret with keys `username`, `password` (SASL), as env
    SLIPSTREAM_KAFKA_SASL_USERNAME / SLIPSTREAM_KAFKA_SASL_PASSWORD."""

    s3_secret: str = "slipstream-s3"
    """SLIPSTREAM_S3_SECRET: Secret with keys `access-key-id`, `secret-access-key`, as env
    SLIPSTREAM_S3_ACCESS_KEY_ID / SLIPSTREAM_S3_SECRET_ACCESS_KEY."""

    env_configmap: str = "slipstream-env"
    """SLIPSTREAM_K8S_ENV_CONFIGMAP: optional ConfigMap loaded as env (catalog config, endpoints)."""

    shm_size: str = "8Gi"
    """SLIPSTREAM_SHM_SIZE: size of the memory-backed /dev/shm (DataLoader workers, NCCL)."""

    trainer_cpu: str = "8"
    """SLIPSTREAM_TRAINER_CPU: CPU request per training pod (no CPU limit: CFS throttling slows data loading)."""

    trainer_memory: str = "32Gi"
    """SLIPSTREAM_TRAINER_MEMORY: memory request and limit per training pod."""

    run_as_user: int = 1000
    """SLIPSTREAM_RUN_AS_USER: non-root uid of the pods (the Dockerfile's `slipstream` user)."""

    rdzv_port: int = 29400
    """SLIPSTREAM_RDZV_PORT: torchrun c10d rendezvous port on the PyTorchJob master."""

    def __post_init__(self) -> None:
        if self.run_as_user <= 0:
            raise ConfigError(f"SLIPSTREAM_RUN_AS_USER must be a non-root uid (> 0), got {self.run_as_user}")
        if not 1 <= self.rdzv_port <= 65535:
            raise ConfigError(f"SLIPSTREAM_RDZV_PORT must be a TCP port, got {self.rdzv_port}")
        # parse once here so a bad value fails at start-up, not when the pod is built
        self.node_selector_labels()
        self.cache_volume_source()
        self.runs_volume_source()

    def node_selector_labels(self) -> dict[str, str]:
        return parse_labels(self.cache_node_selector, setting="SLIPSTREAM_CACHE_NODE_SELECTOR")

    def cache_volume_source(self) -> VolumeSource | None:
        if not self.cache_volume:
            return None
        return VolumeSource.parse(self.cache_volume, setting="SLIPSTREAM_CACHE_VOLUME")

    def runs_volume_source(self) -> VolumeSource | None:
        if not self.runs_volume:
            return None
        return VolumeSource.parse(self.runs_volume, setting="SLIPSTREAM_RUNS_VOLUME")

    def secret_env(self) -> tuple[SecretEnv, ...]:
        out: list[SecretEnv] = []
        if self.kafka_secret:
            out += [
                SecretEnv("SLIPSTREAM_KAFKA_SASL_USERNAME", self.kafka_secret, "username"),
                SecretEnv("SLIPSTREAM_KAFKA_SASL_PASSWORD", self.kafka_secret, "password"),
            ]
        if self.s3_secret:
            out += [
                SecretEnv("SLIPSTREAM_S3_ACCESS_KEY_ID", self.s3_secret, "access-key-id"),
                SecretEnv("SLIPSTREAM_S3_SECRET_ACCESS_KEY", self.s3_secret, "secret-access-key"),
            ]
        return tuple(out)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClusterSettings:
        return settings_from_env(cls, env, prefix="SLIPSTREAM_", names=_ENV_NAMES)


_ENV_NAMES = {
    "k8s_namespace": "SLIPSTREAM_K8S_NAMESPACE",
    "k8s_conn_id": "SLIPSTREAM_K8S_CONN_ID",
    "service_account": "SLIPSTREAM_K8S_SERVICE_ACCOUNT",
    "env_configmap": "SLIPSTREAM_K8S_ENV_CONFIGMAP",
}


def cluster_env_names() -> list[str]:
    """The environment variables ClusterSettings reads."""
    return list(env_names(ClusterSettings, "SLIPSTREAM_", _ENV_NAMES).values())
