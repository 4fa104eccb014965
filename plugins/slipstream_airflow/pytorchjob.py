"""More than one node's GPUs: the job spec as a Kubeflow `PyTorchJob`, submitted and waited for.

Every replica runs the same `torchrun` argument list as the single-node pod, except that the
rendezvous is c10d at the master replica's service (`<job>-master-0:<rdzv_port>`, the service the
Kubeflow training operator creates for the container port named `pytorchjob-port`). Pods get the
same placement, volumes, credentials and security context as the training pod (`k8s_objects`).

An elastic job (min_nodes < max_nodes) has Worker replicas only, and an `elasticPolicy` (the
bounds, the c10d rendezvous at `<job>-worker-0`, torchrun's restart budget): worker 0 hosts the
rendezvous and stays; the others may come and go (the operator scales from the highest index
down). Each pod gets the grace to finish a graceful stop (the trainer's checkpoint at the next
step boundary) before Kubernetes kills it, and a failed pod restarts and joins again.

The operator submits through the cncf.kubernetes provider's `KubernetesHook`. If the job already
exists (a worker restarted mid-run) it re-attaches and waits instead of starting a second job;
when the task is killed it deletes the job, so no GPU pods are orphaned.
"""

from __future__ import annotations

import time
from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.sdk import BaseOperator
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.elastic import RDZV_CONF
from slipstream.pipeline.jobspec import TrainJobSpec
from slipstream.pipeline.runlayout import RunArtifactMissing, read_metrics, run_dir, training_lineage
from slipstream.settings import Settings
from slipstream_airflow import k8s_objects as ko
from slipstream_airflow.dryrun import kubernetes_warnings, report_dry_run
from slipstream_airflow.jobxcom import RENDER_TASK_ID, master_host, pull_job

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
CONTAINER_NAME = "pytorch"  # the training operator requires this container name
PORT_NAME = "pytorchjob-port"  # the training operator exposes this port on the master's service
GRACE_MARGIN_S = 15
"""A pod's termination grace beyond torchrun's own wait for its workers (podrun and the agent exit)."""


class PyTorchJobFailed(RuntimeError):
    pass


def replica_template(spec: TrainJobSpec, cluster: ClusterSettings) -> dict[str, Any]:
    container = k8s.V1Container(
        name=CONTAINER_NAME,
        image=spec.image,
        image_pull_policy="IfNotPresent",
        command=ko.train_command(spec, xcom=False),
        args=spec.torchrun_args(rdzv_host=master_host(spec)),
        env=[*ko.env_vars(spec), *ko.secret_env_vars(spec)],
        env_from=ko.env_from(cluster.env_configmap) or None,
        ports=[k8s.V1ContainerPort(name=PORT_NAME, container_port=spec.rdzv_port)],
        resources=ko.training_resources(spec),
        volume_mounts=ko.volume_mounts(spec),
        security_context=ko.container_security_context(spec),
    )
    template = k8s.V1PodTemplateSpec(
        metadata=k8s.V1ObjectMeta(labels={"app.kubernetes.io/part-of": "slipstream", "slipstream.io/run-id": spec.k8s_name}),
        spec=k8s.V1PodSpec(
            containers=[container],
            volumes=ko.volumes(spec),
            affinity=ko.cache_node_affinity(spec),
            tolerations=ko.gpu_tolerations(spec) or None,
            security_context=ko.pod_security_context(spec),
            service_account_name=cluster.service_account,
            restart_policy="OnFailure" if spec.elastic else "Never",  # the operator sets it from the replica's
            # SIGTERM reaches the workers through podrun and torchrun, which wait stop_grace_s for them
            termination_grace_period_seconds=spec.stop_grace_s + GRACE_MARGIN_S if spec.elastic else None,
        ),
    )
    manifest: dict[str, Any] = ApiClient().sanitize_for_serialization(template)
    return manifest


def elastic_policy(spec: TrainJobSpec) -> dict[str, Any]:
    """The PyTorchJob's `elasticPolicy`: what the operator hands torchrun (PET_* variables) — the
    same values as the container's own arguments."""
    low, high = spec.node_bounds
    return {
        "minReplicas": low, "maxReplicas": high, "rdzvBackend": "c10d", "rdzvHost": master_host(spec),
        "rdzvPort": spec.rdzv_port, "rdzvId": spec.k8s_name, "maxRestarts": spec.max_restarts,
        "rdzvConf": [{"key": k, "value": v} for k, v in RDZV_CONF.items()],
    }


