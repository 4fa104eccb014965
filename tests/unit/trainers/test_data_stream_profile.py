"""The trainer's stream profile is the quality profile: batch and stream compare column by column."""

from __future__ import annotations

import json
import pickle

import pytest

from slipstream.quality.drift import compare_profiles
from slipstream.quality.profiles import FeatureProfile, profile_table
from slipstream.samples.schema import DEFAULT_SPEC as SPEC
from tests.quality_fixtures import reference_days
from trainers.data import stream_profile
from trainers.data.rows import SOURCE_KAFKA, Rows


def test_stream_profile_matches_the_batch_profile_of_the_same_rows(tmp_path) -> None:
    table = next(iter(reference_days(days=1, rows=3000).values()))
    # two ranks, each profiling half of what it consumed in two polls, then merged
    quarters = [Rows.from_arrow(table.slice(i, 750), source=SOURCE_KAFKA) for i in range(0, 3000, 750)]
    ranks = [stream_profile.new_profile(SPEC), stream_profile.new_profile(SPEC)]
    for i, rows in enumerate(quarters):
        stream_profile.add_rows(ranks[i % 2], rows)
    stream_profile.add_rows(ranks[0], Rows.empty())
    # ranks travel pickled (all_gather_object) and through checkpoint metadata as JSON
    gathered = [pickle.loads(pickle.dumps(ranks[0])), json.loads(json.dumps(ranks[1].to_dict()))]
    merged = stream_profile.merge(gathered, SPEC)
    path = merged.write(tmp_path / "stream_profile.json")

    stream = FeatureProfile.read(path)
    batch = profile_table(table.drop_columns(["sample_id"]), SPEC)
    assert stream.rows == batch.rows == 3000
    assert set(stream.columns) == set(batch.columns)
    for name, col in batch.columns.items():
        assert stream.columns[name].count == col.count, name
        assert stream.columns[name].mean == pytest.approx(col.mean, rel=1e-6, abs=1e-9), name
    assert stream.ctr_by_hour == batch.ctr_by_hour
    # identical rows: no column shifts between batch and stream
    shifts = compare_profiles(batch, stream, SPEC)
    assert shifts and not [s.feature for s in shifts if s.drifted]
