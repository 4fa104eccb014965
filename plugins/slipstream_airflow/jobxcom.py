"""The small typed XComs of the training DAGs: the run's plan (`PlanRef`) and its job (`RenderedJob`).

The step that pins the snapshot writes the run's plan.json and hands on only its path; every later
task reads the plan from there. The `render_job` task renders the `TrainJobSpec` once from the plan
and returns it as a small dict; every backend operator pulls the same dict, so a local run, a pod
and a PyTorchJob of the same DAG run execute exactly the same command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slipstream.pipeline.jobspec import TrainJobSpec
from slipstream.pipeline.runplan import PLAN_FILE, RunPlan, read_plan


@dataclass(frozen=True)
class PlanRef:
    """Where a run's plan.json is (on the runs volume every task of the DAG mounts)."""

    path: str

    @property
    def run_id(self) -> str:
        return Path(self.path).parent.name

    def load(self) -> RunPlan:
        return read_plan(Path(self.path))

    def to_xcom(self) -> dict[str, str]:
        return {"plan": self.path, "run_id": self.run_id}

    @classmethod
    def from_xcom(cls, value: Mapping[str, Any] | None, *, task_id: str) -> PlanRef:
        path = (value or {}).get("plan")
        if not isinstance(path, str) or Path(path).name != PLAN_FILE:
            raise ValueError(f"the XCom of task {task_id!r} names no run plan ({value!r}): it must run (and succeed) first")
        return cls(path)


RENDER_TASK_ID = "render_job"
JOB_XCOM_KEY = "job"
"""The render task is a branch (its return value names the launch tasks), so the job travels
under its own key."""


@dataclass(frozen=True)
class RenderedJob:
    spec: TrainJobSpec
    launch: str  # local | pod | pytorchjob
    dry_run: bool
    warmup_args: list[str]

    @property
    def argv(self) -> list[str]:
        """The torchrun command (a multi-node job meets at its PyTorchJob master's service)."""
        return self.spec.torchrun_args(rdzv_host=master_host(self.spec))

    def to_xcom(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "launch": self.launch,
            "dry_run": self.dry_run,
            "warmup_args": list(self.warmup_args),
            "argv": self.argv,  # for people reading the XCom tab; launches re-render from spec
        }

    @classmethod
    def from_xcom(cls, value: Mapping[str, Any] | None, *, task_id: str = RENDER_TASK_ID) -> RenderedJob:
        if not value:
            raise ValueError(f"no job spec in the XCom of task {task_id!r}: it must run (and succeed) before a launch")
        return cls(TrainJobSpec.from_dict(value["spec"]), value["launch"], bool(value["dry_run"]), list(value["warmup_args"]))


def pull_job(context: Mapping[str, Any], task_id: str = RENDER_TASK_ID) -> RenderedJob:
    return RenderedJob.from_xcom(context["ti"].xcom_pull(task_ids=task_id, key=JOB_XCOM_KEY), task_id=task_id)


LAUNCH_TASKS = {
    # launch kind -> (warmup task, training task) of daily_retrain
    "local": ("warmup_local", "train_local"),
    "pod": ("warmup_pod", "train_pod"),
    "pytorchjob": ("warmup_pod", "train_pytorchjob"),
}
TRAIN_TASK_IDS = tuple(sorted({train for _, train in LAUNCH_TASKS.values()}))


def launch_kind(backend: str, nnodes: int) -> str:
    """`nnodes`: the most nodes the job may span (an elastic job's max_nodes)."""
    if backend == "local":
        return "local"
    return "pytorchjob" if nnodes > 1 else "pod"


def master_host(spec: TrainJobSpec) -> str:
    """The service of the pod that hosts the rendezvous: the training operator names the master
    replica's `<job>-master-0`; an elastic job has workers only and meets at `<job>-worker-0`."""
    return f"{spec.k8s_name}-worker-0" if spec.elastic else f"{spec.k8s_name}-master-0"


def dry_run_result(job: RenderedJob) -> dict[str, Any]:
    return {"dry_run": True, "run_id": job.spec.run_id, "launch": job.launch, "argv": job.argv}
