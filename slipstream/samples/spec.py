"""The feature spec: one YAML file per data set that every stage derives its schema from.

A spec names the raw sources and their fields (types, required or optional with a default), the
event time, the label (a click within an attribution window, a label column, or a rule such as
`rating >= 4`) and the features: ids and categoricals (hashed into buckets), multi-valued lists,
sequences (the earlier values of a field per user, from the events themselves) and dense numbers
(log1p / clip / scale; standardised by the trainer with the window's statistics). Side tables
(users, items) join the events by key. The Spark job, the Iceberg table, the Kafka codecs, the
loader and model inputs, the quality suite and the generator all read it; nothing else defines a
column.

`load_spec(path)` validates the file against `spec.schema.json` and the references between its
parts; an error names the file, the line and the key, and says what to do.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import yaml

from slipstream.errors import ConfigError

SPEC_FORMAT = 1
SCHEMA_FILE = Path(__file__).with_name("spec.schema.json")
SPECS_DIR = Path(__file__).resolve().parents[2] / "specs"
"""The specs shipped with Slipstream (`specs/<name>.yaml` in the repository)."""
DEFAULT_SPEC = "synthetic"

SAMPLE_ID = "sample_id"
EVENT_TIME = "event_time"
LABEL = "label"
RESERVED = (SAMPLE_ID, EVENT_TIME, LABEL)
"""Sample columns every spec has; no feature may take these names."""

SPARSE_KINDS = ("id", "categorical")
LIST_KINDS = ("list", "sequence")
NUMERIC_TYPES = ("long", "int", "double", "boolean")
_RULE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|==|!=|>|<)\s*(-?[0-9]+(?:\.[0-9]+)?)\s*$")


class SpecError(ConfigError):
    """A feature spec is invalid; the message names the file, line and key."""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str
    optional: bool = False
    default: Any = None

    @property
    def is_list(self) -> bool:
        return self.type.startswith("list<")


@dataclass(frozen=True)
class SourceSpec:
    name: str
    kind: str
    """`events` (one sample per record), `labels` (records that label events), `table` (side table)."""
    fields: tuple[FieldSpec, ...]
    id: str | tuple[str, ...] | None = None
    """events: the id field, or the fields hashed into an id when the log has none (`("*",)`:
    every field)."""
    time: str | None = None
    key: str | None = None
    format: str = "auto"
    header: bool = True
    columns: tuple[str, ...] = ()

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if not f.optional)


@dataclass(frozen=True)
class LabelSpec:
    kind: str
    """`click_within`, `column` or `rule`."""
    source: str | None = None
    window_s: int = 0
    field: str | None = None
    op: str | None = None
    value: float | None = None

    def describe(self) -> str:
        if self.kind == "click_within":
            return f"a {self.source} record within {self.window_s} s after the event"
        if self.kind == "column":
            return f"the field {self.field}"
        return f"{self.field} {self.op} {self.value:g}"


EVICTIONS = ("lru", "lfu", "ttl")


@dataclass(frozen=True)
class TableOptions:
    """A managed embedding table (`table: managed`): every admitted value gets a row of its own, no
    two share one; values not (yet) admitted share row 0, the "new id" row."""

    rows: int
    """Rows of the table, row 0 included: the memory it takes whatever the number of distinct values."""
    admit_after: int = 0
    """Occurrences before a value gets a row of its own (0: at its first)."""
    eviction: str = "lru"
    """How a row is freed for a new value: `lru` (the least recently seen value gives it up when the
    table is full), `lfu` (the least often seen) or `ttl` (a value not seen for `ttl_days` loses it)."""
    ttl_days: float | None = None


@dataclass(frozen=True)
class FeatureSpec:
    name: str
    kind: str
    field: str
    """An events field, or `<table>.<field>` of a side table."""
    buckets: int | None = None
    log1p: bool = False
    clip: tuple[float, float] | None = None
    scale: float = 1.0
    standardize: bool = False
    separator: str | None = None
    length: int = 0
    per: str | None = None
    shares: str | None = None
    role: str | None = None
    """id features: `user` or `item` (the popularity baseline, cold-start views)."""
    table_kind: str = "hashed"
    """id / categorical (`table:` in the file): `hashed` (the value modulo `buckets`) or `managed` (a
    row of its own per admitted value, `TableOptions`)."""
    managed: TableOptions | None = None
    """The managed table's options (None for a hashed one)."""

    @property
    def table(self) -> str | None:
        """The side table the field comes from, or None for an events field."""
        return self.field.split(".", 1)[0] if "." in self.field else None

    @property
    def column(self) -> str:
        """The raw field's name (without its table)."""
        return self.field.split(".", 1)[-1]

    @property
    def table_rows(self) -> int | None:
        """Rows of the feature's own embedding table: `rows` of a managed table, else `buckets`."""
        return self.managed.rows if self.managed is not None else self.buckets

    @property
    def is_sparse(self) -> bool:
        return self.kind in SPARSE_KINDS

    @property
    def is_list(self) -> bool:
        return self.kind in LIST_KINDS

    def dense_range(self) -> tuple[float, float] | None:
        """The range a stored dense value lies in (clip bounds after scaling), or None if unbounded."""
        if self.clip is None:
            return None
        return self.clip[0] / self.scale, self.clip[1] / self.scale


