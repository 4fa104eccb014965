"""Launching the Spark preprocessing job as a process, and reading its one-line JSON summary.

Airflow tasks, the demo and the benchmark call `run_preprocess` / `run_preprocess_days`; they never
import pyspark (layering): the job runs as `python -m spark_jobs.preprocess` (Spark `local[*]`, or a
client of a warm Spark Connect server with `SLIPSTREAM_SPARK_REMOTE`) or through `spark-submit` on
a cluster (`SLIPSTREAM_SPARK_MASTER` / `SLIPSTREAM_SPARK_SUBMIT`). Any number of days is one range
job: one Spark pass and one snapshot.
The job's log (stderr) is streamed line by line into this module's logger, so an Airflow task log
shows Spark's progress as it happens.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import Any

from slipstream import errors
from slipstream.errors import PreprocessError
from slipstream.lake.raw_zone import raw_day_ready
from slipstream.pipeline.code_bundle import code_zip
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.settings import Settings

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB_MODULE = "spark_jobs.preprocess"
STDERR_TAIL_LINES = 40
__all__ = [
    "PreprocessResult",
    "preprocess_command",
    "preprocess_days_command",
    "raw_day_ready",
    "run_preprocess",
    "run_preprocess_days",
]


@dataclass(frozen=True)
class PreprocessResult:
    """What one committed day produced. `snapshot_id` pins the table state for later tasks."""

    day: date
    snapshot_id: int | None
    rows: int
    rejects: int
    seconds: float
    empty: bool = False
    """The day had no raw events: skipped with a warning, nothing committed."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["day"] = self.day.isoformat()
        return d


def _job_args(days: Sequence[date], run_id: str, opts: dict[str, Any]) -> list[str]:
    known = {"raw_dir", "spec", "attribution_s", "max_reject_rate", "target_file_mb", "write_mode", "summary_out",
             "day_by_day", "spark", "timeout_s", "env"}
    unknown = set(opts) - known
    if unknown:
        raise errors.ConfigError(f"unknown preprocess option(s) {sorted(unknown)}; known: {sorted(known)}")
    if not days:
        raise errors.ConfigError("preprocess needs at least one day")
    if not run_id or any(c.isspace() for c in run_id):
        raise errors.ConfigError(f"run_id must be a non-empty string without spaces, got {run_id!r}")
    args: list[str] = []
    for d in days:
        args += ["--day", d.isoformat()]
    args += ["--run-id", run_id]
    for name in ("raw_dir", "spec", "attribution_s", "max_reject_rate", "target_file_mb", "write_mode", "summary_out"):
        if opts.get(name) is not None:
            args += [f"--{name.replace('_', '-')}", str(opts[name])]
    if opts.get("day_by_day"):  # one commit per day (the path before the range job; a reference for it)
        args.append("--day-by-day")
    return args


def preprocess_days_command(settings: Settings, days: Sequence[date], run_id: str, **opts: Any) -> list[str]:
    """The argument list that preprocesses `days` in one Spark pass (one snapshot for all of them)."""
    spark = job_spark_settings(settings, opts)
    job_args = _job_args(days, run_id, opts)
    if not spark.uses_submit:
        return [sys.executable, "-m", JOB_MODULE, *job_args]
    cmd = [spark.submit or spark_submit(), "--master", spark.master, "--deploy-mode", spark.deploy_mode,
           "--name", f"slipstream-preprocess-{run_id}"]
    if spark.py_files:
        cmd += ["--py-files", spark.py_files]
    for k, v in spark.spark_conf().items():
        cmd += ["--conf", f"{k}={v}"]
    return [*cmd, spark.app or str(REPO_ROOT / "spark_jobs" / "preprocess.py"), *job_args]


def job_spark_settings(settings: Settings, opts: dict[str, Any]) -> SparkSettings:
    """The Spark settings the job runs with: given, or from the environment over the home's
    settings file. On a cluster without SLIPSTREAM_SPARK_PY_FILES, this checkout's code is zipped
    and shipped with --py-files (executors must not depend on what is on their path)."""
    spark: SparkSettings = opts.get("spark") or SparkSettings.for_home(settings.home)
    if spark.is_local or spark.py_files:
        return spark
    return dataclasses.replace(spark, py_files=str(code_zip(REPO_ROOT, settings.home / "spark" / "code")))


def spark_submit() -> str:
    """spark-submit next to this interpreter (the pyspark wheel's), else the one on PATH."""
    local = Path(sys.executable).parent / "spark-submit"
    return str(local) if local.exists() else "spark-submit"


