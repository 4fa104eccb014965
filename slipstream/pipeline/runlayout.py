"""The run folder `<runs_dir>/<run_id>/` from the orchestrator's side: ids, attempts, lineage, summary.

The trainer writes `metrics.json` (docs/trainer.md, Run layout); the orchestrator passes only a small
lineage dict between tasks (`training_lineage`) and collects what each stage decided into
`summary.json`, the one file a person reads to see what a run did.

One Airflow DAG run may train more than once: re-running it (Clear) after its data changed gives
it a new **attempt**, a run folder of its own next to the first — `daily-20261104-90b3e01c` is
attempt 1, `daily-20261104-90b3e01c-a2` attempt 2 — with its own plan, checkpoint, metrics and
report. A plan never changes once written, so every folder is consistent: what it holds was
trained on the plan beside it. `run.json` says whose attempt a folder is (DAG, DAG run, data set,
attempt number, why it exists).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slipstream.errors import ConfigError, SlipstreamError
from slipstream.pipeline.run_metrics import parse_run_metrics
from slipstream.settings import Settings

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
RUN_INFO_FILE = "run.json"
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
    distinct for two manual triggers on the same day. `kind` carries the data set where a
    deployment has several (`daily-criteo`). This is the id of the DAG run's first attempt."""
    return f"{kind}-{data_interval_end:%Y%m%d}-{dag_run_digest(dag_run_id)}"


ATTEMPT_SUFFIX = re.compile(r"-a([0-9]{1,4})$")


def attempt_run_id(base: str, attempt: int) -> str:
    """The run id of attempt `attempt` (1, 2, ...) of the DAG run whose first attempt is `base`."""
    if attempt < 1:
        raise ConfigError(f"attempts count from 1, got {attempt}")
    return base if attempt == 1 else f"{base}-a{attempt}"


def attempt_of(run_id: str) -> tuple[str, int]:
    """(first attempt's run id, attempt number) of a run id."""
    m = ATTEMPT_SUFFIX.search(run_id)
    return (run_id[: m.start()], int(m.group(1))) if m else (run_id, 1)


def attempt_dirs(settings: Settings, base: str) -> list[Path]:
    """The attempt folders of the DAG run whose first attempt is `base`, in attempt order."""
    root = runs_root(settings)
    found = [p for p in (root / base, *root.glob(f"{base}-a*")) if p.is_dir() and attempt_of(p.name)[0] == base]
    return sorted(found, key=lambda p: attempt_of(p.name)[1])


@dataclass(frozen=True)
class RunInfo:
    """`run.json`: whose attempt a run folder is, and why it exists."""

    dag_id: str
    dag_run_id: str
    dataset: str
    attempt: int = 1
    reason: str = "first attempt"
    """Why this attempt: the first one, or what changed in the plan since the one before."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def write_run_info(run_path: Path, info: RunInfo) -> Path:
    path = Path(run_path) / RUN_INFO_FILE
    write_json_atomic(path, info.to_dict())
    return path


def read_run_info(run_path: Path) -> RunInfo | None:
    """The folder's run.json, or None (a folder from before run.json, or a trainer run by hand)."""
    path = Path(run_path) / RUN_INFO_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return RunInfo(**{k: raw[k] for k in ("dag_id", "dag_run_id", "dataset", "attempt", "reason") if k in raw})
    except (ValueError, TypeError, KeyError):
        log.warning("ignoring the unreadable %s", path)
        return None


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


def dag_of_run(run_id: str, run_path: Path | None = None) -> str | None:
    """The DAG a run folder belongs to: its run.json's, else by the kind its id starts with;
    None for one no DAG makes."""
    info = read_run_info(run_path) if run_path is not None else None
    if info is not None:
        return info.dag_id
    return RUN_KINDS.get(run_id.split("-", 1)[0])


def run_dirs_of_dag_run(settings: Settings, dag_id: str, dag_run_id: str) -> list[Path]:
    """The run folders (attempts) one Airflow DAG run of `dag_id` created, latest attempt first:
    `make_run_id` puts the digest of the DAG run's id into every run id of a DAG run, and a
    folder counts when its run.json names this DAG and DAG run (a folder without run.json: when
    its kind is the DAG's; two DAGs share run ids such as `scheduled__<date>`)."""
    digest = dag_run_digest(dag_run_id)
    candidates = run_folders(settings, f"*-{digest}") + run_folders(settings, f"*-{digest}-a*")
    found = []
    for path in candidates:
        info = read_run_info(path)
        if info is not None:
            if (info.dag_id, info.dag_run_id) == (dag_id, dag_run_id):
                found.append(path)
        elif RUN_KINDS.get(path.name.split("-", 1)[0]) == dag_id:
            found.append(path)
    return sorted(set(found), key=lambda p: (attempt_of(p.name)[1], p.stat().st_mtime), reverse=True)


@dataclass(frozen=True)
class RunListing:
    """One run folder as a person scans a list of runs."""

    run_id: str
    path: Path
    modified: datetime
    has_report: bool
    stages: tuple[str, ...]
    """The sections of summary.json, in the order the steps wrote them (what the run got through)."""
    info: RunInfo | None = None
    """run.json: the DAG run and attempt (None for a folder without one)."""

    @property
    def attempt(self) -> int:
        return self.info.attempt if self.info is not None else attempt_of(self.run_id)[1]


def list_runs(settings: Settings, limit: int = 200) -> list[RunListing]:
    """The newest `limit` run folders under the runs dir, newest first."""
    return [run_listing(p) for p in run_folders(settings)[:limit]]


def run_listing(path: Path) -> RunListing:
    """What a list of runs shows of one run folder."""
    try:
        stages = tuple(read_summary(path)) if (path / SUMMARY_FILE).exists() else ()
    except RunArtifactMissing:  # a broken summary: list the run anyway
        stages = ()
    return RunListing(path.name, path, datetime.fromtimestamp(path.stat().st_mtime, tz=UTC),
                      (path / REPORT_FILE).is_file(), stages, read_run_info(path))
