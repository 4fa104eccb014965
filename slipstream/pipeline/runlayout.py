"""The run folder `<runs_dir>/<run_id>/` from the orchestrator's side: ids, lineage, summary.

The trainer writes `metrics.json` (docs/trainer.md, Run layout); the orchestrator passes only a small
lineage dict between tasks (`training_lineage`) and collects what each stage decided into
`summary.json`, the one file a person reads to see what a run did.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from slipstream.errors import ConfigError, SlipstreamError
from slipstream.pipeline.run_metrics import parse_run_metrics
from slipstream.settings import Settings

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.json"
REPORT_FILE = "report.html"
CHECKPOINT_DIR = "checkpoint"
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a run id may look like (`make_run_id` makes `daily-20261104-90b3e01c`): a path segment,
never `..` or a separator, so a run id from a URL can name a folder safely."""

LINEAGE_KEYS = (
    "run_id", "snapshot_id", "t_handoff", "window_start", "handoff_offsets", "final_offsets",
    "checkpoint", "auc", "auc_lo", "auc_hi", "auc_rows", "auc_on", "logloss", "samples_iceberg", "samples_kafka",
)
"""What travels by XCom after training: ids, offsets, paths and headline scores — never data."""


class RunArtifactMissing(SlipstreamError):
    """An expected file of the run layout is missing (the step that writes it did not finish)."""


def make_run_id(kind: str, data_interval_end: datetime, dag_run_id: str) -> str:
    """`<kind>-<YYYYMMDD>-<8 hex>`: stable for one DAG run (a retry resumes the same run folder),
    distinct for two manual triggers on the same day."""
    return f"{kind}-{data_interval_end:%Y%m%d}-{dag_run_digest(dag_run_id)}"


def dag_run_digest(dag_run_id: str) -> str:
    """The last part of the run ids of one DAG run: how a run folder is found from Airflow's run id."""
    return hashlib.sha1(dag_run_id.encode("utf-8")).hexdigest()[:8]


def runs_root(settings: Settings) -> Path:
    """The folder that holds every run folder (SLIPSTREAM_RUNS_DIR, a mounted path)."""
    if "://" in settings.runs_dir and not settings.runs_dir.startswith("file://"):
        raise ConfigError(
            f"SLIPSTREAM_RUNS_DIR={settings.runs_dir} is an object store; the orchestrator reads run "
            "summaries from a mounted path (mount the runs volume and point SLIPSTREAM_RUNS_DIR at it)"
        )
    return Path(settings.runs_dir.removeprefix("file://"))


def run_dir(settings: Settings, run_id: str) -> Path:
    """The run folder of `run_id` under SLIPSTREAM_RUNS_DIR: the one place a run's path is made."""
    return run_folder(runs_root(settings), run_id)


def run_folder(root: str | Path, run_id: str) -> Path:
    """`<root>/<run_id>`, once the id is checked to be a plain folder name (never `..` or a path)."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id):
        raise ConfigError(f"run id {run_id!r} is not a run folder name (letters, digits, '.', '_', '-'; at most 128)")
    return Path(root) / run_id


def has_checkpoint(run_path: Path) -> bool:
    """Whether the trainer committed a checkpoint in this run folder (`checkpoint/latest`)."""
    return (run_path / CHECKPOINT_DIR / "latest").is_file()


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunArtifactMissing(f"{what} not found at {path}: the step that writes it did not finish; see its log") from None
    except json.JSONDecodeError as e:
        raise RunArtifactMissing(f"{what} at {path} is not valid JSON ({e}); re-run the step that writes it") from None
    if not isinstance(data, dict):
        raise RunArtifactMissing(f"{what} at {path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_metrics(run_path: Path) -> dict[str, Any]:
    return read_json(run_path / METRICS_FILE, "the trainer's metrics.json")


def training_lineage(run_path: Path, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The small XCom of a finished training: lineage keys present in metrics, plus paths."""
    typed = parse_run_metrics(dict(metrics)).to_dict()  # the contract's reading of every key
    out = {k: typed[k] for k in LINEAGE_KEYS if typed.get(k) not in (None, "")}
    out.setdefault("run_id", run_path.name)
    out["run_dir"] = str(run_path)
    out["metrics_path"] = str(run_path / METRICS_FILE)
    out.setdefault("checkpoint", str(run_path / "checkpoint"))
    return out


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write via a temp file and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update_summary(run_path: Path, section: str, data: Mapping[str, Any]) -> Path:
    """Replace one section of `summary.json` (idempotent: a re-run of a step overwrites its section)."""
    path = run_path / SUMMARY_FILE
    summary = read_json(path, "run summary") if path.exists() else {}
    summary[section] = dict(data)
    write_json_atomic(path, summary)
    return path


