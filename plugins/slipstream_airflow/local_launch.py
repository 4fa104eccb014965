"""The embedded backend: the job spec's torchrun command as a local subprocess.

torchrun runs as `trainers.parallel.torchrun_loopback` (torchrun whose stores listen on
127.0.0.1 only) with a c10d rendezvous on a free 127.0.0.1 port picked at launch, so two local runs
never collide and nothing of a training run listens off the loopback interface.
It runs in its own process group so that stopping it reaches every worker it spawned.
It is stopped when the task is killed (Airflow calls `on_kill` on SIGTERM and on
execution timeout; the supervisor's SIGINT arrives as KeyboardInterrupt), so a cancelled run never
leaves trainers behind.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from slipstream.pipeline import elastic
from slipstream.pipeline.jobspec import TrainJobSpec
from slipstream.pipeline.runlayout import read_metrics, run_dir, training_lineage
from slipstream.processes import descendants, pid_alive, signal_quietly
from slipstream.settings import SECRET_FIELDS, Settings
from slipstream_airflow.dryrun import report_dry_run
from slipstream_airflow.jobxcom import RENDER_TASK_ID, pull_job
from slipstream_airflow.kafka_connection import kafka_child_env, with_kafka_connection

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK_TORCHRUN = "trainers.parallel.torchrun_loopback"


class TorchrunFailed(RuntimeError):
    pass


def local_command(argv: Sequence[str]) -> list[str]:
    """Run torchrun as this interpreter's loopback-only torchrun (the same venv as the worker,
    whatever PATH says; every store on 127.0.0.1)."""
    if argv and argv[0] == "torchrun":
        return [sys.executable, "-m", LOOPBACK_TORCHRUN, *argv[1:]]
    return list(argv)


def local_manifest(spec: TrainJobSpec) -> dict[str, Any]:
    """What a local launch runs: the command (its rendezvous port is picked when it starts) and
    the environment the spec gives the child (no secret: the child reads those from the settings file)."""
    secret_vars = {f"SLIPSTREAM_{f.upper()}" for f in SECRET_FIELDS}
    return {"command": local_command(spec.torchrun_args()),
            "rendezvous": "c10d on 127.0.0.1, a free port picked at launch",
            "env": {k: v for k, v in sorted(spec.env.items()) if k not in secret_vars}}


def child_env(spec: TrainJobSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(spec.env)
    # the trainer and slipstream import from the repository checkout in the embedded setup
    paths = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class LocalProcess:
    """A subprocess in its own process group, stoppable from another thread or a signal handler."""

    def __init__(self, command: list[str], env: Mapping[str, str], *, kill_grace_s: float) -> None:
        self.command = command
        self.env = dict(env)
        self.kill_grace_s = kill_grace_s
        self.proc: subprocess.Popen[bytes] | None = None

    def run(self, on_line: Any = None) -> int:
        self.proc = subprocess.Popen(
            self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                (on_line or log.info)("%s", line)
            return self.proc.wait()
        except BaseException:
            # KeyboardInterrupt from the supervisor's SIGINT, a timeout, anything: no orphans
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM torchrun and every worker (torchrun starts each worker in its own session, so
        the process group alone does not reach them); SIGKILL what is left after the grace."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        tree = [proc.pid, *descendants(proc.pid)]
        log.warning("stopping %s: pids %s", self.command[:3], tree)
        signal_quietly(proc.pid, signal.SIGTERM, group=True)
        for pid in tree[1:]:
            signal_quietly(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace_s
        while time.monotonic() < deadline:
            proc.poll()
            if not any(pid_alive(pid) for pid in tree):
                return
            time.sleep(0.1)
        signal_quietly(proc.pid, signal.SIGKILL, group=True)
        for pid in tree:
            signal_quietly(pid, signal.SIGKILL)
        proc.wait()


class LocalTorchrunOperator(BaseOperator):
    """Runs the rendered job's torchrun command here; returns the run's lineage (small XCom)."""

    ui_color = "#e8f4ea"

    def __init__(self, *, job_task_id: str = RENDER_TASK_ID, kill_grace_s: float = 30.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.job_task_id = job_task_id
        self.kill_grace_s = kill_grace_s
        self._process: LocalProcess | None = None

    def execute(self, context: Any) -> dict[str, Any]:
        job = pull_job(context, self.job_task_id)
        if job.dry_run:
            return report_dry_run(self.log, job, "local torchrun", local_manifest(job.spec), [])
        return self.run_spec(job.spec)

    def run_spec(self, spec: TrainJobSpec) -> dict[str, Any]:
        run_path = run_dir(Settings.from_env(spec.env), spec.run_id)
        if spec.elastic:  # launcher 0 of a job that `slipstream elastic join` grows (slipstream.pipeline.elastic)
            argv = spec.torchrun_args(rdzv_host=elastic.LOOPBACK, rdzv_port=elastic.free_loopback_port())
            command = elastic.local_launch_command(run_path, argv)
        else:
            command = local_command(spec.torchrun_args(rdzv_port=elastic.free_loopback_port()))
        self.log.info("starting %s world size %d: %s", spec.run_id, spec.world_size, " ".join(command))
        started = time.monotonic()
        # Kafka credentials from the Airflow connection go to the child's environment only, never to the spec
        env = {**child_env(spec), **kafka_child_env(with_kafka_connection(Settings.from_env()))}
        self._process = LocalProcess(command, env, kill_grace_s=self.kill_grace_s)
        rc = self._process.run(on_line=self.log.info)
        if rc != 0:
            raise TorchrunFailed(
                f"torchrun for run {spec.run_id} exited with {rc} after {time.monotonic() - started:.0f}s; "
                f"the trainer's output is in this task's log above, its files under {run_path}"
            )
        lineage = training_lineage(run_path, read_metrics(run_path))
        self.log.info("run %s finished in %.0fs: %s", spec.run_id, time.monotonic() - started, lineage)
        return lineage

    def on_kill(self) -> None:
        if self._process is not None:
            self._process.stop()
