"""Elastic jobs, rendered: the job spec's torchrun arguments, the request's bounds, the PyTorchJob's
`elasticPolicy` (checked against the training operator's v1 schema of it), and the local job's
records (slipstream.pipeline.elastic) without starting anything."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from slipstream.errors import ConfigError
from slipstream.pipeline import elastic
from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.jobspec import TrainJobSpec, build_train_spec
from slipstream.pipeline.request import TrainRequest
from slipstream.settings import Settings
from tests.airflow_fixtures import plan_for

CLUSTER = ClusterSettings(trainer_image="registry.example/slipstream-trainer:1.2.3", runs_volume="pvc:slipstream-runs")

ELASTIC_POLICY_SCHEMA: dict[str, Any] = {
    # kubeflow.org/v1 PyTorchJob, spec.elasticPolicy (training-operator's ElasticPolicy type): the
    # fields Slipstream sets, with the operator's types; anything else is refused here
    "type": "object",
    "additionalProperties": False,
    "required": ["minReplicas", "maxReplicas", "rdzvBackend", "maxRestarts"],
    "properties": {
        "minReplicas": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        "maxReplicas": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        "rdzvBackend": {"enum": ["c10d", "etcd", "etcd-v2"]},
        "rdzvPort": {"type": "integer", "minimum": 1, "maximum": 65535},
        "rdzvHost": {"type": "string", "minLength": 1},
        "rdzvId": {"type": "string", "minLength": 1},
        "rdzvConf": {"type": "array", "items": {"type": "object", "additionalProperties": False, "required": ["key", "value"],
                                                "properties": {"key": {"type": "string"}, "value": {"type": "string"}}}},
        "maxRestarts": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
    },
}


def _spec_for(settings: Settings, **request: Any) -> TrainJobSpec:
    req = TrainRequest(backend="kubernetes", **request)
    plan = plan_for(settings, req, run_id="daily-20250103-abcd1234", snapshot_id=987, cache_dir=CLUSTER.cache_mount_path)
    return build_train_spec(settings, CLUSTER, plan)


def test_an_elastic_spec_runs_torchrun_min_max_with_its_budget_and_grace() -> None:
    spec = TrainJobSpec(run_id="r1", config_path="/c.yaml", nnodes=2, min_nodes=1, max_nodes=4, max_restarts=5,
                        stop_grace_s=90)
    assert spec.elastic and spec.node_bounds == (1, 4)
    args = spec.torchrun_args(rdzv_host="r1-worker-0")
    assert args[:3] == ["torchrun", "--nnodes", "1:4"] and "--standalone" not in args
    assert args[args.index("--rdzv-endpoint") + 1] == f"r1-worker-0:{spec.rdzv_port}"
    assert args[args.index("--rdzv-backend") + 1] == "c10d"
    assert args[args.index("--max-restarts") + 1] == "5" and args[args.index("--shutdown-timeout") + 1] == "90"
    conf = dict(kv.split("=") for kv in args[args.index("--rdzv-conf") + 1].split(","))
    assert conf == elastic.RDZV_CONF
    local_args = spec.torchrun_args(rdzv_host="127.0.0.1", rdzv_port=4321)
    assert local_args[local_args.index("--rdzv-endpoint") + 1] == "127.0.0.1:4321"
    with pytest.raises(ConfigError, match="rendezvous host"):
        spec.torchrun_args()
    # one launcher at the start is still elastic: never --standalone (its stores listen on every interface)
    local = TrainJobSpec(run_id="r1", config_path="/c.yaml", max_nodes=3)
    assert local.elastic and local.torchrun_args(rdzv_host="127.0.0.1")[:3] == ["torchrun", "--nnodes", "1:3"]
    fixed = TrainJobSpec(run_id="r1", config_path="/c.yaml")
    assert not fixed.elastic and "--standalone" not in fixed.torchrun_args() and "--max-restarts" not in fixed.torchrun_args()
    assert fixed.torchrun_args()[fixed.torchrun_args().index("--rdzv-endpoint") + 1].startswith("127.0.0.1:")


@pytest.mark.parametrize("bounds", [{"min_nodes": 3, "nnodes": 2, "max_nodes": 4}, {"nnodes": 5, "max_nodes": 4},
                                    {"min_nodes": 0, "max_nodes": 2}])
def test_bounds_that_do_not_contain_nnodes_are_refused(bounds: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="min_nodes <= nnodes <= max_nodes"):
        TrainJobSpec(run_id="r1", **bounds)


def test_request_knobs_bound_an_elastic_job(settings: Settings) -> None:
    assert TrainRequest().node_range == (1, 1)
    assert TrainRequest(backend="local", max_nodes=3).node_range == (1, 3)  # others join with `slipstream elastic join`
    with pytest.raises(ConfigError, match="nnodes=2 needs backend=kubernetes"):
        TrainRequest(backend="local", nnodes=2, max_nodes=3)
    with pytest.raises(ConfigError, match="min_nodes <= nnodes <= max_nodes"):
        TrainRequest(backend="kubernetes", nnodes=4, max_nodes=3)
    with pytest.raises(ConfigError, match="max_restarts must be >= 0"):
        TrainRequest(max_restarts=-1)
    spec = _spec_for(settings, nnodes=2, min_nodes=1, max_nodes=4, max_restarts=7)
    assert (spec.node_bounds, spec.max_restarts, spec.elastic) == ((1, 4), 7, True)


def test_the_elastic_pytorchjob_has_workers_only_and_a_valid_elastic_policy(settings: Settings) -> None:
    from slipstream_airflow.jobxcom import launch_kind, master_host
    from slipstream_airflow.pytorchjob import GRACE_MARGIN_S, render_pytorchjob

    spec = _spec_for(settings, gpus=8, nnodes=2, min_nodes=1, max_nodes=4, max_restarts=6)
    job = render_pytorchjob(spec, CLUSTER)
    policy = job["spec"]["elasticPolicy"]
    jsonschema.validate(policy, ELASTIC_POLICY_SCHEMA)
    assert (policy["minReplicas"], policy["maxReplicas"], policy["maxRestarts"]) == (1, 4, 6)
    assert policy["rdzvHost"] == master_host(spec) == "daily-20250103-abcd1234-worker-0"
    assert policy["rdzvPort"] == CLUSTER.rdzv_port and policy["rdzvId"] == spec.k8s_name
    assert {c["key"]: c["value"] for c in policy["rdzvConf"]} == elastic.RDZV_CONF
    reps = job["spec"]["pytorchReplicaSpecs"]
    assert set(reps) == {"Worker"} and reps["Worker"]["replicas"] == 2 and reps["Worker"]["restartPolicy"] == "OnFailure"
    assert job["spec"]["runPolicy"]["backoffLimit"] == 6
    pod = reps["Worker"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == spec.stop_grace_s + GRACE_MARGIN_S
    (c,) = pod["containers"]
    args = c["args"]
    # the container's own arguments say what the operator's PET_* variables say
    assert args[args.index("--nnodes") + 1] == "1:4"
    assert args[args.index("--rdzv-endpoint") + 1] == f"{policy['rdzvHost']}:{policy['rdzvPort']}"
    assert args[args.index("--max-restarts") + 1] == "6"
    assert c["ports"] == [{"containerPort": CLUSTER.rdzv_port, "name": "pytorchjob-port"}]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[elastic.SHARED_STORE_OFF[0]] == elastic.SHARED_STORE_OFF[1]  # torch 2.14's joining-node hang
    assert launch_kind("kubernetes", TrainRequest(backend="kubernetes", max_nodes=3).node_range[1]) == "pytorchjob"
    # a fixed job renders as before: a master and no elastic policy
    fixed_spec = _spec_for(settings, gpus=8, nnodes=3)
    fixed = render_pytorchjob(fixed_spec, CLUSTER)
    assert "elasticPolicy" not in fixed["spec"] and set(fixed["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"}
    assert elastic.SHARED_STORE_OFF[0] not in fixed_spec.env


def test_a_local_elastic_job_is_launched_by_trainers_launch_on_loopback(tmp_path: Path) -> None:
    spec = TrainJobSpec(run_id="r1", config_path="/c.yaml", max_nodes=3)
    cmd = elastic.local_launch_command(tmp_path / "r1", spec.torchrun_args(rdzv_host="127.0.0.1", rdzv_port=4321))
    assert cmd[1:3] == ["-m", "trainers.launch"] and cmd[cmd.index("--job-dir") + 1] == str(tmp_path / "r1" / "elastic")
    assert cmd[cmd.index("--node-index") + 1] == "0" and cmd[cmd.index("--local-addr") + 1] == "127.0.0.1"
    assert "torchrun" not in cmd and cmd[cmd.index("--nnodes") + 1] == "1:3"
    job = elastic.ElasticJob(endpoint="127.0.0.1:4321", rdzv_id="r1", nnodes="1:3", nproc_per_node=2, max_restarts=3,
                             shutdown_timeout_s=60, rdzv_conf=dict(elastic.RDZV_CONF), module="trainers.train",
                             trainer_args=["--config", "/c.yaml"])
    two = job.torchrun_args(2)
    assert two[two.index("--local-addr") + 1] == "127.0.0.3" and two[-3:] == ["trainers.train", "--config", "/c.yaml"]
    with pytest.raises(elastic.ElasticError, match="out of range"):
        elastic.node_addr(254)
    shared = elastic.shared_env({"SLIPSTREAM_HOME": "/h", "SLIPSTREAM_KAFKA_SASL_PASSWORD": "s3cret", "PATH": "/bin",
                                 "PYTHONPATH": "/repo"})
    assert shared == {"PYTHONPATH": "/repo", "SLIPSTREAM_HOME": "/h"}  # no secret on disk


def test_launcher_records_and_what_leave_and_activate_refuse(tmp_path: Path) -> None:
    run_path = tmp_path / "r1"
    directory = elastic.job_dir(run_path)
    with pytest.raises(elastic.ElasticError, match="not started as an elastic job"):
        elastic.read_job(run_path)
    assert elastic.reserve_launcher(directory, 1) and not elastic.reserve_launcher(directory, 1)
    elastic.write_launcher(directory, elastic.Launcher(0, pid=os.getpid(), addr="127.0.0.1"))  # this process: no launcher
    elastic.write_launcher(directory, elastic.Launcher(2, pid=2**22 + 7, addr="127.0.0.3", standby=True))  # no such pid
    assert [la.index for la in elastic.launchers(run_path)] == [0, 1, 2]
    assert not any(la.alive for la in elastic.launchers(run_path))
    with pytest.raises(elastic.ElasticError, match="launcher 0 hosts the job's rendezvous"):
        elastic.leave(run_path, 0)
    with pytest.raises(elastic.ElasticError, match="no launcher that joined is running"):
        elastic.leave(run_path)
    with pytest.raises(elastic.ElasticError, match="no standby launcher is waiting"):
        elastic.activate(run_path)
    with pytest.raises(elastic.ElasticError, match="no launcher is running"):
        elastic.stop(run_path)


def test_worlds_log_is_read_back_and_a_line_cut_by_a_kill_is_skipped(tmp_path: Path) -> None:
    from trainers.observe.world_log import WorldLog

    log = WorldLog(tmp_path, enabled=True, world=3)
    log.started(step=40, phase="batch", epoch=0, resumed=True)
    log.stepped(41)
    log.stepped(42)  # only a world's first step is written
    log.stopped(step=45, checkpoint="ckpt/step-45", ranks=1)
    WorldLog(tmp_path, enabled=False, world=3).stepped(1)  # ranks other than 0 write nothing
    with open(tmp_path / elastic.WORLDS_FILE, "a") as fh:
        fh.write('{"event": "start", "ti')
    events = elastic.read_worlds(tmp_path)
    assert [e["event"] for e in events] == ["start", "first_step", "stop"]
    assert events[0]["step"] == 40 and events[0]["resumed"] and events[1]["step"] == 41 and events[2]["ranks"] == 1
    assert all(e["world"] == 3 for e in events) and json.dumps(events)


def test_the_local_backend_starts_launcher_0_of_an_elastic_job(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from slipstream_airflow import local_launch

    started: list[list[str]] = []

    class Started(Exception):
        pass

    def run(self: local_launch.LocalProcess, on_line: Any = None) -> int:
        started.append(self.command)
        raise Started

    monkeypatch.setattr(local_launch.LocalProcess, "run", run)
    op = local_launch.LocalTorchrunOperator(task_id="train_local")
    spec = TrainJobSpec(run_id="r1", config_path="/c.yaml", max_nodes=3, env=settings.as_env())
    with pytest.raises(Started):
        op.run_spec(spec)
    (cmd,) = started
    assert cmd[1:3] == ["-m", "trainers.launch"] and cmd[cmd.index("--nnodes") + 1] == "1:3"
    host = cmd[cmd.index("--rdzv-endpoint") + 1].rsplit(":", 1)[0]
    assert host == "127.0.0.1" and cmd[cmd.index("--job-dir") + 1] == str(Path(settings.runs_dir) / "r1" / "elastic")


def test_join_needs_the_first_launcher_running(tmp_path: Path) -> None:
    run_path = tmp_path / "r1"
    job = elastic.ElasticJob(endpoint="127.0.0.1:4321", rdzv_id="r1", nnodes="1:3", nproc_per_node=1, max_restarts=3,
                             shutdown_timeout_s=60, rdzv_conf={}, module="trainers.train", trainer_args=[])
    elastic.write_job(elastic.job_dir(run_path), job)
    assert elastic.read_job(run_path) == job
    elastic.write_launcher(elastic.job_dir(run_path), elastic.Launcher(0, pid=2**22 + 9, addr="127.0.0.1"))
    with pytest.raises(elastic.ElasticError, match="first launcher .* is not running"):
        elastic.join(run_path)
    assert [la.index for la in elastic.launchers(run_path)] == [0]  # nothing was started or reserved
