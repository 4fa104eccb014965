"""The writer-side step (`spark_jobs.finisher.SampleFinisher`): the spec's features over a task's
sorted batches, against a plain per-row reference, over batch boundaries that split users' runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from slipstream.samples.schema import hash_category
from slipstream.samples.spec import Spec, parse_spec_text
from spark_jobs.finisher import SampleFinisher, tables_from_ipc, tables_to_ipc

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _spec(k: int) -> Spec:
    return parse_spec_text(f"""
spec_version: 1
name: finisher-test
version: 1
sources:
  events:
    kind: events
    id: sample_id
    time: ts
    fields:
      sample_id: {{type: string}}
      ts: {{type: timestamp}}
      user_id: {{type: long}}
      item_id: {{type: long}}
      device: {{type: string}}
      country: {{type: string}}
      clicked: {{type: int}}
label:
  column: {{field: clicked}}
features:
  user_id: {{kind: id, field: user_id, buckets: 101}}
  item_id: {{kind: id, field: item_id, buckets: 101}}
  device_hash: {{kind: categorical, field: device, buckets: 11}}
  country_hash: {{kind: categorical, field: country, buckets: 11}}
  hist_items: {{kind: sequence, field: item_id, per: user_id, length: {k}, shares: item_id}}
""")


def _sorted_rows(n: int, users: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    user = np.sort(rng.integers(0, users, n))  # sorted by user; the row order within a user is time order
    return pa.table({
        "sample_id": [f"s{i}" for i in range(n)],
        "ts": pa.array([T0 + timedelta(seconds=i) for i in range(n)], pa.timestamp("us", tz="UTC")),
        "user_id": pa.array(user, pa.int64()),
        "item_id": pa.array(rng.integers(0, 50, n), pa.int64()),
        "device": rng.choice(["ios", "android", "web", "ünïcode"], n).tolist(),
        "country": rng.choice(["DE", "FR", "US"], n).tolist(),
        "clicked": pa.array(rng.integers(0, 2, n), pa.int32()),
    })


def _reference(t: pa.Table, k: int) -> dict[str, tuple[list[int], int, int]]:
    out: dict[str, tuple[list[int], int, int]] = {}
    seen: dict[int, list[int]] = {}
    for r in t.to_pylist():
        prev = seen.setdefault(r["user_id"], [])
        out[r["sample_id"]] = (prev[-k:] if k else [], hash_category(r["device"]), hash_category(r["country"]))
        prev.append(r["item_id"])
    return out


def _run(finisher: SampleFinisher, t: pa.Table, batch: int) -> pa.Table:
    return pa.Table.from_batches(list(finisher(iter(t.to_batches(max_chunksize=batch)))))


@pytest.mark.parametrize(("n", "users", "batch", "k"), [(500, 7, 13, 20), (500, 200, 3, 5), (60, 1, 7, 20), (40, 40, 5, 3)])
def test_history_and_hashes_equal_the_row_by_row_reference(n: int, users: int, batch: int, k: int) -> None:
    t = _sorted_rows(n, users, seed=n + users)
    got = _run(SampleFinisher(_spec(k), "user_id"), t, batch)
    assert got.column_names == ["sample_id", "event_time", "user_id", "item_id", "device_hash", "country_hash",
                                "hist_items", "label"]
    assert got.schema.field("hist_items").type == pa.list_(pa.int64())
    want = _reference(t, k)
    for r in got.to_pylist():
        assert (r["hist_items"], r["device_hash"], r["country_hash"]) == want[r["sample_id"]], r["sample_id"]
    assert got["label"].to_pylist() == t["clicked"].to_pylist()


def test_a_new_task_starts_without_history() -> None:
    t = _sorted_rows(30, 1, seed=3)
    first = _run(SampleFinisher(_spec(20), "user_id"), t, 10)
    again = _run(SampleFinisher(_spec(20), "user_id"), t.slice(10), 10)
    assert first["hist_items"][10].as_py() == t["item_id"].to_pylist()[:10]
    assert again["hist_items"][0].as_py() == []


def test_dedupe_drops_the_copies_after_the_first_even_across_batches() -> None:
    # sorted by (user, time, id, item): the first copy of each (user, id) is the one to keep
    t = pa.table({
        "sample_id": ["a", "a", "b", "c", "c", "c", "d", "a"],
        "ts": pa.array([T0 + timedelta(seconds=s) for s in (0, 0, 1, 2, 2, 2, 0, 3)], pa.timestamp("us", tz="UTC")),
        "user_id": pa.array([1, 1, 1, 1, 1, 1, 2, 2], pa.int64()),
        "item_id": pa.array([10, 11, 12, 13, 14, 15, 20, 21], pa.int64()),
        "device": ["ios"] * 8,
        "country": ["DE"] * 8,
        "clicked": pa.array([1, 0, 0, 0, 0, 0, 1, 1], pa.int32()),
    })
    for batch in (1, 2, 3, 5, 8):
        finisher = SampleFinisher(_spec(20), "user_id", dedupe=True)
        got = _run(finisher, t, batch)
        # "a" of user 2 is not next to user 1's "a": kept here, left to the job's check
        assert got["sample_id"].to_pylist() == ["a", "b", "c", "d", "a"], batch
        assert got["item_id"].to_pylist() == [10, 12, 13, 20, 21], batch
        assert got["hist_items"].to_pylist() == [[], [10], [10, 12], [], [20]], batch
        assert got["label"].to_pylist() == [1, 0, 0, 1, 1], batch
        assert finisher.dropped == 3, batch


def test_without_dedupe_every_row_stays() -> None:
    t = _sorted_rows(20, 2, seed=1)
    t = pa.concat_tables([t.slice(0, 5), t.slice(4)])  # row 4 twice, side by side
    assert _run(SampleFinisher(_spec(20), "user_id"), t, 3).num_rows == 21


def test_side_tables_travel_as_arrow_ipc() -> None:
    users = pa.table({"user_id": pa.array([1, 2], pa.int64()), "gender": ["F", None]})
    back = tables_from_ipc(tables_to_ipc({"users": users}))
    assert back["users"].equals(users)
