"""The Kubernetes backend: the job spec as a KubernetesPodOperator (training and cache warmup).

Operators are created at DAG-parse time with only cluster-level settings (namespace, connection,
service account); the job itself — image, torchrun arguments, GPUs, volumes, placement — comes from
the `render_job` XCom when the task runs (`apply_spec`), so the trigger form's params reach the pod.
Tests pass `spec=` to render a pod without a DAG run.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.secret import Secret

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.jobspec import TrainJobSpec
from slipstream_airflow import k8s_objects as ko
from slipstream_airflow.dryrun import kubernetes_warnings, report_dry_run
from slipstream_airflow.jobxcom import RENDER_TASK_ID, pull_job

POD_LABELS = {"app.kubernetes.io/part-of": "slipstream"}


def cluster_pod_kwargs(cluster: ClusterSettings) -> dict[str, Any]:
    """What every Slipstream pod shares, known at parse time."""
    return {
        "namespace": cluster.k8s_namespace,
        "kubernetes_conn_id": cluster.k8s_conn_id,
        "service_account_name": cluster.service_account,
        "image_pull_policy": "IfNotPresent",
        "get_logs": True,
        # deferrable: the wait runs in the triggerer, not a worker slot, for hours-long training
        "deferrable": True,
        # finished or failed pods are deleted; durable (the 3.3 name of reattach_on_restart) makes
        # a restarted worker re-attach to the running pod instead of starting a second GPU pod
        "on_finish_action": "delete_pod",
        "on_kill_action": "delete_pod",
        "durable": True,
        "log_events_on_failure": True,
        "startup_timeout_seconds": 1800,  # GPU node scale-up and image pulls take minutes
    }


class _SpecPodOperator(KubernetesPodOperator):
    """A pod whose job is the rendered `TrainJobSpec` (from `spec=` or the render XCom)."""

    component = "pod"

    def __init__(
        self,
        *,
        cluster: ClusterSettings,
        spec: TrainJobSpec | None = None,
        job_task_id: str = RENDER_TASK_ID,
        **kwargs: Any,
    ) -> None:
        # the image is known at parse time (`airflow tasks render` shows it); the job comes at run time
        super().__init__(**{**cluster_pod_kwargs(cluster), "image": cluster.trainer_image, **kwargs})
        self.job_task_id = job_task_id
        self.env_configmap = cluster.env_configmap
        if spec is not None:
            self.apply_spec(spec)

    def apply_spec(self, spec: TrainJobSpec) -> None:
        """Placement, credentials and security shared by training and warmup pods."""
        self.labels = {**POD_LABELS, "app.kubernetes.io/component": self.component, "slipstream.io/run-id": spec.k8s_name}
        self.volumes = ko.volumes(spec)
        self.volume_mounts = ko.volume_mounts(spec)
        self.affinity = ko.cache_node_affinity(spec) or {}
        self.tolerations = ko.gpu_tolerations(spec)
        self.env_vars = ko.env_vars(spec)
        self.env_from = ko.env_from(self.env_configmap)
        # the provider's Secret.__init__ is unannotated
        self.secrets = [Secret("env", s.env, s.secret, s.key) for s in spec.secret_env]  # type: ignore[no-untyped-call]
        self.security_context = ko.pod_security_context(spec)
        self.container_security_context = ko.container_security_context(spec)
        self.xcom_sidecar_container_security_context = ko.container_security_context(spec)
        self.image = spec.image

    def execute(self, context: Any) -> Any:
        job = pull_job(context, self.job_task_id)
        self.apply_job(job)
        if job.dry_run:  # the pod exactly as it would be submitted, labels of this try included
            from kubernetes.client import ApiClient

            pod = ApiClient().sanitize_for_serialization(self.build_pod_request_obj(context))
            return report_dry_run(self.log, job, f"{self.component} pod", pod, kubernetes_warnings(job.spec))
        return super().execute(context)

    def apply_job(self, job: Any) -> None:
        self.apply_spec(job.spec)


class TrainPodOperator(_SpecPodOperator):
    """One node's training pod: `torchrun --nproc-per-node <gpus>` wrapped by slipstream.pipeline.podrun,
    which hands the run's lineage to the XCom sidecar."""

    component = "trainer"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("do_xcom_push", True)
        super().__init__(**kwargs)

    def apply_spec(self, spec: TrainJobSpec) -> None:
        super().apply_spec(spec)
        self.name = f"train-{spec.k8s_name}"
        self.cmds = ko.train_command(spec, xcom=self.do_xcom_push)
        self.arguments = spec.torchrun_args()
        self.container_resources = ko.training_resources(spec)


class WarmupPodOperator(_SpecPodOperator):
    """The cache warmup as a pod on the cache nodes, with the training pod's volume and affinity."""

    component = "cache-warmup"

    def __init__(self, *, warmup_args: list[str] | None = None, **kwargs: Any) -> None:
        self.warmup_args = list(warmup_args or [])
        super().__init__(**kwargs)

    def apply_spec(self, spec: TrainJobSpec) -> None:
        super().apply_spec(spec)
        self.name = f"warm-{spec.k8s_name}"
        self.cmds = list(self.warmup_args)
        self.arguments = []
        self.container_resources = ko.warmup_resources()

    def apply_job(self, job: Any) -> None:
        self.warmup_args = list(job.warmup_args)
        self.apply_spec(job.spec)
