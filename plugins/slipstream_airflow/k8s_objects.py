"""Kubernetes objects of a Slipstream pod, built from a `TrainJobSpec`.

Shared by the training pod, the warmup pod and the PyTorchJob replicas, so all three land on the
same cache nodes with the same cache volume, credentials and security context — Fluid's
cache-aware scheduling, but driven by the job spec.
"""

from __future__ import annotations

from kubernetes.client import models as k8s

from slipstream.pipeline.cluster import VolumeSource
from slipstream.pipeline.jobspec import TrainJobSpec

SHM_VOLUME = "dshm"
CACHE_VOLUME = "slipstream-cache"
RUNS_VOLUME = "slipstream-runs"
XCOM_RETURN = "/airflow/xcom/return.json"


def _volume(name: str, source: VolumeSource) -> k8s.V1Volume:
    if source.kind == "hostPath":
        return k8s.V1Volume(name=name, host_path=k8s.V1HostPathVolumeSource(path=source.source, type="DirectoryOrCreate"))
    return k8s.V1Volume(name=name, persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name=source.source))


def volumes(spec: TrainJobSpec) -> list[k8s.V1Volume]:
    # /dev/shm defaults to 64 MiB in a container; DataLoader workers and NCCL need far more.
    out = [k8s.V1Volume(name=SHM_VOLUME, empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=spec.shm_size))]
    if spec.cache_volume:
        out.append(_volume(CACHE_VOLUME, spec.cache_volume))
    if spec.runs_volume:
        out.append(_volume(RUNS_VOLUME, spec.runs_volume))
    return out


def volume_mounts(spec: TrainJobSpec) -> list[k8s.V1VolumeMount]:
    out = [k8s.V1VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm")]
    if spec.cache_volume:
        out.append(k8s.V1VolumeMount(name=CACHE_VOLUME, mount_path=spec.cache_mount_path))
    if spec.runs_volume:
        out.append(k8s.V1VolumeMount(name=RUNS_VOLUME, mount_path=spec.runs_mount_path))
    return out


def cache_node_affinity(spec: TrainJobSpec) -> k8s.V1Affinity | None:
    """Required node affinity to the nodes labelled as holding the warm cache."""
    if not spec.node_selector:
        return None
    terms = [
        k8s.V1NodeSelectorRequirement(key=key, operator="In", values=[value])
        for key, value in sorted(spec.node_selector.items())
    ]
    return k8s.V1Affinity(
        node_affinity=k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(
                node_selector_terms=[k8s.V1NodeSelectorTerm(match_expressions=terms)]
            )
        )
    )


def gpu_tolerations(spec: TrainJobSpec) -> list[k8s.V1Toleration]:
    # Warmup pods tolerate the GPU taint too: the cache nodes usually are the GPU nodes.
    if not spec.gpu_toleration:
        return []
    return [k8s.V1Toleration(key=spec.gpu_toleration, operator="Exists", effect="NoSchedule")]


def training_resources(spec: TrainJobSpec) -> k8s.V1ResourceRequirements:
    requests = {"cpu": spec.cpu, "memory": spec.memory}
    limits = {"memory": spec.memory}
    if spec.gpus > 0:
        # extended resources must have request == limit; the scheduler only honours limits for them
        requests[spec.gpu_resource] = str(spec.gpus)
        limits[spec.gpu_resource] = str(spec.gpus)
    return k8s.V1ResourceRequirements(requests=requests, limits=limits)


def warmup_resources() -> k8s.V1ResourceRequirements:
    return k8s.V1ResourceRequirements(requests={"cpu": "1", "memory": "2Gi"}, limits={"memory": "4Gi"})


def env_vars(spec: TrainJobSpec) -> list[k8s.V1EnvVar]:
    """The spec's plain env vars, except those a Secret sets (`secret_env_vars`): a name appears once."""
    from_secrets = {s.env for s in spec.secret_env}
    return [k8s.V1EnvVar(name=k, value=str(v)) for k, v in sorted(spec.env.items()) if k not in from_secrets]


def secret_env_vars(spec: TrainJobSpec) -> list[k8s.V1EnvVar]:
    return [
        k8s.V1EnvVar(
            name=s.env,
            value_from=k8s.V1EnvVarSource(secret_key_ref=k8s.V1SecretKeySelector(name=s.secret, key=s.key)),
        )
        for s in spec.secret_env
    ]


def env_from(configmap: str) -> list[k8s.V1EnvFromSource]:
    if not configmap:
        return []
    return [k8s.V1EnvFromSource(config_map_ref=k8s.V1ConfigMapEnvSource(name=configmap, optional=True))]


def pod_security_context(spec: TrainJobSpec) -> k8s.V1PodSecurityContext:
    return k8s.V1PodSecurityContext(
        run_as_non_root=True,
        run_as_user=spec.run_as_user,
        run_as_group=spec.run_as_user,
        fs_group=spec.run_as_user,
        seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"),
    )


def container_security_context(spec: TrainJobSpec) -> k8s.V1SecurityContext:
    return k8s.V1SecurityContext(
        run_as_non_root=True,
        run_as_user=spec.run_as_user,
        allow_privilege_escalation=False,
        capabilities=k8s.V1Capabilities(drop=["ALL"]),
    )


def run_dir_in_pod(spec: TrainJobSpec) -> str:
    return f"{spec.env.get('SLIPSTREAM_RUNS_DIR', spec.runs_mount_path).rstrip('/')}/{spec.run_id}"


def train_command(spec: TrainJobSpec, *, xcom: bool) -> list[str]:
    """The container command: podrun wraps torchrun (the args) and hands lineage to the XCom sidecar."""
    cmd = ["python", "-m", "slipstream.pipeline.podrun", "--run-dir", run_dir_in_pod(spec)]
    if xcom:
        cmd += ["--xcom", XCOM_RETURN]
    return [*cmd, "--"]
