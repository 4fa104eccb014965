"""The feature profile of the fresh samples read from Kafka (`stream_profile.json`).

It is the same mergeable `FeatureProfile` the quality gate keeps per day of the Iceberg window,
so the insight report compares batch and stream column by column (skew) with one code path.
Each rank profiles what it consumed; profiles merge exactly, so ranks and resumed runs add up.
In checkpoint metadata the profile travels as its JSON dict.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from slipstream.quality.profiles import FeatureProfile, merge_profiles
from slipstream.samples.schema import CATEGORICAL_COLUMNS, DENSE_COLUMNS
from trainers.rows import Rows


def new_profile() -> FeatureProfile:
    return FeatureProfile()


def rows_table(rows: Rows) -> pa.Table:
    """The sample columns of `rows` as Arrow (what the batch side profiles)."""
    hist = pa.ListArray.from_arrays(pa.array(rows.hist_offsets - rows.hist_offsets[0], pa.int32()),
                                    pa.array(rows.hist_values[rows.hist_offsets[0]:rows.hist_offsets[-1]], pa.int64()))
    cols: dict[str, Any] = {
        "event_time": pa.array(rows.event_us, pa.timestamp("us", tz="UTC")),
        "user_id": pa.array(rows.user, pa.int64()),
        "item_id": pa.array(rows.item, pa.int64()),
    }
    cols.update({c: pa.array(rows.dense[:, j], pa.float32()) for j, c in enumerate(DENSE_COLUMNS)})
    cols.update({c: pa.array(rows.cats[:, j], pa.int64()) for j, c in enumerate(CATEGORICAL_COLUMNS)})
    cols["hist_items"] = hist
    cols["label"] = pa.array(rows.label.astype(np.int32), pa.int32())
    return pa.table(cols)


def add_rows(profile: FeatureProfile, rows: Rows) -> None:
    if len(rows):
        profile.update(rows_table(rows))


def as_profile(p: FeatureProfile | dict[str, Any] | None) -> FeatureProfile:
    if p is None:
        return FeatureProfile()
    return p if isinstance(p, FeatureProfile) else FeatureProfile.from_dict(p)


def merge(profiles: Iterable[FeatureProfile | dict[str, Any] | None]) -> FeatureProfile:
    return merge_profiles(as_profile(p) for p in profiles)