@dataclass(frozen=True)
class QualitySpec:
    ctr_min: float | None = None
    ctr_max: float | None = None
    row_count_ratio_min: float | None = None
    row_count_ratio_max: float | None = None
    learn_from_days: int = 28
    history_days: int = 7
    max_distinct: Mapping[str, int] = field(default_factory=dict)
    severity: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    name: str
    version: int
    sources: tuple[SourceSpec, ...]
    label: LabelSpec
    features: tuple[FeatureSpec, ...]
    quality: QualitySpec = QualitySpec()
    description: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The document as loaded (JSON types): what plan.json and a model export carry."""

    # --- lookups ----------------------------------------------------------------------------
    def source(self, name: str) -> SourceSpec:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(name)

    @cached_property
    def events(self) -> SourceSpec:
        """The one source whose records become samples."""
        return next(s for s in self.sources if s.kind == "events")

    @property
    def label_source(self) -> SourceSpec | None:
        return self.source(self.label.source) if self.label.kind == "click_within" and self.label.source else None

    @property
    def tables(self) -> tuple[SourceSpec, ...]:
        return tuple(s for s in self.sources if s.kind == "table")

    def feature(self, name: str) -> FeatureSpec:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def sparse(self) -> tuple[FeatureSpec, ...]:
        """Single-valued ids and categoricals, in spec order (one embedding lookup each)."""
        return tuple(f for f in self.features if f.is_sparse)

    @property
    def dense(self) -> tuple[FeatureSpec, ...]:
        return tuple(f for f in self.features if f.kind == "dense")

    @property
    def lists(self) -> tuple[FeatureSpec, ...]:
        """Multi-valued lists and sequences, in spec order (one pooled lookup each)."""
        return tuple(f for f in self.features if f.is_list)

    @property
    def key_column(self) -> str:
        """The sample column records are keyed (partitioned) by: the id feature of the sequences'
        key field (a user's samples stay in order in one partition), else the first id feature,
        else the sample id."""
        pers = {f.per for f in self.features if f.kind == "sequence"}
        ids = [f for f in self.features if f.kind == "id"]
        for f in ids:
            if f.table is None and f.column in pers:
                return f.name
        return ids[0].name if ids else SAMPLE_ID

    @property
    def sample_columns(self) -> tuple[str, ...]:
        return (SAMPLE_ID, EVENT_TIME, *(f.name for f in self.features), LABEL)

    @cached_property
    def digest(self) -> str:
        """A short hash of the spec's content, in its order (the order of features is the order of
        columns): two runs with the same digest derive the same samples."""
        return hashlib.sha256(json.dumps(self.raw, default=str).encode()).hexdigest()[:16]

    def with_role(self, role: str) -> FeatureSpec | None:
        """The id feature with `role` (user or item), if the spec names one."""
        return next((f for f in self.features if f.role == role), None)

    def table_of(self, feature: FeatureSpec) -> str:
        """The embedding table a feature looks up: its own, or the one it shares."""
        return feature.shares or feature.name

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)

    def to_json(self) -> str:
        """The document as JSON text, in its order (a JSON *object* may be re-serialised with
        sorted keys by whoever stores it; the order of sources, fields and features matters)."""
        return json.dumps(self.raw, default=str)


# --- loading ---------------------------------------------------------------------------------


def resolve_spec_path(name_or_path: str | Path) -> Path:
    """A path as given, or a shipped spec's name (`criteo` -> specs/criteo.yaml)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        return p
    return SPECS_DIR / f"{name_or_path}.yaml"


def read_shipped_text(path: Path) -> str:
    """A file's text, also when the code runs from a zip (a Spark executor's --py-files): then a
    shipped spec lives inside that zip and is read through it."""
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        for parent in path.parents:
            if parent.is_file() and zipfile.is_zipfile(parent):
                member = zipfile.Path(parent, at=path.relative_to(parent).as_posix())
                if member.is_file():
                    return member.read_text()
        raise FileNotFoundError(path) from None


