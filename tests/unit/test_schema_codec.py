"""The sample schema's derived views agree, and the Kafka codec round-trips and names bad records."""

from __future__ import annotations

from datetime import UTC, date

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.samples import codec, schema


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


FIXED = codec.codec_for().binary.fixed
DENSE_AT = FIXED.fields["dense"][1]
"""Where the dense values start in the default spec's binary head."""


def _binary_with(value: bytes, **fields: object) -> bytes:
    """A copy of one binary-encoded value with head fields replaced."""
    head = np.frombuffer(value[: FIXED.itemsize], dtype=FIXED).copy()
    for name, v in fields.items():
        head[name] = v
    return head.tobytes() + value[FIXED.itemsize :]


def test_binary_codec_round_trips_every_column(day: pa.Table) -> None:
    values = codec.encode_samples(day, "binary")
    assert all(v[0] == 0xB2 for v in values)
    assert sum(map(len, values)) < 0.6 * sum(map(len, codec.encode_samples(day)))  # compact
    decoded = codec.decode_samples(values)
    assert decoded.bad == []
    assert decoded.good_index.tolist() == list(range(day.num_rows))
    assert decoded.table.equals(day)
    for part in (day.slice(100, 30), pa.concat_tables([day.slice(100, 30), day.slice(7, 5)])):  # sliced, chunked
        assert codec.decode_samples(codec.encode_samples(part, "binary")).table.equals(part.combine_chunks())


def test_binary_codec_names_each_bad_record_and_keeps_the_good(day: pa.Table) -> None:
    good = codec.encode_samples(day.slice(0, 4), "binary")
    dense = np.frombuffer(good[2][DENSE_AT:DENSE_AT + 16], dtype="<f4").copy()
    dense[2] = np.inf
    bad_id = codec.encode_samples(day.slice(0, 1).set_column(0, "sample_id", pa.array(["id-\u00e9"])), "binary")[0]
    values = [
        good[0],
        good[1][:40],                                     # truncated inside the head
        good[1][:-3],                                     # truncated inside the sample id
        _binary_with(good[2], label=3),
        _binary_with(good[2], n_dense=2),
        good[2][:DENSE_AT] + dense.tobytes() + good[2][DENSE_AT + 16:],  # inf in a dense feature
        _binary_with(good[2], list_len=[500]),            # head and length disagree
        bad_id.replace("é".encode(), b"\xff\xfe"),        # sample id not UTF-8
        b"\xb2" + b"x" * codec.MAX_VALUE_BYTES,           # oversize
        good[3],
    ]
    out = codec.decode_samples(values)
    assert out.good_index.tolist() == [0, 9]
    assert out.table.equals(pa.concat_tables([day.slice(0, 1), day.slice(3, 1)]))
    reasons = dict(out.bad)
    assert sorted(reasons) == list(range(1, 9))
    assert "shorter than its" in reasons[1]
    assert "does not match its head" in reasons[2] and "does not match its head" in reasons[6]
    assert reasons[3] == "field 'label' must be 0 or 1, got 3"
    assert "dense" in reasons[4]
    assert reasons[5] == "field 'item_age_log' is not a finite number: inf"
    assert "UTF-8" in reasons[7]
    assert "limit" in reasons[8]


def test_a_batch_may_mix_codecs(day: pa.Table) -> None:
    js, bi = codec.encode_samples(day.slice(0, 6)), codec.encode_samples(day.slice(0, 6), "binary")
    values = [js[0], bi[1], None, bi[2], b"{bad", js[3], bi[4], js[5]]
    out = codec.decode_samples(values)
    assert out.good_index.tolist() == [0, 1, 3, 5, 6, 7]
    assert out.table.equals(day.slice(0, 6).take(pa.array([0, 1, 2, 3, 4, 5])))
    assert [i for i, _ in out.bad] == [2, 4]


def test_binary_codec_refuses_what_it_cannot_hold(day: pa.Table) -> None:
    with pytest.raises(ValueError, match="null 'user_id'"):
        codec.encode_samples(day.slice(0, 2).set_column(2, "user_id", pa.array([1, None], pa.int64())), "binary")
    with pytest.raises(ValueError, match="unknown sample codec 'avro'"):
        codec.encode_samples(day, "avro")


