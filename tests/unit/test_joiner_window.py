"""The joiner's pure parts: the window join's rules, raw event parsing, keyed sequence state."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from slipstream.joiner.events import BadEvent, parse_event
from slipstream.joiner.state_store import encode_table, table_kind
from slipstream.joiner.window import KEEP_DONE_WINDOWS, TaskState
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import load_spec
from slipstream.samples.transform import KeyedSequenceState, SequenceHistory

US = 1_000_000
W = 1800 * US
SPEC = load_spec("synthetic")


def _take(s: TaskState, ids: list[str], ts: list[int]) -> list[tuple[int, str]]:
    rows = pa.table({"sample_id": ids, "n": list(range(len(ids)))})
    return s.impressions(ids, np.asarray(ts, dtype=np.int64), rows)


def test_a_click_within_the_window_labels_its_impression_and_one_after_it_does_not() -> None:
    s = TaskState(W)
    assert _take(s, ["a", "b"], [0, 10 * US]) == []
    assert s.click("a", W, b"") is None  # exactly at the window's end: counts (Spark's rule)
    assert s.click("b", 10 * US + W + 1, b"") is None  # one microsecond after: does not
    closed, rejected = s.advance(W)
    assert closed is not None and (closed.ids, closed.label.tolist()) == (["a"], [1]) and not rejected
    closed, _ = s.advance(10 * US + W)
    assert closed is not None and (closed.ids, closed.label.tolist(), closed.late_clicks) == (["b"], [0], 1)
    assert closed.rows.column("n").to_pylist() == [1]  # the row as taken travels with it


def test_duplicates_late_impressions_late_clicks_and_orphans_are_rejected_with_reasons() -> None:
    s = TaskState(W)
    _take(s, ["a"], [0])
    assert [(i, r.split(":")[0]) for i, r in _take(s, ["c", "a", "c"], [5, 5, 6])] == \
        [(1, "duplicate impression id a"), (2, "duplicate impression id c")]  # the first one wins
    assert s.click("x", 100 * US, b'{"x":1}') is None  # its impression may still come
    s.advance(W)
    assert s.click("a", 60 * US, b"").startswith("late click")
    assert _take(s, ["old"], [0])[0][1].startswith("late impression")
    _, rejected = s.advance(100 * US + W)
    assert [r.reason.split(":")[0] for r in rejected] == ["click without impression"]
    assert rejected[0].raw == b'{"x":1}'
    s.advance(KEEP_DONE_WINDOWS * W)  # "a" (time 0) is forgotten: a click on it is a stranger now
    assert s.click("a", 60 * US, b"").startswith("click without impression")


def test_an_orphan_click_joins_its_impression_when_it_arrives() -> None:
    s = TaskState(W)
    s.click("a", 30 * US, b"")
    _take(s, ["a"], [0])
    closed, rejected = s.advance(W)
    assert closed is not None and (closed.ids, closed.label.tolist()) == (["a"], [1]) and not rejected


def test_changes_replayed_give_the_same_state() -> None:
    s = TaskState(W)
    _take(s, [f"i{i}" for i in range(50)], [i * 60 * US for i in range(50)])
    s.click("i3", 200 * US, b"")
    s.click("i40", 41 * 60 * US, b"")
    s.click("zz", 10 * US, b"{}")
    log = [s.changes()]
    s.advance(20 * 60 * US + W)
    _take(s, ["late-but-in-time"], [30 * 60 * US])
    log.append(s.changes())
    r = TaskState(W)
    for rows, delta in log:  # as the changelog stores them: Arrow IPC, then JSON
        for value in encode_table(rows, "impressions") if rows is not None else ():
            table = pa.ipc.open_stream(value).read_all()
            assert table_kind(table) == "impressions"
            r.apply_rows(table)
        r.apply(json.loads(json.dumps(delta)))
    assert (r.waiting, r.clicks, r.orphans, r.done, r.watermark_us) == (s.waiting, s.clicks, s.orphans, s.done, s.watermark_us)
    got, want = r.advance(40 * 60 * US + W)[0], s.advance(40 * 60 * US + W)[0]
    assert got is not None and want is not None
    assert sorted(zip(got.ids, got.label.tolist())) == sorted(zip(want.ids, want.label.tolist()))
    assert got.rows.sort_by("sample_id").equals(want.rows.sort_by("sample_id"))


@pytest.mark.parametrize("value, reason", [
    (b"{oops", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({"impression_id": "a", "ts": "2026-11-01T00:00:00Z"}).encode(), "missing field user_id"),
    (json.dumps({"impression_id": "a", "ts": "yesterday"}).encode(), "ts 'yesterday' is not an ISO-8601 time"),
])
def test_bad_raw_events_name_the_problem(value: bytes, reason: str) -> None:
    with pytest.raises(BadEvent, match=reason):
        parse_event(value, SPEC.events)


def test_raw_event_times_are_iso_text_or_epoch_milliseconds() -> None:
    clicks = SPEC.label_source
    assert clicks is not None
    _, t1 = parse_event(b'{"impression_id": "a", "ts": "2026-11-01T00:00:01.5Z"}', clicks)
    _, t2 = parse_event(b'{"impression_id": "a", "ts": 1793491201500}', clicks)
    assert t1 == t2 == 1_793_491_201_500_000


def test_keyed_sequences_over_time_ordered_batches_equal_one_sorted_pass() -> None:
    rng = np.random.default_rng(0)
    n = 3000
    keys, days = rng.integers(0, 50, n), rng.integers(0, 2, n)
    t, vals = rng.integers(0, 10**6, n), rng.integers(0, 1000, n)
    order = np.lexsort((t, days, keys))
    expected = dict(zip(order.tolist(), SequenceHistory(5)(keys[order], days[order], vals[order]).to_pylist()))
    state, got = KeyedSequenceState(5), {}
    for chunk in np.array_split(np.lexsort((t, days)), 37):  # batches in time order, as windows close
        o = chunk[np.lexsort((t[chunk], days[chunk], keys[chunk]))]
        got.update(zip(o.tolist(), state(keys[o], days[o], vals[o]).to_pylist()))
    assert got == expected
    restored = KeyedSequenceState(5)
    restored.load(state.take_changes())
    assert {k: (d, v.tolist()) for k, (d, v) in restored.tails.items()} == \
        {k: (d, v.tolist()) for k, (d, v) in state.tails.items()}


def test_batch_parsing_gives_the_rows_of_one_by_one_parsing_or_defers_to_it() -> None:
    from slipstream.joiner.events import parse_batch

    good = [json.dumps({"impression_id": f"i{i}", "ts": f"2026-11-01T00:00:0{i}.25Z", "user_id": i, "item_id": 3,
                        "device": "ios", "country": "de", "item_category": "c", "price": 1.5, "position": 2,
                        "item_age_days": 1.0, "user_tenure_days": 2.0, "extra": "ignored"}).encode() for i in range(3)]
    rows = [parse_event(v, SPEC.events)[0] for v in good]
    assert parse_batch(good, SPEC.events).equals(pa.Table.from_pylist(rows, schema=source_arrow_schema(SPEC.events)))
    bad = json.dumps({"impression_id": "x", "ts": "2026-11-01T00:00:00Z"}).encode()  # user_id missing
    nan = good[0].replace(b'"price": 1.5', b'"price": NaN')
    for batch in (good + [bad], good + [b"{oops"], good + [nan], good + [b""]):
        assert parse_batch(batch, SPEC.events) is None


def test_a_batch_with_bad_records_keeps_the_good_ones_and_names_each_bad_one() -> None:
    from slipstream.joiner.events import parse_records

    good = json.dumps({"impression_id": "i", "ts": "2026-11-01T00:00:00Z", "user_id": 1, "item_id": 3, "device": "ios",
                       "country": "de", "item_category": "c", "price": 1.5, "position": 2, "item_age_days": 1.0,
                       "user_tenure_days": 2.0}).encode()
    huge = good.replace(b'"user_id": 1', b'"user_id": 99999999999999999999')  # an int, but not an int64
    rows, ts, bad = parse_records([good, b"{oops", huge, good], SPEC.events)
    assert rows.num_rows == 2 and ts.tolist() == [1_793_491_200_000_000] * 2
    assert [(i, r.split(":")[0]) for i, r in bad] == [(1, "not JSON"), (2, "wrong type")]


def test_pending_rows_close_exactly_the_rows_the_watermark_passes_in_any_arrival_order() -> None:
    from slipstream.joiner.window import PendingRows

    rng = np.random.default_rng(3)
    pending, waiting = PendingRows(), set()
    for step in range(300):  # batches of out-of-order times, the cut moving forward now and then
        ts = rng.integers(step * 100, step * 100 + 5000, int(rng.integers(0, 40)))
        ids = [f"{step}-{i}" for i in range(len(ts))]
        pending.add(pa.table({"sample_id": ids}), ts)
        waiting |= {(s, int(t)) for s, t in zip(ids, ts.tolist())}
        if step % 7 == 0:
            cut = step * 100 - 2000
            taken = pending.take_until(cut)
            got = set() if taken is None else set(zip(taken[0].column("sample_id").to_pylist(), taken[1].tolist()))
            assert got == {(s, t) for s, t in waiting if t <= cut}
            waiting -= got
    assert len(pending) == len(waiting) and len(pending.chunks) <= 2 * int(np.log2(len(waiting) + 1)) + 2


def _restored(log: list) -> TaskState:  # type: ignore[type-arg]
    r = TaskState(W)
    for rows, delta in log:
        if rows is not None:
            r.apply_rows(rows)
        r.apply(json.loads(json.dumps(delta)))
    return r


def test_a_sample_id_is_emitted_once_for_duplicates_up_to_two_windows_later_also_after_a_restore() -> None:
    """What the joiner guarantees per sample id: a duplicate impression whose event time is at most
    two attribution windows after the first one's is rejected (as a duplicate while the id is
    remembered, as late after), whether the first is waiting or emitted, before or after a
    restart; one more than two windows later can be emitted again (the documented horizon)."""
    s = TaskState(W)
    _take(s, ["a"], [0])
    log = [s.changes()]
    for state in (s, _restored(log)):  # waiting
        assert _take(state, ["a"], [W])[0][1].startswith("duplicate impression id a")
    closed, _ = s.advance(W)
    assert closed is not None and closed.ids == ["a"]
    log.append(s.changes())
    for state in (s, _restored(log)):  # emitted
        for t in (0, W, 2 * W):
            assert _take(state, ["a"], [t])[0][1].startswith("duplicate impression id a"), t
    s.advance(KEEP_DONE_WINDOWS * W)  # "a" is forgotten; a re-send within two windows is late by now
    assert _take(s, ["a"], [2 * W])[0][1].startswith("late impression")
    assert _take(s, ["a"], [2 * W + 1]) == []  # beyond the horizon: a new impression as far as the join knows