def preprocess_command(settings: Settings, day: date, run_id: str, **opts: Any) -> list[str]:
    """The argument list that preprocesses one `day` (what an Airflow task or BashOperator runs)."""
    return preprocess_days_command(settings, [day], run_id, **opts)


def _child_env(settings: Settings, spark: SparkSettings, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(settings.as_env())
    env.update(spark.as_env())
    path = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.update(extra or {})
    return env


def _pump(stream: Any, tail: deque[str]) -> None:
    for raw in iter(stream.readline, ""):
        line = raw.rstrip("\n")
        tail.append(line)
        log.info("[spark] %s", line)
    stream.close()


def _parse_summary(stdout: str, summary_out: str | None) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                summary: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                continue
            return summary
    if summary_out and Path(summary_out).exists():
        written: dict[str, Any] = json.loads(Path(summary_out).read_text())
        return written
    return None


def _failure(days: Sequence[date], run_id: str, summary: dict[str, Any] | None, rc: int, tail: deque[str]) -> Exception:
    """The domain error the job reported (RawDataError, RejectRateExceeded, ...) or PreprocessError."""
    what = f"preprocessing {', '.join(d.isoformat() for d in days)} (run {run_id})"
    tail_text = "\n".join(tail)
    if summary and summary.get("error"):
        cls = getattr(errors, str(summary.get("error_type")), None)
        done = [d["day"] for d in summary.get("days", [])]
        note = f" (days committed before the failure: {', '.join(done)})" if done else ""
        if isinstance(cls, type) and issubclass(cls, errors.SlipstreamError):
            # A data problem the job diagnosed: its message is the useful part, the log is above.
            return cls(f"{what} failed: {summary['error']}{note}")
        return PreprocessError(f"{what} failed: {summary['error']}{note}\n--- last lines of the job's log ---\n{tail_text}")
    return PreprocessError(
        f"{what} exited with status {rc} without a summary (did Spark/Java start?). "
        f"Last lines of its log:\n{tail_text}"
    )


def run_preprocess_days(settings: Settings, days: Sequence[date], run_id: str, **opts: Any) -> list[PreprocessResult]:
    """Preprocess `days` in one Spark pass and one Iceberg snapshot (the range job). Raises the job's domain
    error (`RawDataError`, `RejectRateExceeded`, `CommitConflict`) or `PreprocessError`, with the
    tail of the job's log."""
    spark = job_spark_settings(settings, opts)
    cmd = preprocess_days_command(settings, days, run_id, **{**opts, "spark": spark})
    log.info("running %s", " ".join(cmd))
    t0 = time.monotonic()
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=_child_env(settings, spark, opts.get("env")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    out_lines: list[str] = []
    out_pipe = proc.stdout
    assert out_pipe is not None  # stdout=PIPE
    pumps = [
        threading.Thread(target=_pump, args=(proc.stderr, tail), daemon=True),
        threading.Thread(target=lambda: out_lines.extend(out_pipe), daemon=True),
    ]
    for p in pumps:
        p.start()
    try:
        proc.wait(timeout=opts.get("timeout_s"))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise PreprocessError(
            f"preprocessing run {run_id} took longer than {opts.get('timeout_s')}s and was stopped; "
            "raise the timeout or give Spark more resources\n" + "\n".join(tail)
        ) from None
    finally:
        for p in pumps:
            p.join(timeout=10)
    stdout = "".join(out_lines)
    summary = _parse_summary(stdout, opts.get("summary_out"))
    if proc.returncode != 0 or summary is None or summary.get("error"):
        raise _failure(days, run_id, summary, proc.returncode, tail)
    results = [
        PreprocessResult(date.fromisoformat(d["day"]), d["snapshot_id"], int(d["rows"]), int(d["rejects"]),
                         float(d["seconds"]), bool(d.get("empty", False)))
        for d in summary["days"]
    ]
    log.info("preprocessed %d day(s) in %.1fs: %s", len(results), time.monotonic() - t0,
             ", ".join(f"{r.day} rows={r.rows} rejects={r.rejects} snapshot={r.snapshot_id}" for r in results))
    for r in results:
        if r.empty:
            log.warning("day %s had no raw events: skipped (nothing committed)", r.day)
    return results


def run_preprocess(settings: Settings, day: date, run_id: str, **opts: Any) -> PreprocessResult:
    """Preprocess one day (replacing it in `samples`) and return what was committed."""
    (result,) = run_preprocess_days(settings, [day], run_id, **opts)
    return result