def load_spec(name_or_path: str | Path = DEFAULT_SPEC) -> Spec:
    """Read, validate and parse a spec file; a bare name is a shipped spec."""
    path = resolve_spec_path(name_or_path)
    try:
        text = read_shipped_text(path)
    except FileNotFoundError:
        shipped = ", ".join(sorted(p.stem for p in SPECS_DIR.glob("*.yaml")))
        raise SpecError(f"feature spec {path} not found: give a path to a spec file, or one of the shipped specs ({shipped})") from None
    return parse_spec_text(text, str(path))


def parse_spec_text(text: str, origin: str = "<spec>") -> Spec:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{origin}:{mark.line + 1}" if mark is not None else origin
        raise SpecError(f"{where}: not valid YAML ({getattr(e, 'problem', e)}): fix the syntax") from None
    return spec_from_dict(doc, origin, node)


def spec_from_dict(doc: Any, origin: str = "<spec>", node: yaml.Node | None = None) -> Spec:
    """Validate a spec document (as loaded from YAML or JSON, e.g. from a plan.json) and parse it."""
    doc = json.loads(json.dumps(doc, default=str))  # plain JSON types (dates -> strings)
    _validate_schema(doc, origin, node)
    try:
        spec = _parse(doc)
        _check_references(spec)
    except _KeyProblem as e:
        raise SpecError(f"{origin}:{_line(node, e.path)}: {'.'.join(map(str, e.path))}: {e.message}") from None
    return spec


class _KeyProblem(Exception):
    def __init__(self, path: tuple[Any, ...], message: str) -> None:
        super().__init__(message)
        self.path, self.message = path, message


