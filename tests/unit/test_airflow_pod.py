"""The training pod, warmup pod and PyTorchJob rendered from one TrainJobSpec, checked field by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.jobspec import build_train_spec
from slipstream.pipeline.request import TrainRequest
from slipstream.settings import Settings
from tests.airflow_fixtures import T_HANDOFF, kubeconfig, plan_for  # noqa: F401  (fixture)

CLUSTER = ClusterSettings(
    trainer_image="registry.example/slipstream-trainer:1.2.3",
    cache_node_selector="slipstream.io/cache=true,pool=gpu-a100",
    cache_volume="hostPath:/mnt/nvme/slipstream",
    runs_volume="pvc:slipstream-runs",
)


def spec_for(settings: Settings, **request: Any):  # type: ignore[no-untyped-def]
    req = TrainRequest(backend="kubernetes", **request)
    plan = plan_for(settings, req, run_id="daily-20250103-abcd1234", snapshot_id=987, cache_dir=CLUSTER.cache_mount_path)
    return build_train_spec(settings, CLUSTER, plan)


def trainer_config(settings: Settings, args: list[str]):  # type: ignore[no-untyped-def]
    """What the trainer resolves from a pod's arguments: the plan they name (the runs volume the
    pod mounts is this worker's runs dir) and their --set pairs."""
    from trainers.config.plan import load_plan_config

    pod_path = Path(args[args.index("--plan") + 1])
    assert pod_path == Path(CLUSTER.runs_mount_path) / pod_path.parent.name / "plan.json"
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    return load_plan_config(Path(settings.runs_dir) / pod_path.parent.name / "plan.json", None, sets, settings)[1]


def render_pod(spec) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from kubernetes.client import ApiClient

    from slipstream_airflow.training import TrainPodOperator

    op = TrainPodOperator(task_id="train_pod", cluster=CLUSTER, spec=spec)
    assert op.deferrable is True
    assert op.on_finish_action.value == "delete_pod"
    assert op.reattach_on_restart is True and op.durable is True
    assert op.do_xcom_push is True
    return ApiClient().sanitize_for_serialization(op.build_pod_request_obj())