def read_summary(run_path: Path) -> dict[str, Any]:
    return read_json(run_path / SUMMARY_FILE, "run summary")


def format_summary(summary: Mapping[str, Any]) -> str:
    """A screenful of text: one block per section, one `key: value` per line."""
    lines: list[str] = []
    for section, data in summary.items():
        lines.append(f"[{section}]")
        if isinstance(data, Mapping):
            for key, value in data.items():
                lines.append(f"  {key}: {json.dumps(value, default=str) if isinstance(value, (dict, list)) else value}")
        else:
            lines.append(f"  {data}")
    return "\n".join(lines)


def latest_run_dir(settings: Settings, kind: str = "daily", t_handoff: datetime | None = None) -> Path:
    """The newest run folder of a kind (and T, if given): what `make demo` prints after
    `airflow dags test`, whose DAG run id the caller does not know in advance."""
    prefix = f"{kind}-{t_handoff:%Y%m%d}-" if t_handoff is not None else f"{kind}-"
    runs = run_folders(settings, f"{prefix}*")
    if not runs:
        raise RunArtifactMissing(f"no run folder {prefix}* under {runs_root(settings)}: did the DAG run reach its first task?")
    return runs[0]


def run_folders(settings: Settings, pattern: str = "*") -> list[Path]:
    """The run folders whose names match the glob `pattern`, newest (last changed) first."""
    root = runs_root(settings)
    if not root.exists():
        return []
    found = [p for p in root.glob(pattern) if p.is_dir() and RUN_ID_PATTERN.fullmatch(p.name)]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


RUN_KINDS: dict[str, str] = {"daily": "daily_retrain", "stream": "stream_train", "preprocess": "preprocess_samples"}
"""The DAG whose runs make the run folders of each kind (the first part of a run id). A folder
of another kind (a trainer run started by hand) belongs to no DAG."""


def dag_of_run(run_id: str) -> str | None:
    """The DAG a run folder belongs to, by its kind; None for one no DAG makes."""
    return RUN_KINDS.get(run_id.split("-", 1)[0])


def run_dirs_of_dag_run(settings: Settings, dag_id: str, dag_run_id: str) -> list[Path]:
    """The run folders one Airflow DAG run of `dag_id` created, newest first: `make_run_id` ends
    every run id of a DAG run with the digest of the DAG run's id, and only folders of the DAG's
    own kinds count (two DAGs share run ids such as `scheduled__<date>`)."""
    digest = dag_run_digest(dag_run_id)
    found = [p for kind, dag in RUN_KINDS.items() if dag == dag_id for p in run_folders(settings, f"{kind}-*-{digest}")]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


@dataclass(frozen=True)
class RunListing:
    """One run folder as a person scans a list of runs."""

    run_id: str
    path: Path
    modified: datetime
    has_report: bool
    stages: tuple[str, ...]
    """The sections of summary.json, in the order the steps wrote them (what the run got through)."""


def list_runs(settings: Settings, limit: int = 200) -> list[RunListing]:
    """The newest `limit` run folders under the runs dir, newest first."""
    return [run_listing(p) for p in run_folders(settings)[:limit]]


def run_listing(path: Path) -> RunListing:
    """What a list of runs shows of one run folder."""
    try:
        stages = tuple(read_summary(path)) if (path / SUMMARY_FILE).exists() else ()
    except RunArtifactMissing:  # a broken summary: list the run anyway
        stages = ()
    return RunListing(path.name, path, datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc),
                      (path / REPORT_FILE).is_file(), stages)