def _validate_schema(doc: Any, origin: str, node: yaml.Node | None) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if not errors:
        return
    lines = []
    for e in errors[:5]:
        path = tuple(e.absolute_path)
        key = ".".join(map(str, path)) or "(top level)"
        lines.append(f"{origin}:{_line(node, path)}: {key}: {_explain(e)}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    raise SpecError("invalid feature spec: " + "; ".join(lines) + more + f". The format is {SCHEMA_FILE.name} (docs/features.md)")


def _explain(e: Any) -> str:
    if e.validator == "additionalProperties":
        allowed = sorted(e.schema.get("properties", {}))
        return f"{e.message}; allowed keys: {', '.join(allowed)}" if allowed else e.message
    if e.validator in ("oneOf", "anyOf"):
        return f"{json.dumps(e.instance)[:80]} is not a valid value here"
    return str(e.message)


_SCHEMA: dict[str, Any] | None = None


def _schema() -> dict[str, Any]:
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = json.loads(read_shipped_text(SCHEMA_FILE))
    return _SCHEMA


def _line(node: yaml.Node | None, path: tuple[Any, ...]) -> str:
    """The line (1-based) of the deepest YAML node on `path`, or '?' without a YAML source."""
    if node is None:
        return "?"
    found = node
    for key in path:
        nxt = None
        if isinstance(found, yaml.MappingNode):
            nxt = next((v for k, v in found.value if getattr(k, "value", None) == str(key)), None)
            if nxt is None:
                break
        elif isinstance(found, yaml.SequenceNode) and isinstance(key, int) and key < len(found.value):
            nxt = found.value[key]
        else:
            break
        found = nxt
    return str(found.start_mark.line + 1)


def _parse(doc: Mapping[str, Any]) -> Spec:
    sources = []
    for name, s in doc["sources"].items():
        fields = tuple(
            FieldSpec(fname, f["type"], bool(f.get("optional", False)), f.get("default"))
            for fname, f in s["fields"].items()
        )
        rule = s.get("id")
        sources.append(SourceSpec(
            name=name, kind=s["kind"], fields=fields,
            id=tuple(rule["hash"]) if isinstance(rule, dict) else rule,
            time=s.get("time"), key=s.get("key"), format=s.get("format", "auto"),
            header=bool(s.get("header", True)), columns=tuple(s.get("columns", ())),
        ))
    label = _parse_label(doc["label"])
    features = tuple(
        FeatureSpec(
            name=name, kind=f["kind"], field=f["field"], buckets=f.get("buckets"),
            log1p=bool(f.get("log1p", False)), clip=tuple(f["clip"]) if "clip" in f else None,  # type: ignore[arg-type]
            scale=float(f.get("scale", 1.0)), standardize=bool(f.get("standardize", False)),
            separator=f.get("separator"), length=int(f.get("length", 0)), per=f.get("per"), shares=f.get("shares"),
            role=f.get("role"), table_kind=f.get("table", "hashed"), managed=_table_options(f),
        )
        for name, f in doc["features"].items()
    )
    q = doc.get("quality", {})
    quality = QualitySpec(
        ctr_min=q.get("ctr", {}).get("min"), ctr_max=q.get("ctr", {}).get("max"),
        row_count_ratio_min=q.get("row_count_ratio", {}).get("min"),
        row_count_ratio_max=q.get("row_count_ratio", {}).get("max"),
        learn_from_days=int(q.get("learn_from_days", 28)), history_days=int(q.get("history_days", 7)),
        max_distinct=dict(q.get("max_distinct", {})), severity=dict(q.get("severity", {})),
    )
    return Spec(doc["name"], int(doc["version"]), tuple(sources), label, features, quality,
                doc.get("description", ""), doc)


def _table_options(f: Mapping[str, Any]) -> TableOptions | None:
    if f.get("table") != "managed":
        return None
    return TableOptions(rows=int(f.get("rows", 0)), admit_after=int(f.get("admit_after", 0)),
                        eviction=f.get("eviction", "lru"), ttl_days=f.get("ttl_days"))


def _parse_label(d: Mapping[str, Any]) -> LabelSpec:
    if "click_within" in d:
        c = d["click_within"]
        return LabelSpec("click_within", source=c["source"], window_s=int(c["window_s"]))
    if "column" in d:
        return LabelSpec("column", field=d["column"]["field"])
    m = _RULE.match(d["rule"])
    assert m is not None  # the schema's pattern is the same expression
    return LabelSpec("rule", field=m.group(1), op=m.group(2), value=float(m.group(3)))


def _check_references(spec: Spec) -> None:
    """What the JSON schema cannot say: names refer to things that exist and fit together."""
    events = [s for s in spec.sources if s.kind == "events"]
    if len(events) != 1:
        raise _KeyProblem(("sources",), f"exactly one source must have kind: events, found {len(events)}")
    ev = events[0]
    for s in spec.sources:
        at = ("sources", s.name)
        for f in s.fields:
            if f.optional and f.default is None and not f.is_list:
                raise _KeyProblem((*at, "fields", f.name), "an optional field needs a default (the value a record without it takes)")
            if not f.optional and f.default is not None:
                raise _KeyProblem((*at, "fields", f.name), "a default is only for optional fields: add `optional: true` or drop it")
        if s.kind == "events":
            if s.time is None or s.time not in s.field_names:
                raise _KeyProblem((*at, "time"), f"events need `time:` naming one of their fields ({', '.join(s.field_names)})")
            if s.field(s.time).type != "timestamp":
                raise _KeyProblem((*at, "time"), f"{s.time} must have type timestamp")
            ids = (s.id,) if isinstance(s.id, str) else (s.id or ())
            if not ids:
                raise _KeyProblem((*at, "id"), "events need `id:` (the id field, or {hash: [fields]} when the log has none)")
            for name in ids if ids != ("*",) else ():
                if name not in s.field_names:
                    raise _KeyProblem((*at, "id"), f"id field {name} is not a field of {s.name}")
        elif s.kind == "labels":
            for attr in ("key", "time"):
                if getattr(s, attr) not in s.field_names:
                    raise _KeyProblem((*at, attr), f"a labels source needs `{attr}:` naming one of its fields")
        else:
            if s.key not in s.field_names:
                raise _KeyProblem((*at, "key"), "a side table needs `key:` naming one of its fields")
            if s.key not in ev.field_names:
                raise _KeyProblem((*at, "key"), f"the events source {ev.name} has no field {s.key} to join {s.name} on")
        for col in s.columns:
            if col not in s.field_names and not col.startswith("_"):
                raise _KeyProblem((*at, "columns"), f"column {col} is not a field (name unused columns _x)")
    _check_label(spec, ev)
    names = {f.name for f in spec.features}
    for f in spec.features:
        _check_feature(spec, ev, f, names)


def _check_label(spec: Spec, ev: SourceSpec) -> None:
    lab = spec.label
    if lab.kind == "click_within":
        try:
            src = spec.source(lab.source or "")
        except KeyError:
            raise _KeyProblem(("label", "click_within", "source"), f"no source named {lab.source}") from None
        if src.kind != "labels":
            raise _KeyProblem(("label", "click_within", "source"), f"{src.name} must have kind: labels")
        return
    name = lab.field or ""
    if name not in ev.field_names:
        raise _KeyProblem(("label",), f"{name} is not a field of the events source {ev.name}")
    if ev.field(name).type not in NUMERIC_TYPES:
        raise _KeyProblem(("label",), f"{name} must be numeric or boolean, not {ev.field(name).type}")


def _source_field(spec: Spec, ev: SourceSpec, f: FeatureSpec) -> FieldSpec:
    at = ("features", f.name, "field")
    if f.table is None:
        if f.column not in ev.field_names:
            raise _KeyProblem(at, f"{f.column} is not a field of the events source {ev.name} (a side table's field is <table>.<field>)")
        return ev.field(f.column)
    try:
        tab = spec.source(f.table)
    except KeyError:
        raise _KeyProblem(at, f"no source named {f.table}") from None
    if tab.kind != "table":
        raise _KeyProblem(at, f"{f.table} is not a side table (kind: table)")
    if f.column not in tab.field_names:
        raise _KeyProblem(at, f"{f.column} is not a field of {f.table}")
    return tab.field(f.column)


def _check_feature(spec: Spec, ev: SourceSpec, f: FeatureSpec, names: set[str]) -> None:
    at = ("features", f.name)
    if f.name in RESERVED:
        raise _KeyProblem(at, f"{f.name} is a column every sample has ({', '.join(RESERVED)}): pick another name")
    src = _source_field(spec, ev, f)
    _check_table(spec, f)
    if f.kind in ("id", "categorical", "list") and not f.table_rows and not f.shares:
        raise _KeyProblem(at, f"this {f.kind} feature needs `buckets:` (its embedding table's rows)")
    if f.kind == "dense":
        if src.type not in NUMERIC_TYPES:
            raise _KeyProblem((*at, "field"), f"a dense feature needs a numeric field, {src.name} is {src.type}")
        if f.clip is not None and not f.clip[0] < f.clip[1]:
            raise _KeyProblem((*at, "clip"), f"expected [lo, hi] with lo < hi, got {list(f.clip)}")
    elif f.kind == "list":
        if not src.is_list and not (src.type == "string" and f.separator):
            raise _KeyProblem((*at, "field"), f"a list feature needs a list field or a string field with `separator:`, {src.name} is {src.type}")
    elif f.kind == "sequence":
        if f.table is not None:
            raise _KeyProblem((*at, "field"), "a sequence looks back on the events' own field, not a side table's")
        if f.length < 1:
            raise _KeyProblem(at, "a sequence needs `length:` (K, the earlier values kept)")
        if f.per is None or f.per not in ev.field_names:
            raise _KeyProblem((*at, "per"), f"a sequence needs `per:` naming an events field (e.g. user_id), one of {', '.join(ev.field_names)}")
    elif src.is_list:
        raise _KeyProblem((*at, "field"), f"{src.name} holds lists: use kind: list")
    if f.role is not None:
        if f.kind != "id":
            raise _KeyProblem((*at, "role"), f"only an id feature can have a role, {f.name} is {f.kind}")
        if sum(g.role == f.role for g in spec.features) > 1:
            raise _KeyProblem((*at, "role"), f"only one feature can have role {f.role}")
    if f.shares is not None:
        if f.shares not in names or not spec.feature(f.shares).is_sparse:
            raise _KeyProblem((*at, "shares"), f"shares must name an id or categorical feature, got {f.shares}")


_MANAGED_ONLY = ("rows", "admit_after", "eviction", "ttl_days")


def _check_table(spec: Spec, f: FeatureSpec) -> None:
    """`table: managed` and its options fit the feature (the schema checks types and ranges)."""
    at = ("features", f.name)
    raw = spec.raw["features"][f.name]
    if f.managed is None:
        extra = [k for k in _MANAGED_ONLY if k in raw]
        if extra:
            raise _KeyProblem((*at, extra[0]), f"{', '.join(extra)} only apply to a managed table: add `table: managed` "
                                                "(and `rows:`), or drop them")
        return
    if f.kind not in SPARSE_KINDS:
        raise _KeyProblem((*at, "table"), f"only an id or categorical feature can have a managed table, {f.name} is {f.kind} "
                                          "(a list or sequence looks up the table of the feature it `shares`)")
    if "buckets" in raw:
        raise _KeyProblem((*at, "buckets"), "a managed table's size is `rows:`; `buckets` is for hashed tables: drop it")
    if "rows" not in raw:
        raise _KeyProblem(at, "a managed table needs `rows:` (its rows, the shared new-id row included)")
    m = f.managed
    if (m.eviction == "ttl") != (m.ttl_days is not None):
        raise _KeyProblem((*at, "ttl_days" if m.ttl_days is not None else "eviction"),
                          "`ttl_days:` goes with `eviction: ttl`, and `eviction: ttl` needs it")
