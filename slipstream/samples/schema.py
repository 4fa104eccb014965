"""The training-sample schema, defined once.

Every stage derives its view from here: the Iceberg table (`ICEBERG_SCHEMA`), Arrow
(`ARROW_SCHEMA`), the raw-log input contract (`IMPRESSION_ARROW_SCHEMA`,
`CLICK_ARROW_SCHEMA`) and the Kafka value codec (`slipstream.samples.codec`). Feature transforms that
both the batch path (Spark) and the online path (the stream producer) apply are defined here as
numbers, so the two implementations cannot silently disagree (the skew report checks they don't).
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
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

SCHEMA_VERSION = 1
"""Bumped whenever a column is added, removed or its meaning changes; stored with every model."""

SAMPLES_TABLE = "samples"
REJECTS_TABLE = "samples_rejects"
NAMESPACE = "slipstream"
TOPIC = "samples"
DLQ_TOPIC = "samples.dlq"

HIST_LEN = 20
"""K: the sequence feature holds the user's last K impressed item ids (same UTC day, before the
impression, most recent last)."""

ATTRIBUTION_WINDOW_S = 30 * 60
"""A click counts for an impression when it happens within this many seconds after it."""


@dataclass(frozen=True)
class DenseFeature:
    """`out = clip(log1p(max(raw, 0)), lo, hi)` when `log`, else `clip(raw, lo, hi)`; then `/ hi`."""

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


DENSE_FEATURES: tuple[DenseFeature, ...] = (
    DenseFeature("price", "price_log", log=True, lo=0.0, hi=10.0),
    DenseFeature("position", "position_norm", log=False, lo=0.0, hi=50.0),
    DenseFeature("item_age_days", "item_age_log", log=True, lo=0.0, hi=8.0),
    DenseFeature("user_tenure_days", "user_tenure_log", log=True, lo=0.0, hi=10.0),
)

CATEGORICAL_FEATURES: tuple[tuple[str, str], ...] = (
    ("device", "device_hash"),
    ("country", "country_hash"),
    ("item_category", "category_hash"),
)
"""(raw string column, hashed int64 sample column)."""

DENSE_COLUMNS = tuple(f.name for f in DENSE_FEATURES)
CATEGORICAL_COLUMNS = tuple(c for _, c in CATEGORICAL_FEATURES)
ID_COLUMNS = ("user_id", "item_id")
SEQUENCE_COLUMN = "hist_items"
LABEL_COLUMN = "label"


def hash_category(value: str) -> int:
    """Stable 60-bit hash of a categorical string: the first 15 hex digits of its SHA-256.

    Spark computes the same thing as `conv(substring(sha2(col, 256), 1, 15), 16, 10)`.
    """
    return int(hashlib.sha256(value.encode("utf-8")).hexdigest()[:15], 16)


HOLDOUT_MODULO = 10
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def id_hash(ids: "np.ndarray | list[str] | pa.Array | pa.ChunkedArray") -> np.ndarray:
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


def is_holdout(sample_ids: "np.ndarray | list[str] | pa.Array | pa.ChunkedArray") -> np.ndarray:
    """True for samples held out of training for evaluation: fnv1a64(sample_id) % 10 == 0.

    The trainer and the generator both use this rule, so the generator's best achievable AUC is
    computed on exactly the slice the trainer evaluates.
    """
    return id_hash(sample_ids) % np.uint64(HOLDOUT_MODULO) == 0


ICEBERG_SCHEMA = Schema(
    NestedField(1, "sample_id", StringType(), required=False, doc="impression id, unique"),
    NestedField(2, "event_time", TimestamptzType(), required=False, doc="impression time, UTC"),
    NestedField(3, "user_id", LongType(), required=False),
    NestedField(4, "item_id", LongType(), required=False),
    NestedField(5, "price_log", FloatType(), required=False),
    NestedField(6, "position_norm", FloatType(), required=False),
    NestedField(7, "item_age_log", FloatType(), required=False),
    NestedField(8, "user_tenure_log", FloatType(), required=False),
    NestedField(9, "device_hash", LongType(), required=False),
    NestedField(10, "country_hash", LongType(), required=False),
    NestedField(11, "category_hash", LongType(), required=False),
    NestedField(
        12,
        "hist_items",
        ListType(element_id=14, element_type=LongType(), element_required=False),
        required=False,
        doc=f"last {HIST_LEN} item ids the user saw earlier that day, most recent last",
    ),
    NestedField(13, "label", IntegerType(), required=False, doc="1 if clicked within the attribution window"),
)
"""Columns are optional at the Iceberg level because Spark writes nullable Parquet; the quality
gate enforces not-null. Field ids are fixed: never reuse one."""

PARTITION_SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="event_time_day")
)

ARROW_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string()),
        pa.field("event_time", pa.timestamp("us", tz="UTC")),
        pa.field("user_id", pa.int64()),
        pa.field("item_id", pa.int64()),
        *[pa.field(name, pa.float32()) for name in DENSE_COLUMNS],
        *[pa.field(name, pa.int64()) for name in CATEGORICAL_COLUMNS],
        pa.field("hist_items", pa.list_(pa.int64())),
        pa.field("label", pa.int32()),
    ]
)
SAMPLE_COLUMNS = tuple(ARROW_SCHEMA.names)

IMPRESSION_ARROW_SCHEMA = pa.schema(
    [
        pa.field("impression_id", pa.string()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("user_id", pa.int64()),
        pa.field("item_id", pa.int64()),
        pa.field("device", pa.string()),
        pa.field("country", pa.string()),
        pa.field("item_category", pa.string()),
        pa.field("price", pa.float64()),
        pa.field("position", pa.int32()),
        pa.field("item_age_days", pa.float64()),
        pa.field("user_tenure_days", pa.float64()),
    ]
)
"""Raw impressions. JSON lines carry `ts` as an ISO-8601 UTC string ("2026-11-01T00:00:01.5Z")."""

CLICK_ARROW_SCHEMA = pa.schema(
    [pa.field("impression_id", pa.string()), pa.field("ts", pa.timestamp("us", tz="UTC"))]
)
REQUIRED_IMPRESSION_FIELDS = ("impression_id", "ts", "user_id", "item_id")
