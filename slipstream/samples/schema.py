"""The sample schema, derived from the feature spec (`slipstream.samples.spec`).

Every stage derives its view from here: the Iceberg table (`iceberg_schema`), Arrow
(`sample_arrow_schema`), the raw sources' contract (`source_arrow_schema`) and the Kafka value
codecs (`slipstream.samples.codec`). The module constants (`ARROW_SCHEMA`, ...) are the default
spec's (`specs/synthetic.yaml`). The stable hashes every path shares live here too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from slipstream.samples.spec import EVENT_TIME, LABEL, SAMPLE_ID, FeatureSpec, SourceSpec, Spec, load_spec

SCHEMA_VERSION = 1
"""The sample layout's own version (sample_id, event_time, the spec's features, label); stored with
every model next to the spec's name, version and digest."""

SAMPLES_TABLE = "samples"
REJECTS_TABLE = "samples_rejects"
NAMESPACE = "slipstream"
TOPIC = "samples"
DLQ_TOPIC = "samples.dlq"


@dataclass(frozen=True)
class DenseFeature:
    """`out = clip(log1p(max(raw, 0)), lo, hi)` when `log`, else `clip(raw, lo, hi)`; then `/ hi`
    (the default spec's dense features; `slipstream.samples.transform.dense_values` is the general form)."""

    raw: str
    name: str
    log: bool
    lo: float
    hi: float

    def apply(self, raw: np.ndarray) -> np.ndarray:
        x = np.asarray(raw, dtype=np.float64)
        if self.log:
            x = np.log1p(np.maximum(x, 0.0))
        return (np.clip(x, self.lo, self.hi) / self.hi).astype(np.float32)


def hash_category(value: str) -> int:
    """Stable 60-bit hash of a categorical string: the first 15 hex digits of its SHA-256.

    Spark computes the same thing as `conv(substring(sha2(col, 256), 1, 15), 16, 10)`.
    """
    return int(hashlib.sha256(value.encode("utf-8")).hexdigest()[:15], 16)


