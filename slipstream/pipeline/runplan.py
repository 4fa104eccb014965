"""The plan of one training run: every fact its steps share, computed once, in `<run_dir>/plan.json`.

A run is described by a handful of facts: the table and the snapshot it reads, the window
[T − W, T) (computed by `lake.planning.window_bounds`, the one place that does), the window's data
files at that snapshot (`lake.planning.plan_window_files`), the Kafka topic it tails from T and the
lateness bound of the handoff, where the node-local cache and the run folder are, and the knobs a
person asked for (`TrainRequest`). The render step builds a `RunPlan` once — `daily_retrain` right
after preprocessing pins the snapshot, `stream_train` before its first launch, the trainer itself
when it is started from a config file — and writes it atomically to `<run_dir>/plan.json`. The
quality gate, the cache warmup, the launch, the trainer, publish and the insight report read that
file: none of them re-derives the window, re-pins a snapshot or re-plans the files. A resumed run
keeps its plan, so a restart after new data landed continues where its checkpoint stopped.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slipstream.errors import ConfigError, PlanError
from slipstream.lake.planning import WindowFile, WindowPlan, pin_snapshot, plan_window_files, window_bounds
from slipstream.pipeline.request import TrainRequest
from slipstream.pipeline.runlayout import RUN_ID_PATTERN, run_dir, write_json_atomic
from slipstream.samples.spec import Spec, load_spec, spec_from_dict
from slipstream.settings import Settings

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
PLAN_VERSION = 1
"""Bumped when a key changes meaning; a reader refuses a version it does not know."""
DEFAULT_MAX_LATENESS_S = 120.0
"""How late (seconds after its event time) a record may reach Kafka, unless a plan says otherwise."""
_DERIVED = ("window_days", "file_count", "rows", "bytes")
"""Written for people reading plan.json; recomputed from the files and the window on read."""


def _utc(value: datetime, key: str) -> datetime:
    if not isinstance(value, datetime):
        raise PlanError(f"plan key {key!r} must be a datetime, got {value!r}")
    if value.tzinfo is None:
        raise PlanError(f"plan key {key!r} must be timezone-aware (UTC), got {value.isoformat()}")
    # a plain datetime: pendulum's (Airflow's data intervals) loses a stdlib zone in arithmetic
    return datetime.fromtimestamp(value.timestamp(), tz=UTC)


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """Everything the steps of one run share. Immutable; `write_plan` / `read_plan` move it."""

    run_id: str
    """Names the run folder; the same id resumes the same run."""
    table: str
    """The samples table, `namespace.table`."""
    snapshot_id: int
    """The pinned Iceberg snapshot every step reads."""
    window_start: datetime
    """T − W, UTC: the first instant of the batch window."""
    t_handoff: datetime
    """T, UTC: the batch window ends before it, the stream phase starts at it."""
    topic: str
    """Kafka topic of the sample stream."""
    bootstrap: str
    """Kafka bootstrap.servers."""
    max_lateness_s: float
    """How late a record may reach Kafka: the stream is read from the offsets of T − this."""
    cache_dir: str
    """The node-local cache, as the trainer sees it (the warmup fills it); empty: read directly."""
    run_dir: str
    """The run folder as the render step saw it. A pod mounts it elsewhere: the trainer writes to
    the folder that holds plan.json."""
    files: tuple[WindowFile, ...]
    """The window's data files at the snapshot, sorted by path: what the gate, warmup and trainer read."""
    request: TrainRequest | None = None
    """The knobs a person asked for; None when the trainer planned the run from its own config."""
    spec: Spec = field(default_factory=load_spec)
    """The data set's feature spec the samples were made with: the trainer's inputs and tables,
    the gate's suite and the report's features all follow it (plan.json carries it whole, so a
    pod needs no spec file)."""
    dlq_topic: str = ""
    """The data set's dead-letter topic for stream records that cannot be trained on (empty:
    `<topic>.dlq`; a plan written before this key reads as empty)."""

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not RUN_ID_PATTERN.fullmatch(self.run_id):
            raise PlanError(f"plan key 'run_id' must name a run folder (letters, digits, '.', '_', '-'), got {self.run_id!r}")
        if not isinstance(self.table, str) or self.table.count(".") < 1:
            raise PlanError(f"plan key 'table' must be namespace.table, got {self.table!r}")
        if isinstance(self.snapshot_id, bool) or not isinstance(self.snapshot_id, int):
            raise PlanError(f"plan key 'snapshot_id' must be an integer, got {self.snapshot_id!r}")
        start, end = _utc(self.window_start, "window_start"), _utc(self.t_handoff, "t_handoff")
        if not start < end:
            raise PlanError(f"plan window must end after it starts, got [{start.isoformat()}, {end.isoformat()})")
        object.__setattr__(self, "window_start", start)
        object.__setattr__(self, "t_handoff", end)
        lateness = self.max_lateness_s
        if isinstance(lateness, bool) or not isinstance(lateness, (int, float)) or not math.isfinite(lateness) or lateness < 0:
            raise PlanError(f"plan key 'max_lateness_s' must be a number >= 0, got {lateness!r}")
        object.__setattr__(self, "max_lateness_s", float(lateness))
        for key in ("topic", "bootstrap", "cache_dir", "run_dir", "dlq_topic"):
            if not isinstance(getattr(self, key), str):
                raise PlanError(f"plan key {key!r} must be a string, got {getattr(self, key)!r}")
        if not self.topic:
            raise PlanError("plan key 'topic' must name the Kafka topic of the sample stream, got ''")
        if not self.dlq_topic:
            object.__setattr__(self, "dlq_topic", f"{self.topic}.dlq")
        object.__setattr__(self, "files", tuple(self.files))
        if not all(isinstance(f, WindowFile) for f in self.files):
            raise PlanError("plan key 'files' must hold WindowFile entries")
        if not isinstance(self.spec, Spec):
            raise PlanError(f"plan key 'spec' must be a feature spec, got {type(self.spec).__name__}")
        if self.request is not None and self.request.window_days != self.window_days:
            raise PlanError(f"plan window spans {self.window_days} days but its request says window_days="
                            f"{self.request.window_days}: build the plan with build_run_plan")

    # --- what readers ask ---------------------------------------------------------------------
    @property
    def window(self) -> tuple[datetime, datetime]:
        return self.window_start, self.t_handoff

    @property
    def window_days(self) -> int:
        return round((self.t_handoff - self.window_start).total_seconds() / 86_400)

    @property
    def namespace(self) -> str:
        return self.table.rsplit(".", 1)[0]

    @property
    def table_name(self) -> str:
        return self.table.rsplit(".", 1)[1]

    @property
    def rows(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def window_plan(self) -> WindowPlan:
        """The file plan as `lake.planning` describes it."""
        return WindowPlan(self.table, self.snapshot_id, self.window_start, self.t_handoff, self.files)

    def data_differences(self, other: RunPlan) -> list[str]:
        """The data facts in which two plans differ (empty: they train on the same data)."""
        keys = ("table", "snapshot_id", "window_start", "t_handoff", "topic", "files", "spec")
        return [k for k in keys if getattr(self, k) != getattr(other, k)]

    def changes(self, other: RunPlan) -> list[str]:
        """Every key in which two plans differ, apart from the run id and folder (empty: a run of
        one may continue as the other); a knob of the request is named `request.<knob>`."""
        a, b = self.to_dict(), other.to_dict()
        out = []
        for key in sorted(set(a) | set(b)):
            if key in ("run_id", "run_dir", *_DERIVED) or a.get(key) == b.get(key):
                continue
            if key == "request" and isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
                ra, rb = a[key], b[key]
                out += [f"request.{k}" for k in sorted(set(ra) | set(rb)) if ra.get(k) != rb.get(k)]
            else:
                out.append(key)
        return out

    # --- plan.json ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_version": PLAN_VERSION,
            "run_id": self.run_id, "table": self.table, "snapshot_id": self.snapshot_id,
            "window_start": self.window_start.isoformat(), "t_handoff": self.t_handoff.isoformat(),
            "topic": self.topic, "dlq_topic": self.dlq_topic, "bootstrap": self.bootstrap,
            "max_lateness_s": self.max_lateness_s,
            "cache_dir": self.cache_dir, "run_dir": self.run_dir,
            "request": self.request.to_dict() if self.request is not None else None,
            "spec": {"name": self.spec.name, "version": self.spec.version, "digest": self.spec.digest,
                     "document": self.spec.to_json()},
            "files": [{"path": f.path, "size_bytes": f.size_bytes, "record_count": f.record_count,
                       "delete_files": list(f.delete_files)} for f in self.files],
            "window_days": self.window_days, "file_count": len(self.files), "rows": self.rows, "bytes": self.bytes,
        }

    @classmethod
    def from_dict(cls, raw: Any, where: str = "plan") -> RunPlan:
        """The plan a dict describes, every key checked; errors name `where` and the key."""
        if not isinstance(raw, Mapping):
            raise PlanError(f"{where} must hold a JSON object, got {type(raw).__name__}")
        version = raw.get("plan_version")
        if version != PLAN_VERSION:
            raise PlanError(f"{where} has plan_version {version!r}; this Slipstream reads version {PLAN_VERSION}: "
                            "re-render the plan (a new DAG run) or use the Slipstream that wrote it")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names - {"plan_version", *_DERIVED})
        if unknown:
            raise PlanError(f"{where} has unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        missing = sorted(n for n in names - {"request", "dlq_topic"} if n not in raw)
        if missing:
            raise PlanError(f"{where} lacks key(s) {', '.join(missing)}")
        try:
            kwargs = {n: raw[n] for n in names - {"window_start", "t_handoff", "files", "request", "spec"} if n in raw}
            kwargs["window_start"] = _parse_time(raw["window_start"], "window_start")
            kwargs["t_handoff"] = _parse_time(raw["t_handoff"], "t_handoff")
            kwargs["files"] = tuple(_parse_file(f, i) for i, f in enumerate(_list(raw["files"], "files")))
            kwargs["request"] = _parse_request(raw.get("request"))
            kwargs["spec"] = _parse_spec(raw["spec"], where)
            return cls(**kwargs)
        except PlanError as e:
            raise PlanError(f"{where}: {e}") from None


def _list(value: Any, key: str) -> list[Any]:
    if not isinstance(value, list):
        raise PlanError(f"plan key {key!r} must be a list, got {type(value).__name__}")
    return value


def _parse_time(value: Any, key: str) -> datetime:
    if not isinstance(value, str):
        raise PlanError(f"plan key {key!r} must be an ISO-8601 time, got {value!r}")
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise PlanError(f"plan key {key!r} must be an ISO-8601 time, got {value!r}") from None


def _parse_file(entry: Any, i: int) -> WindowFile:
    key = f"files[{i}]"
    if not isinstance(entry, Mapping) or set(entry) != {"path", "size_bytes", "record_count", "delete_files"}:
        raise PlanError(f"plan key {key!r} must hold path, size_bytes, record_count, delete_files; got {entry!r}")
    for name in ("size_bytes", "record_count"):
        v = entry[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise PlanError(f"plan key '{key}.{name}' must be an integer >= 0, got {v!r}")
    deletes = _list(entry["delete_files"], f"{key}.delete_files")
    if not isinstance(entry["path"], str) or not entry["path"] or not all(isinstance(d, str) for d in deletes):
        raise PlanError(f"plan key '{key}.path' and its delete_files must be paths, got {entry!r}")
    return WindowFile(entry["path"], entry["size_bytes"], entry["record_count"], tuple(deletes))


def _parse_spec(value: Any, where: str) -> Spec:
    """The spec a plan carries: its document as JSON text (the order of features is the order of
    columns, and plan.json is written with sorted keys), checked against its digest."""
    if not isinstance(value, Mapping) or not isinstance(value.get("document"), str):
        raise PlanError("plan key 'spec' must hold the spec's document as JSON text under 'document'")
    try:
        doc = json.loads(value["document"])
    except ValueError as e:
        raise PlanError(f"plan key 'spec.document' is not JSON ({e})") from None
    spec = spec_from_dict(doc, f"{where} key 'spec'")
    if value.get("digest") not in (None, spec.digest):
        raise PlanError(f"plan key 'spec' says digest {value.get('digest')} but its document's is {spec.digest}: "
                        "the plan was edited; re-render it")
    return spec


def _parse_request(value: Any) -> TrainRequest | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PlanError(f"plan key 'request' must be an object of knobs, got {value!r}")
    known = {f.name for f in fields(TrainRequest)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise PlanError(f"plan key 'request' has unknown knob(s) {', '.join(unknown)}")
    try:
        return TrainRequest(**value)
    except ConfigError as e:
        raise PlanError(f"plan key 'request': {e}") from None


def plan_path(run_path: Path) -> Path:
    """Where a run folder keeps its plan."""
    return Path(run_path) / PLAN_FILE


def write_plan(plan: RunPlan, run_path: Path | None = None) -> Path:
    """Write `plan.json` into the run folder (atomically: a reader never sees half a plan)."""
    path = plan_path(Path(run_path) if run_path is not None else Path(plan.run_dir))
    write_json_atomic(path, plan.to_dict())
    log.info("plan of run %s: snapshot %s, window [%s, %s), %d files (%d rows) -> %s", plan.run_id, plan.snapshot_id,
             plan.window_start.isoformat(), plan.t_handoff.isoformat(), len(plan.files), plan.rows, path)
    return path


def read_plan(path: Path) -> RunPlan:
    """The plan in `path` (a plan.json), validated; a PlanError names the file and the key."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"no plan at {path}: the run's render step writes it (re-run it, or start the trainer "
                        "with --config/--set instead of --plan)") from None
    except (OSError, ValueError) as e:
        raise PlanError(f"plan {path} is unreadable ({e}): re-render it") from None
    return RunPlan.from_dict(raw, where=str(path))


def build_run_plan(table: Table, *, run_id: str, run_dir: str | Path, t_handoff: datetime, window_days: int,
                   snapshot_id: int | None, topic: str, bootstrap: str, cache_dir: str,
                   max_lateness_s: float = DEFAULT_MAX_LATENESS_S, request: TrainRequest | None = None,
                   spec: Spec | None = None, dlq_topic: str = "") -> RunPlan:
    """Pin the snapshot (None: the current one, now), compute the window and plan its files: the
    one place a run's window and files are worked out."""
    if request is not None and request.window_days != window_days:
        raise ConfigError(f"window_days={window_days} but the request says {request.window_days}")
    start, end = window_bounds(t_handoff, window_days)
    snapshot = pin_snapshot(table, snapshot_id)
    files = plan_window_files(table, snapshot, start, end).files
    return RunPlan(run_id=run_id, table=".".join(table.name()), snapshot_id=snapshot, window_start=start,
                   t_handoff=end, topic=topic, bootstrap=bootstrap, max_lateness_s=max_lateness_s,
                   cache_dir=cache_dir, run_dir=str(run_dir), files=files, request=request,
                   spec=spec if spec is not None else load_spec(), dlq_topic=dlq_topic)


def plan_request(settings: Settings, table: Table, *, run_id: str, request: TrainRequest, t_handoff: datetime,
                 cache_dir: str, snapshot_id: int | None = None, spec: Spec | None = None) -> RunPlan:
    """The plan of an orchestrated run: the request's window ending at T, the data set's topics,
    the broker and run folder (`build_run_plan` does the work)."""
    return build_run_plan(table, run_id=run_id, run_dir=run_dir(settings, run_id), t_handoff=t_handoff,
                          window_days=request.window_days, snapshot_id=snapshot_id, topic=settings.topic,
                          bootstrap=settings.kafka_bootstrap, cache_dir=cache_dir, request=request,
                          spec=spec if spec is not None else load_spec(settings.spec), dlq_topic=settings.dlq_topic)


def check_plan_files(table: Table, plan: RunPlan) -> None:
    """Refuse a plan whose files are not exactly the window's files at its snapshot (an edited
    plan, or one built for another table): the trainer must read what the warmup copied."""
    pin_snapshot(table, plan.snapshot_id)
    actual = {f.path: f for f in plan_window_files(table, plan.snapshot_id, plan.window_start, plan.t_handoff).files}
    planned = {f.path: f for f in plan.files}
    if actual == planned:
        return
    only_plan = sorted(set(planned) - set(actual))
    only_snap = sorted(set(actual) - set(planned))
    changed = sorted(p for p in set(planned) & set(actual) if planned[p] != actual[p])
    parts = [f"{what}: {', '.join(paths[:3])}{' ...' if len(paths) > 3 else ''}"
             for what, paths in (("only in the plan", only_plan), ("only in the snapshot", only_snap),
                                 ("different size or row count", changed)) if paths]
    raise PlanError(
        f"plan of run {plan.run_id} lists {len(planned)} files but the window [{plan.window_start.isoformat()}, "
        f"{plan.t_handoff.isoformat()}) of {plan.table} at snapshot {plan.snapshot_id} has {len(actual)} "
        f"({'; '.join(parts)}): the plan was edited or built for other data; render a new plan"
    )