def test_the_codec_setting_is_checked_at_the_edge() -> None:
    from slipstream.errors import ConfigError
    from slipstream.settings import Settings

    assert Settings.from_env({"SLIPSTREAM_KAFKA_CODEC": "binary"}).kafka_codec == "binary"
    assert Settings.from_env({}).kafka_codec == "json"
    with pytest.raises(ConfigError, match="SLIPSTREAM_KAFKA_CODEC must be one of json, binary, got 'avro'"):
        Settings.from_env({"SLIPSTREAM_KAFKA_CODEC": "avro"})


@pytest.mark.parametrize("name", ["criteo", "ratings"])
def test_every_spec_round_trips_through_both_codecs(name: str) -> None:
    from slipstream.samples.schema import sample_arrow_schema
    from slipstream.samples.spec import load_spec

    spec = load_spec(name)
    schema = sample_arrow_schema(spec)
    rng = np.random.default_rng(5)
    n = 40
    cols = {}
    for f in schema:
        if f.name == "sample_id":
            cols[f.name] = pa.array([f"s{i}" for i in range(n)])
        elif f.name == "event_time":
            cols[f.name] = pa.array(rng.integers(0, 10**15, n)).cast(pa.timestamp("us", tz="UTC"))
        elif f.name == "label":
            cols[f.name] = pa.array(rng.integers(0, 2, n), pa.int32())
        elif pa.types.is_list(f.type):
            cols[f.name] = pa.array([list(rng.integers(0, 1000, int(rng.integers(0, 5)))) for _ in range(n)], f.type)
        elif f.type == pa.float32():
            cols[f.name] = pa.array(rng.random(n).astype(np.float32))
        else:
            cols[f.name] = pa.array(rng.integers(0, 2**60, n))
    table = pa.table(cols, schema=schema)
    for fmt in ("json", "binary"):
        out = codec.decode_samples(codec.encode_samples(table, fmt, spec), spec)
        assert out.bad == [] and out.table.equals(table), fmt


def test_a_record_of_another_spec_or_layout_is_a_dead_letter(day: pa.Table) -> None:
    from slipstream.samples.spec import load_spec

    mine = codec.encode_samples(day.slice(0, 2), "binary")
    other_spec = codec.decode_samples(mine, load_spec("ratings"))
    assert other_spec.good_index.tolist() == [] and len(other_spec.bad) == 2
    assert "features" in other_spec.bad[0][1] or "another feature spec" in other_spec.bad[0][1]
    json_other = codec.decode_samples(codec.encode_samples(day.slice(0, 1)), load_spec("ratings"))
    assert json_other.bad and "missing required field" in json_other.bad[0][1]
    old = codec.decode_samples([b"\xb1" + mine[0][1:], mine[1]])
    assert old.good_index.tolist() == [1] and "before feature specs" in old.bad[0][1]


def test_json_values_built_by_column_read_as_json_dumps_of_each_row(day: pa.Table) -> None:
    import json
    from datetime import datetime, timedelta

    EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
    odd = day.slice(0, 6)
    ids = ["plain", 'quote"d', "back\\slash", "new\nline", "ünï", "tab\t"]
    odd = odd.set_column(odd.schema.get_field_index("sample_id"), "sample_id", pa.array(ids))
    dense = next(f.name for f in odd.schema if f.type == pa.float32())
    extremes = pa.array(np.array([1e-38, 3.4e38, -0.0, 1e-7, 0.1, 12345678.0], dtype=np.float32))
    odd = odd.set_column(odd.schema.get_field_index(dense), dense, extremes)
    for table in (day, odd, odd.slice(4)):  # with strings only json.dumps escapes, and without
        rows = table.to_pylist()
        for value, row in zip(codec.encode_samples(table), rows):
            row["event_time"] = (row["event_time"] - EPOCH) // timedelta(microseconds=1)
            assert json.loads(value) == json.loads(json.dumps(row, default=str))
        assert codec.decode_samples(codec.encode_samples(table)).table.equals(table)
