"""The spec's Arrow-level transforms: what every path (Spark, the joiner, the generator) computes."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from slipstream.dev.datagen import US_PER_DAY, GeneratorConfig, generate_world, raw_impressions_table, samples_table, simulate
from slipstream.samples.schema import hash_category
from slipstream.samples.spec import load_spec
from slipstream.samples.transform import Featurizer, sample_ids

UTC = UTC
TS = pa.timestamp("us", tz="UTC")


def _synthetic_events(n: int = 4000) -> tuple[pa.Table, pa.Table]:
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=n)
    world = generate_world(cfg)
    t_us = int(cfg.t_handoff.timestamp() * 1e6)
    imp = simulate(cfg, world, t_us - US_PER_DAY, t_us, n, salt=0)
    idx = np.arange(n)
    raw = raw_impressions_table(world, imp, idx).append_column("label", pa.array(imp.label, pa.int32()))
    order = np.lexsort((raw["impression_id"].to_numpy(zero_copy_only=False),
                        raw["ts"].cast(pa.int64()).to_numpy(), raw["user_id"].to_numpy()))
    return raw.take(pa.array(order)), samples_table(world, imp, idx).take(pa.array(order))


def test_the_synthetic_spec_reproduces_the_generators_samples() -> None:
    raw, expected = _synthetic_events()
    got = Featurizer(load_spec("synthetic")).samples(raw)
    assert got.schema == expected.schema
    for name in expected.column_names:
        assert got[name].equals(expected[name]), name


def test_sequences_carry_across_batches_of_one_task() -> None:
    raw, expected = _synthetic_events(3000)
    f = Featurizer(load_spec("synthetic"))
    parts = [f.samples(raw.slice(s, 257)) for s in range(0, raw.num_rows, 257)]  # a user spans batches
    assert pa.concat_tables(parts)["hist_items"].equals(expected["hist_items"])


def _ts(minute: int, day: int = 1) -> datetime:
    return datetime(2026, 11, day, tzinfo=UTC) + timedelta(minutes=minute)


def test_ratings_join_side_tables_split_lists_and_apply_the_rule() -> None:
    spec = load_spec("ratings")
    events = pa.table({
        "user_id": pa.array([1, 1, 1, 2], pa.int64()), "item_id": pa.array([10, 11, 12, 10], pa.int64()),
        "rating": [5.0, 3.0, 4.0, 1.0], "ts": pa.array([_ts(1), _ts(2), _ts(3), _ts(1)], TS),
    })
    users = pa.table({"user_id": pa.array([1], pa.int64()), "gender": ["F"], "age": pa.array([25], pa.int64()),
                      "occupation": pa.array([None], pa.string())})
    items = pa.table({"item_id": pa.array([10, 11], pa.int64()), "title": ["a", "b"], "genres": ["Action|Comedy", ""],
                      "year": pa.array([1999, None], pa.int64())})
    out = Featurizer(spec, {"users": users, "items": items}).samples(events).to_pydict()
    assert out["label"] == [1, 0, 1, 0]  # rating >= 4
    unknown = hash_category("unknown")
    assert out["gender"] == [hash_category("F")] * 3 + [unknown]  # user 2 is not in users: the default
    assert out["occupation"] == [unknown] * 4  # a null optional field takes its default
    assert out["age"][0] == hash_category("25") and out["age"][3] == hash_category("0")
    genres = [hash_category("Action"), hash_category("Comedy")]
    assert out["genres"] == [genres, [], [], genres]
    assert out["year"][0] == pytest.approx(1999 / 2030) and out["year"][1] == pytest.approx(1900 / 2030)  # default 0, clipped
    assert out["hist_items"] == [[], [10], [10, 11], []]  # per user, raw item ids (shared table)
    assert len(set(out["sample_id"])) == 4 and all(s.startswith("h") and len(s) == 17 for s in out["sample_id"])


def test_hashed_ids_are_stable_and_tell_records_apart() -> None:
    spec = load_spec("ratings")
    a = pa.table({"user_id": pa.array([1, 1], pa.int64()), "item_id": pa.array([10, 10], pa.int64()),
                  "rating": [5.0, 5.0], "ts": pa.array([_ts(1), _ts(2)], TS)})
    ids = sample_ids(spec, a).to_pylist()
    assert ids[0] != ids[1]  # same user and item, another time
    assert sample_ids(spec, a.select(["ts", "rating", "item_id", "user_id"])).to_pylist() == ids  # column order is irrelevant


def test_criteo_missing_counts_and_categoricals_take_defaults() -> None:
    spec = load_spec("criteo")
    events = pa.table({"ts": pa.array([_ts(0), _ts(1)], TS), "label": pa.array([1, 0], pa.int32()),
                       "I1": pa.array([3, None], pa.int64()), "C1": pa.array([None, "68fd1e64"], pa.string())})
    out = Featurizer(spec).samples(events)
    assert out.num_rows == 2 and out.column_names == list(spec.sample_columns)
    assert out["label"].to_pylist() == [1, 0]
    i1 = out["i1"].to_pylist()
    assert i1[0] == pytest.approx(np.log1p(3) / 16) and i1[1] == 0.0
    assert out["i2"].to_pylist() == [0.0, 0.0]  # an absent optional column: every row takes the default
    assert out["c1"].to_pylist() == [hash_category(""), hash_category("68fd1e64")]
    assert len(set(out["sample_id"].to_pylist())) == 2