def render_pytorchjob(spec: TrainJobSpec, cluster: ClusterSettings) -> dict[str, Any]:
    """The PyTorchJob manifest of a multi-node or elastic spec (a plain dict, ready for the API)."""
    if spec.nnodes < 2 and not spec.elastic:
        raise ValueError(f"a PyTorchJob is for nnodes >= 2 or an elastic job, got {spec.nnodes}: use the training pod")
    template = replica_template(spec, cluster)
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running", "backoffLimit": 0, "ttlSecondsAfterFinished": 86_400}
    elastic: dict[str, Any] = {}
    if spec.elastic:
        # workers only (worker 0 hosts the rendezvous); a failed pod restarts and joins again,
        # within the job's restart budget
        replicas: dict[str, Any] = {"Worker": {"replicas": spec.nnodes, "restartPolicy": "OnFailure", "template": template}}
        run_policy["backoffLimit"] = spec.max_restarts
        elastic = {"elasticPolicy": elastic_policy(spec)}
    else:
        replicas = {
            "Master": {"replicas": 1, "restartPolicy": "Never", "template": template},
            "Worker": {"replicas": spec.nnodes - 1, "restartPolicy": "Never", "template": template},
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": spec.k8s_name,
            "namespace": cluster.k8s_namespace,
            "labels": {"app.kubernetes.io/part-of": "slipstream", "app.kubernetes.io/component": "trainer"},
        },
        "spec": {
            "nprocPerNode": str(spec.nproc_per_node),
            # Running pods are deleted when the job ends (no GPU held after a failure); finished
            # pods stay for their logs until the job's TTL.
            "runPolicy": run_policy,
            **elastic,
            "pytorchReplicaSpecs": replicas,
        },
    }


def job_state(obj: dict[str, Any]) -> str | None:
    """'Succeeded' or 'Failed' once the job has finished, else None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Succeeded", "Failed") and str(cond.get("status")) == "True":
            return str(cond["type"])
    return None


class PyTorchJobOperator(BaseOperator):
    """Submits the rendered job as a PyTorchJob and waits until it succeeds or fails."""

    ui_color = "#fde8d8"

    def __init__(
        self, *, cluster: ClusterSettings, job_task_id: str = RENDER_TASK_ID, poll_interval_s: float = 30.0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.cluster = cluster
        self.job_task_id = job_task_id
        self.poll_interval_s = poll_interval_s
        self._name: str | None = None

    @property
    def hook(self) -> KubernetesHook:
        return KubernetesHook(conn_id=self.cluster.k8s_conn_id)

    def execute(self, context: Any) -> dict[str, Any]:
        job = pull_job(context, self.job_task_id)
        manifest = render_pytorchjob(job.spec, self.cluster)
        if job.dry_run:
            return report_dry_run(self.log, job, "PyTorchJob", manifest, kubernetes_warnings(job.spec))
        name, ns = manifest["metadata"]["name"], self.cluster.k8s_namespace
        self._name = name
        hook = self.hook
        try:
            hook.create_custom_object(group=GROUP, version=VERSION, plural=PLURAL, body=manifest, namespace=ns)
            self.log.info("submitted PyTorchJob %s/%s: %d nodes x %d processes", ns, name, job.spec.nnodes,
                          job.spec.nproc_per_node)
        except ApiException as e:
            if e.status != 409:
                raise
            self.log.warning("PyTorchJob %s/%s already exists (a restarted worker): re-attaching", ns, name)
        started = time.monotonic()
        while True:
            obj = hook.get_custom_object(group=GROUP, version=VERSION, plural=PLURAL, name=name, namespace=ns)
            state = job_state(obj)
            if state == "Succeeded":
                break
            if state == "Failed":
                raise PyTorchJobFailed(
                    f"PyTorchJob {ns}/{name} failed after {time.monotonic() - started:.0f}s; "
                    f"see `kubectl -n {ns} logs -l training.kubeflow.org/job-name={name}`"
                )
            time.sleep(self.poll_interval_s)
        self._name = None
        settings = Settings.from_env()
        try:
            path = run_dir(settings, job.spec.run_id)
            return training_lineage(path, read_metrics(path))
        except RunArtifactMissing:
            # the worker does not mount the runs volume: hand on where the pods wrote the run
            return {"run_id": job.spec.run_id, "run_dir": ko.run_dir_in_pod(job.spec), "pytorchjob": f"{ns}/{name}"}

    def on_kill(self) -> None:
        if self._name is None:
            return
        self.log.warning("task killed: deleting PyTorchJob %s/%s", self.cluster.k8s_namespace, self._name)
        self.hook.delete_custom_object(
            group=GROUP, version=VERSION, plural=PLURAL, name=self._name, namespace=self.cluster.k8s_namespace
        )