HOLDOUT_MODULO = 10
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def id_hash(ids: np.ndarray | list[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """FNV-1a 64-bit hash of each id string, vectorised over the byte columns (no per-row Python)."""
    if isinstance(ids, (pa.Array, pa.ChunkedArray)):
        ids = ids.to_numpy(zero_copy_only=False)
    raw = np.asarray(ids, dtype=object).astype("S") if len(ids) else np.zeros(0, dtype="S1")
    width = raw.dtype.itemsize
    mat = raw.view(np.uint8).reshape(len(raw), width)
    h = np.full(len(raw), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width):
            col = mat[:, j]
            nxt = (h ^ col.astype(np.uint64)) * _FNV_PRIME
            h = np.where(col != 0, nxt, h)  # NUL padding must not change the hash
    return h


def is_holdout(sample_ids: np.ndarray | list[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """True for samples held out of training for evaluation: fnv1a64(sample_id) % 10 == 0.

    The trainer and the generator both use this rule, so the generator's best achievable AUC is
    computed on exactly the slice the trainer evaluates.
    """
    held: np.ndarray = id_hash(sample_ids) % np.uint64(HOLDOUT_MODULO) == 0
    return held


# --- derived from a spec -------------------------------------------------------------------------

_FIELD_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(),
    "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"),
    "list<string>": pa.list_(pa.string()), "list<long>": pa.list_(pa.int64()),
}


def field_arrow_type(type_name: str) -> pa.DataType:
    """The Arrow type of a spec field type (`long` -> int64, `timestamp` -> timestamp[us, UTC])."""
    return _FIELD_TYPES[type_name]


def feature_arrow_type(f: FeatureSpec) -> pa.DataType:
    """ids and categoricals: int64 (hashed or raw ids); dense: float32; lists and sequences: list<int64>."""
    if f.kind == "dense":
        return pa.float32()
    if f.is_list:
        return pa.list_(pa.int64())
    return pa.int64()


def sample_arrow_schema(spec: Spec) -> pa.Schema:
    """The samples' columns: sample_id, event_time, the features in spec order, label."""
    return pa.schema([
        pa.field(SAMPLE_ID, pa.string()),
        pa.field(EVENT_TIME, pa.timestamp("us", tz="UTC")),
        *[pa.field(f.name, feature_arrow_type(f)) for f in spec.features],
        pa.field(LABEL, pa.int32()),
    ])


def source_arrow_schema(source: SourceSpec) -> pa.Schema:
    """A raw source's fields as Arrow (the raw zone's contract)."""
    return pa.schema([pa.field(f.name, field_arrow_type(f.type)) for f in source.fields])


def _iceberg_type(t: pa.DataType, next_id: list[int]) -> IcebergType:
    if pa.types.is_list(t):
        next_id[0] += 1
        return ListType(element_id=next_id[0], element_type=_iceberg_type(t.value_type, next_id), element_required=False)
    simple = {pa.string(): StringType(), pa.int64(): LongType(), pa.int32(): IntegerType(),
              pa.float32(): FloatType(), pa.float64(): DoubleType(), pa.bool_(): BooleanType(),
              pa.timestamp("us", tz="UTC"): TimestamptzType()}
    return simple[t]


def iceberg_schema(spec: Spec) -> Schema:
    """The Iceberg schema of a new `samples` table (field ids in column order; an existing table
    evolves by name, keeping its ids: `slipstream.lake.iceberg.samples_table`). Columns are
    optional at the Iceberg level because Spark writes nullable Parquet; the quality gate enforces
    not-null."""
    arrow = sample_arrow_schema(spec)
    n = len(arrow)
    next_id = [n]  # list element ids follow the columns'
    docs = {SAMPLE_ID: "the sample's unique id", EVENT_TIME: "event time, UTC",
            LABEL: f"1 when {spec.label.describe()}"}
    fields = [
        NestedField(i + 1, f.name, _iceberg_type(f.type, next_id), required=False, doc=docs.get(f.name))
        for i, f in enumerate(arrow)
    ]
    return Schema(*fields)


def partition_spec(schema: Schema) -> PartitionSpec:
    """One partition per UTC day of event_time."""
    source_id = schema.find_field(EVENT_TIME).field_id
    return PartitionSpec(PartitionField(source_id=source_id, field_id=1000, transform=DayTransform(), name="event_time_day"))


# --- the default spec's schema (specs/synthetic.yaml) --------------------------------------------
# Kept for the code written against the synthetic data set's columns; spec-driven code takes a
# `Spec` and calls the functions above instead.

DEFAULT_SPEC = load_spec()
ICEBERG_SCHEMA = iceberg_schema(DEFAULT_SPEC)
PARTITION_SPEC = partition_spec(ICEBERG_SCHEMA)
ARROW_SCHEMA = sample_arrow_schema(DEFAULT_SPEC)
SAMPLE_COLUMNS = tuple(ARROW_SCHEMA.names)
IMPRESSION_ARROW_SCHEMA = source_arrow_schema(DEFAULT_SPEC.events)
"""Raw impressions. JSON lines carry `ts` as an ISO-8601 UTC string ("2026-11-01T00:00:01.5Z")."""
CLICK_ARROW_SCHEMA = source_arrow_schema(DEFAULT_SPEC.source("clicks"))
REQUIRED_IMPRESSION_FIELDS = ("impression_id", "ts", "user_id", "item_id")
ATTRIBUTION_WINDOW_S = DEFAULT_SPEC.label.window_s
"""A click counts for an impression when it happens within this many seconds after it."""
HIST_LEN = DEFAULT_SPEC.feature("hist_items").length
"""K: the sequence feature holds the user's last K impressed item ids (same UTC day, before the
impression, most recent last)."""
DENSE_FEATURES: tuple[DenseFeature, ...] = tuple(
    DenseFeature(f.column, f.name, log=f.log1p, lo=f.clip[0], hi=f.clip[1])  # type: ignore[index]
    for f in DEFAULT_SPEC.dense
)
CATEGORICAL_FEATURES: tuple[tuple[str, str], ...] = tuple(
    (f.column, f.name) for f in DEFAULT_SPEC.features if f.kind == "categorical"
)
"""(raw string column, hashed int64 sample column)."""
DENSE_COLUMNS = tuple(f.name for f in DENSE_FEATURES)
CATEGORICAL_COLUMNS = tuple(c for _, c in CATEGORICAL_FEATURES)
ID_COLUMNS = ("user_id", "item_id")
SEQUENCE_COLUMN = "hist_items"
LABEL_COLUMN = LABEL
