"""The sample schema's derived views agree, and the Kafka codec round-trips and names bad records."""

from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow

from slipstream import codec, schema
from slipstream.datagen import GeneratorConfig, reference_samples


@pytest.fixture(scope="module")
def day() -> pa.Table:
    return next(iter(reference_samples(GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=500)).values()))


def test_arrow_schema_matches_iceberg_schema() -> None:
    derived = schema_to_pyarrow(schema.ICEBERG_SCHEMA, include_field_ids=False)
    assert derived.names == schema.ARROW_SCHEMA.names
    def plain(t: pa.DataType) -> pa.DataType:  # pyiceberg reads strings/lists as their large variants
        if pa.types.is_large_string(t):
            return pa.string()
        if pa.types.is_large_list(t) or pa.types.is_list(t):
            return pa.list_(plain(t.value_type))
        return t

    for a, b in zip(derived, schema.ARROW_SCHEMA):
        assert plain(a.type) == b.type, a.name


def test_codec_round_trips_every_column(day: pa.Table) -> None:
    decoded = codec.decode_samples(codec.encode_samples(day))
    assert decoded.bad == []
    assert decoded.table.equals(day)


def test_codec_names_each_bad_record_and_keeps_the_good(day: pa.Table) -> None:
    good = codec.encode_samples(day.slice(0, 3))
    bad_label = good[0].replace(b'"label":0', b'"label":7').replace(b'"label":1', b'"label":7')
    values = [good[0], b"not json", good[1], b'{"sample_id":"x"}', bad_label, b"x" * (codec.MAX_VALUE_BYTES + 1), None, good[2]]
    out = codec.decode_samples(values)
    assert out.table.num_rows == 3
    assert out.good_index.tolist() == [0, 2, 7]
    reasons = dict(out.bad)
    assert set(reasons) == {1, 3, 4, 5, 6}
    assert "not valid JSON" in reasons[1]
    assert "missing required field 'event_time'" in reasons[3]
    assert "label" in reasons[4]
    assert "limit" in reasons[5]
    assert reasons[6] == "empty value"


def test_hash_category_is_stable_and_60_bit() -> None:
    import hashlib

    assert schema.hash_category("ios") == int(hashlib.sha256(b"ios").hexdigest()[:15], 16)
    values = {schema.hash_category(s) for s in ("ios", "android", "web", "tv")}
    assert len(values) == 4 and all(0 <= v < 2**60 for v in values)


def test_holdout_is_about_a_tenth_and_independent_of_batching() -> None:
    ids = np.array([f"imp-{i}" for i in range(20_000)], dtype=object)
    mask = schema.is_holdout(ids)
    assert 0.08 < mask.mean() < 0.12
    assert np.array_equal(schema.is_holdout(ids[:7]), mask[:7])  # padding width must not matter
    assert np.array_equal(schema.is_holdout(pa.array(ids[100:200].tolist())), mask[100:200])


def test_dense_transform_clips_and_scales() -> None:
    f = schema.DENSE_FEATURES[0]
    out = f.apply(np.array([-5.0, 0.0, 1e9]))
    assert out.dtype == np.float32
    assert out[0] == 0.0 and out[1] == 0.0 and out[2] == pytest.approx(1.0)


@pytest.mark.parametrize("odd", [b"", b"x" * (codec.MAX_VALUE_BYTES + 1), b'{"a":1}\n{"b":2}', None])
def test_codec_screens_each_odd_value_alone(day: pa.Table, odd: bytes | None) -> None:
    # the batch fast path (one join, C-level checks) must fall back for each kind on its own
    good = codec.encode_samples(day.slice(0, 2))
    out = codec.decode_samples([good[0], odd, good[1]])
    assert out.good_index.tolist() == [0, 2]
    assert [i for i, _ in out.bad] == [1]
    assert out.table.equals(day.slice(0, 2))