def test_training_pod_has_every_field(settings: Settings, kubeconfig: Path) -> None:  # noqa: F811
    spec = spec_for(settings, gpus=4, window_days=3, epochs=2, stream_stop="600", batch_size=2048, lr=0.01)
    pod = render_pod(spec)
    podspec = pod["spec"]
    base = next(c for c in podspec["containers"] if c["name"] == "base")
    sidecar = next(c for c in podspec["containers"] if c["name"] == "airflow-xcom-sidecar")

    assert base["image"] == "registry.example/slipstream-trainer:1.2.3"
    # podrun wraps torchrun and writes the lineage where the XCom sidecar picks it up
    assert base["command"] == [
        "python", "-m", "slipstream.pipeline.podrun", "--run-dir", "/runs/daily-20250103-abcd1234",
        "--xcom", "/airflow/xcom/return.json", "--",
    ]
    args = base["args"]
    assert isinstance(args, list) and all(isinstance(a, str) for a in args)
    # one node: a c10d rendezvous on the pod's loopback, never --standalone (listeners on every interface)
    assert args[:13] == ["torchrun", "--nnodes", "1", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", f"127.0.0.1:{CLUSTER.rdzv_port}", "--rdzv-id", "daily-20250103-abcd1234",
                         "--local-addr", "127.0.0.1"]
    assert "--standalone" not in args
    assert args[13:15] == ["-m", "trainers.train"]
    cfg = trainer_config(settings, args)  # the run's ids, data and knobs come from its plan
    assert cfg.data.snapshot_id == 987
    assert cfg.data.window_days == 3 and cfg.data.epochs == 2
    assert cfg.data.stop.mode == "duration" and cfg.data.stop.duration_s == 600
    assert cfg.data.batch_size == 2048 and cfg.optim.lr == 0.01
    assert cfg.data.t_handoff == T_HANDOFF
    assert cfg.data.cache_dir == CLUSTER.cache_mount_path

    res = base["resources"]
    assert res["limits"]["nvidia.com/gpu"] == "4" and res["requests"]["nvidia.com/gpu"] == "4"
    assert res["limits"]["memory"] == CLUSTER.trainer_memory

    vols = {v["name"]: v for v in podspec["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": CLUSTER.shm_size}
    assert vols["slipstream-cache"]["hostPath"]["path"] == "/mnt/nvme/slipstream"
    assert vols["slipstream-runs"]["persistentVolumeClaim"]["claimName"] == "slipstream-runs"
    mounts = {m["name"]: m["mountPath"] for m in base["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm" and mounts["slipstream-cache"] == CLUSTER.cache_mount_path and mounts["slipstream-runs"] == "/runs"
    assert mounts["xcom"] == "/airflow/xcom"

    terms = podspec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    exprs = {e["key"]: e for e in terms[0]["matchExpressions"]}
    assert exprs["slipstream.io/cache"] == {"key": "slipstream.io/cache", "operator": "In", "values": ["true"]}
    assert exprs["pool"]["values"] == ["gpu-a100"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in podspec["tolerations"]

    names = [e["name"] for e in base["env"]]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)  # one value per name
    env = {e["name"]: e for e in base["env"]}
    assert env["SLIPSTREAM_S3_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "slipstream-s3", "key": "access-key-id"}
    assert env["SLIPSTREAM_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "slipstream-kafka", "key": "password"}
    assert env["SLIPSTREAM_S3_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "slipstream-s3", "key": "secret-access-key"}
    assert "value" not in env["SLIPSTREAM_KAFKA_SASL_PASSWORD"]  # never a literal credential
    assert env["SLIPSTREAM_CACHE_DIR"]["value"] == CLUSTER.cache_mount_path and env["SLIPSTREAM_RUNS_DIR"]["value"] == "/runs"
    assert "SLIPSTREAM_HOME" not in env and "SLIPSTREAM_RAW_DIR" not in env  # worker paths stay out
    assert env["SLIPSTREAM_TRAINING_BACKEND"]["value"] == "kubernetes"

    psc = podspec["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 1000 and psc["fsGroup"] == 1000
    for c in (base, sidecar):
        assert c["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert podspec["serviceAccountName"] == CLUSTER.service_account
    assert podspec["restartPolicy"] == "Never"
    assert pod["metadata"]["namespace"] == CLUSTER.k8s_namespace
    assert pod["metadata"]["name"].startswith("train-daily-20250103-abcd1234")
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "trainer"


def test_cpu_pod_asks_for_no_gpu_and_caught_up_stop(settings: Settings, kubeconfig: Path) -> None:  # noqa: F811
    pod = render_pod(spec_for(settings, gpus=0, cpu_processes=3, stream_stop="caught_up"))
    base = next(c for c in pod["spec"]["containers"] if c["name"] == "base")
    assert "nvidia.com/gpu" not in base["resources"]["limits"]
    assert base["args"][3:5] == ["--nproc-per-node", "3"]
    assert [a for a in base["args"] if a.startswith("data.stop")] == []  # the plan carries the stop rule
    cfg = trainer_config(settings, base["args"])
    assert cfg.data.stop.mode == "caught_up" and cfg.data.stream is True


def test_param_text_never_reaches_a_shell(settings: Settings, kubeconfig: Path) -> None:  # noqa: F811
    """A value with shell syntax stays one argument; the pod's command runs no shell."""
    from slipstream.pipeline.jobspec import TrainJobSpec

    spec = spec_for(settings, gpus=1)
    evil = TrainJobSpec.from_dict({**spec.to_dict(), "overrides": {**spec.overrides, "run.note": "x; rm -rf / $(id)"}})
    base = next(c for c in render_pod(evil)["spec"]["containers"] if c["name"] == "base")
    assert "run.note=x; rm -rf / $(id)" in base["args"]
    assert base["command"][0] == "python" and "sh" not in base["command"]


def test_warmup_pod_lands_on_cache_nodes(settings: Settings, kubeconfig: Path) -> None:  # noqa: F811
    from kubernetes.client import ApiClient

    from slipstream.pipeline.jobspec import warmup_args
    from slipstream.pipeline.runplan import read_plan
    from slipstream_airflow.training import WarmupPodOperator

    spec = spec_for(settings, gpus=2)
    args = warmup_args(spec.plan_path)
    op = WarmupPodOperator(task_id="warmup_pod", cluster=CLUSTER, spec=spec, warmup_args=args)
    op.apply_spec(spec)
    pod = ApiClient().sanitize_for_serialization(op.build_pod_request_obj())
    base = pod["spec"]["containers"][0]
    # the warmup copies exactly the files of the plan the trainer reads: snapshot 987's window
    assert base["command"] == args and args[args.index("--plan") + 1] == spec.plan_path
    plan = read_plan(Path(settings.runs_dir) / spec.run_id / "plan.json")
    assert plan.snapshot_id == 987 and plan.cache_dir == CLUSTER.cache_mount_path
    assert "nvidia.com/gpu" not in (base["resources"].get("limits") or {})
    assert pod["spec"]["affinity"]["nodeAffinity"]  # same cache nodes as the training pod
    assert any(v["name"] == "slipstream-cache" for v in pod["spec"]["volumes"])


def test_pytorchjob_manifest(settings: Settings) -> None:
    from slipstream_airflow.pytorchjob import render_pytorchjob

    spec = spec_for(settings, gpus=8, nnodes=3)
    job = render_pytorchjob(spec, CLUSTER)
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert job["metadata"]["name"] == "daily-20250103-abcd1234"
    assert job["metadata"]["namespace"] == CLUSTER.k8s_namespace
    assert job["spec"]["nprocPerNode"] == "8"
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    reps = job["spec"]["pytorchReplicaSpecs"]
    assert reps["Master"]["replicas"] == 1 and reps["Worker"]["replicas"] == 2
    for role in ("Master", "Worker"):
        pod = reps[role]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["name"] == "pytorch" and c["image"] == CLUSTER.trainer_image
        assert c["command"][:3] == ["python", "-m", "slipstream.pipeline.podrun"] and "--xcom" not in c["command"]
        args = c["args"]
        assert args[:4] == ["torchrun", "--nnodes", "3", "--nproc-per-node"] and args[4] == "8"
        assert "--standalone" not in args
        i = args.index("--rdzv-endpoint")
        assert args[i + 1] == f"daily-20250103-abcd1234-master-0:{CLUSTER.rdzv_port}"
        assert args[args.index("--rdzv-backend") + 1] == "c10d"
        assert c["ports"] == [{"containerPort": CLUSTER.rdzv_port, "name": "pytorchjob-port"}]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert {v["name"] for v in pod["volumes"]} >= {"dshm", "slipstream-cache", "slipstream-runs"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["affinity"]["nodeAffinity"]
        names = [e["name"] for e in c["env"]]
        assert len(names) == len(set(names))
        env = {e["name"]: e for e in c["env"]}
        assert env["SLIPSTREAM_S3_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "slipstream-s3"


def test_pytorchjob_state() -> None:
    from slipstream_airflow.pytorchjob import job_state

    assert job_state({}) is None
    assert job_state({"status": {"conditions": [{"type": "Running", "status": "True"}]}}) is None
    assert job_state({"status": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Succeeded", "status": "True"}]}}) == "Succeeded"
    assert job_state({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}) == "Failed"


def test_single_node_refuses_pytorchjob(settings: Settings) -> None:
    from slipstream_airflow.pytorchjob import render_pytorchjob

    with pytest.raises(ValueError, match="nnodes >= 2"):
        render_pytorchjob(spec_for(settings, gpus=1), CLUSTER)


def test_placement_matches_the_cache_teams(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pods' node affinity, cache volume and mount are the ones slipstream.cache.placement
    computes from the same settings (defaults and overrides)."""
    placement = pytest.importorskip("slipstream.cache.placement", reason="the cache team's module is not merged yet")

    for env in ({}, {"SLIPSTREAM_CACHE_NODE_SELECTOR": "a=b,c=d", "SLIPSTREAM_CACHE_VOLUME": "pvc:warm",
                     "SLIPSTREAM_CACHE_MOUNT_PATH": "/warm"}):
        for key in ("SLIPSTREAM_CACHE_NODE_SELECTOR", "SLIPSTREAM_CACHE_VOLUME", "SLIPSTREAM_CACHE_MOUNT_PATH"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        theirs = placement.cache_placement(Settings.from_env())
        ours = ClusterSettings.from_env()
        assert theirs["node_selector"] == ours.node_selector_labels()
        assert theirs["volume_mounts"][0]["mountPath"] == ours.cache_mount_path
        vol = theirs["volumes"][0]
        source = ours.cache_volume_source()
        assert source is not None
        if source.kind == "hostPath":
            assert vol["hostPath"]["path"] == source.source
        else:
            assert vol["persistentVolumeClaim"]["claimName"] == source.source


def test_a_kubernetes_render_warns_of_every_worker_local_value(settings: Settings) -> None:
    """The embedded stack's values (a file:// warehouse, a 127.0.0.1 broker, the SQLite catalog, a
    local registry, the plan's local data files) mean nothing in a pod: each is named with its fix."""
    from slipstream.pipeline.jobspec import worker_local_values
    from slipstream.pipeline.runplan import read_plan

    spec = spec_for(settings, gpus=1)
    plan = read_plan(Path(settings.runs_dir) / spec.run_id / "plan.json")
    warnings = worker_local_values(spec, plan)
    text = "\n".join(warnings)
    for needle in ("SLIPSTREAM_WAREHOUSE=file://", "SLIPSTREAM_KAFKA_BOOTSTRAP=127.0.0.1", "SLIPSTREAM_CATALOG=local",
                   "SLIPSTREAM_REGISTRY=", "the plan's Kafka bootstrap 127.0.0.1", "data files are on this worker's disk"):
        assert needle in text, (needle, warnings)
    remote = TrainJobSpecFrom(spec, {"SLIPSTREAM_WAREHOUSE": "s3://lake/wh", "SLIPSTREAM_KAFKA_BOOTSTRAP": "kafka:9092",
                                     "SLIPSTREAM_CATALOG": "prod", "SLIPSTREAM_REGISTRY": "s3://models/ctr"})
    assert worker_local_values(remote) == []


def TrainJobSpecFrom(spec, env):  # type: ignore[no-untyped-def]
    from slipstream.pipeline.jobspec import TrainJobSpec

    return TrainJobSpec.from_dict({**spec.to_dict(), "env": {**spec.env, **env}})


def test_a_dry_run_renders_the_exact_pod_into_log_and_xcom(settings: Settings, kubeconfig: Path,  # noqa: F811
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`dry_run`: the training task renders the pod it would submit (image, args, env) into its log
    as YAML and into its XCom, with the worker-local warnings, and starts nothing."""
    from slipstream_airflow.jobxcom import JOB_XCOM_KEY, RenderedJob
    from slipstream_airflow.training import TrainPodOperator

    spec = spec_for(settings, gpus=2, dry_run=True)
    job = RenderedJob(spec, "pod", True, [])

    class TI:
        dag_id, task_id, try_number, map_index = "daily_retrain", "train_pod", 1, -1

        def xcom_pull(self, task_ids: str, key: str) -> Any:
            assert key == JOB_XCOM_KEY
            return job.to_xcom()

    op = TrainPodOperator(task_id="train_pod", cluster=CLUSTER)
    assert op.image == CLUSTER.trainer_image  # known at parse time: `airflow tasks render` shows it
    out = op.execute({"ti": TI(), "run_id": "manual__2025-01-03", "dag": None})
    assert out["dry_run"] is True and out["rendered"] == "trainer pod"
    base = next(c for c in out["manifest"]["spec"]["containers"] if c["name"] == "base")
    assert base["image"] == CLUSTER.trainer_image and base["args"] == spec.torchrun_args()
    assert out["manifest"]["metadata"]["labels"]["run_id"] == "manual__2025-01-03"  # this try's labels too
    assert any("SLIPSTREAM_KAFKA_BOOTSTRAP=127.0.0.1" in w for w in out["warnings"])
    text = capsys.readouterr().out  # the task log (Airflow's task logger writes to the console here)
    assert "would start this trainer pod" in text and "image: registry.example/slipstream-trainer:1.2.3" in text
    assert "worker-local value in a Kubernetes launch" in text
