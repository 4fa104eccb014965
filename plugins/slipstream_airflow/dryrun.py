"""What a dry run (`dry_run=true`) shows: exactly what the launch task would start, without starting it.

Each launch task renders its own launch on a dry run — the local torchrun command and environment,
the training or warmup pod as the KubernetesPodOperator would submit it, the PyTorchJob manifest —
and writes it into its task log (YAML) and its XCom (`manifest`), with a warning for every value
that only means something on the Airflow worker that rendered it (a `file://` warehouse, a
`127.0.0.1` broker: `slipstream.pipeline.jobspec.worker_local_values`). Secrets never appear:
pods get them as `secretKeyRef`s, a local child from the settings file.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from slipstream.pipeline.jobspec import TrainJobSpec, worker_local_values
from slipstream.pipeline.runlayout import run_dir
from slipstream.pipeline.runplan import PLAN_FILE, RunPlan, read_plan
from slipstream.settings import Settings
from slipstream_airflow.jobxcom import RenderedJob, dry_run_result


def worker_plan(spec: TrainJobSpec) -> RunPlan | None:
    """The run's plan as this worker sees it (None when the worker does not mount the runs folder)."""
    path = run_dir(Settings.from_env(), spec.run_id) / PLAN_FILE
    return read_plan(path) if Path(path).exists() else None


def manifest_text(manifest: Mapping[str, Any]) -> str:
    text: str = yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False, width=120)
    return text


def report_dry_run(log: logging.Logger | Any, job: RenderedJob, what: str, manifest: Mapping[str, Any],
                   warnings: list[str]) -> dict[str, Any]:
    """Log the rendered launch and its warnings; the task's XCom: what it would have started."""
    log.info("dry run: run %s would start this %s (nothing is started):\n%s", job.spec.run_id, what,
             manifest_text(manifest))
    for warning in warnings:
        log.warning("dry run: worker-local value in a Kubernetes launch: %s", warning)
    return {**dry_run_result(job), "rendered": what, "manifest": dict(manifest), "warnings": list(warnings)}


def kubernetes_warnings(spec: TrainJobSpec) -> list[str]:
    return worker_local_values(spec, worker_plan(spec))
