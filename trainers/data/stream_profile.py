"""The feature profile of the fresh samples read from Kafka (`stream_profile.json`).

It is the same mergeable `FeatureProfile` the quality gate keeps per day of the Iceberg window,
so the insight report compares batch and stream column by column (skew) with one code path.
Each rank profiles what it consumed; profiles merge exactly, so ranks and resumed runs add up.
In checkpoint metadata the profile travels as its JSON dict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from slipstream.quality.profiles import FeatureProfile, column_kinds, merge_profiles
from slipstream.samples.spec import SAMPLE_ID, Spec
from trainers.data.rows import DEFAULT_LAYOUT, RowLayout, Rows


def new_profile(spec: Spec) -> FeatureProfile:
    """An empty profile whose columns take their kinds from the run's spec, as the gate's do."""
    return FeatureProfile.for_spec(spec)


def rows_table(rows: Rows, layout: RowLayout = DEFAULT_LAYOUT) -> pa.Table:
    """The sample columns of `rows` as Arrow (what the batch side profiles), without the sample id."""
    return rows.to_arrow(layout).drop_columns([SAMPLE_ID])


def add_rows(profile: FeatureProfile, rows: Rows, layout: RowLayout = DEFAULT_LAYOUT) -> None:
    if len(rows):
        profile.update(rows_table(rows, layout))


def as_profile(p: FeatureProfile | dict[str, Any] | None, spec: Spec) -> FeatureProfile:
    """A profile gathered from a rank or restored from checkpoint metadata, ready for more rows."""
    if p is None:
        return new_profile(spec)
    prof = p if isinstance(p, FeatureProfile) else FeatureProfile.from_dict(p)
    prof.kinds = column_kinds(spec)
    return prof


def merge(profiles: Iterable[FeatureProfile | dict[str, Any] | None], spec: Spec) -> FeatureProfile:
    return merge_profiles(as_profile(p, spec) for p in profiles)


class StreamProfilePiece:
    """The `profile` checkpoint piece: every rank's profile merged on save (collective), the whole
    profile back on rank 0 at a resume (the other ranks start empty, so merges stay exact)."""

    def __init__(self, spec: Spec, gather: Callable[[Any], list[Any]], rank: int) -> None:
        self.spec, self.gather, self.rank = spec, gather, rank
        self.profile = new_profile(spec)

    def state_dict(self) -> dict[str, Any]:
        return merge(self.gather(self.profile), self.spec).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.rank == 0:
            self.profile = as_profile(state, self.spec)
