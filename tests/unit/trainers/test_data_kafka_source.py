"""KafkaSource turns the committed records its reader hands over into training rows: held-out
records never train, bad records, out-of-range event times and duplicate sample ids are dead
letters with their origin, and each is counted once."""

from __future__ import annotations

from datetime import UTC, date, datetime

import numpy as np
import pyarrow as pa
import pytest

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.samples.codec import codec_for, decode_samples, encode_samples
from slipstream.samples.schema import DEFAULT_SPEC, is_holdout
from trainers.data.dedupe import SampleIdDedupe
from trainers.data.kafka_source import KafkaSource, StreamCounters, checked_positions
from trainers.data.rows import DEFAULT_LAYOUT


class _Msg:
    def __init__(self, p: int, o: int, value: bytes) -> None:
        self.p, self.o, self.v = p, o, value

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def value(self) -> bytes:
        return self.v

    def key(self) -> bytes:
        return b"k%d-%d" % (self.p, self.o)

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000 + self.o)


class _Reader:
    """What KafkaSource asks of its CommittedReader: batches of records, positions after them."""

    def __init__(self, positions: dict[int, int], batches: list[list[_Msg]]) -> None:
        self.positions, self.batches = dict(positions), batches

    def poll(self, max_records: int, timeout_s: float) -> list[_Msg]:
        out = self.batches.pop(0) if self.batches else []
        for m in out:
            self.positions[m.p] = m.o + 1
        return out


def _source(positions: dict[int, int], batches: list[list[_Msg]], t_us: int = 0,
            dedupe: SampleIdDedupe | None = None) -> KafkaSource:
    src = KafkaSource.__new__(KafkaSource)
    src.spec, src.layout = DEFAULT_SPEC, DEFAULT_LAYOUT
    src.topic, src.dlq_topic, src.bootstrap = "t", "t-dlq", "127.0.0.1:1"
    src.partitions = sorted(positions)
    src.t_us, src.consume_batch, src.consume_timeout_s = t_us, 100, 0.0
    src.tail_us = np.iinfo(np.int64).max  # no forward tail
    src.counters = StreamCounters()
    src.wait_s, src.idle, src._dlq = 0.0, False, None
    src.max_future_us, src.max_age_s, src.dedupe = 3600 * 10**6, 400 * 86400.0, dedupe
    src.dead_lettered, src.duplicated = [], []
    src.reader = _Reader(positions, batches)  # type: ignore[assignment]
    return src


@pytest.fixture(scope="module")
def values() -> list[bytes]:
    day = next(iter(reference_samples(GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=50)).values()))
    return encode_samples(day)


def test_poll_hands_over_each_record_with_its_origin(values: list[bytes]) -> None:
    msgs = [_Msg(0, o, values[o]) for o in (5, 6, 8)] + [_Msg(1, o, values[20 + o]) for o in (2, 3)]
    src = _source({0: 5, 1: 2}, [msgs])
    rows = src.poll()
    assert src.counters.records == 5 and src.idle  # fewer records than asked: caught up
    pairs = list(zip(rows.partition.tolist(), rows.offset.tolist()))  # held-out rows are filtered out
    assert len(pairs) == len(set(pairs)) and set(pairs) <= {(0, 5), (0, 6), (0, 8), (1, 2), (1, 3)}
    assert src.positions == {0: 9, 1: 4}
    assert np.all(rows.record_ms == 1_000 + rows.offset)


def test_held_out_records_are_counted_and_never_train(values: list[bytes]) -> None:
    src = _source({0: 0}, [[_Msg(0, o, v) for o, v in enumerate(values)]])
    rows = src.poll()
    ids = decode_samples(values).table.column("sample_id")
    held = is_holdout(ids)
    assert 0 < held.sum() < len(values)  # the day holds both kinds
    assert src.counters.holdout == int(held.sum()) and src.counters.fresh == len(rows) == len(values) - held.sum()
    assert sorted(rows.sample_id.to_pylist()) == sorted(i for i, h in zip(ids.to_pylist(), held) if not h)
    assert np.array_equal(rows.offset, np.flatnonzero(~held))  # each trained row keeps its own record's offset


def test_forward_tail_records_are_counted_and_never_train(values: list[bytes]) -> None:
    """Records at or after the forward tail's start are kept out of training (they are scored at
    the end), counted apart from the hash hold-out; the newest event handed to training is before it."""
    table = decode_samples(values).table
    us = table.column("event_time").cast("int64").to_numpy()
    held = is_holdout(table.column("sample_id"))
    src = _source({0: 0}, [[_Msg(0, o, v) for o, v in enumerate(values)]])
    src.tail_us = int(np.median(us))
    rows = src.poll()
    tail = us >= src.tail_us
    assert 0 < tail.sum() < len(values) and (rows.event_us < src.tail_us).all()
    assert src.counters.forward_tail == int((tail & ~held).sum()) and src.counters.holdout == int(held.sum())
    assert len(rows) == int((~tail & ~held).sum()) and src.counters.newest_event_us == int(rows.event_us.max())


def test_binary_records_train_and_bad_ones_are_dead_letters_with_their_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    day = next(iter(reference_samples(GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=50)).values()))
    good = encode_samples(day, "binary")
    nan = bytearray(good[3])
    at = codec_for().binary.fixed.fields["dense"][1]  # the first dense value in the record's head
    nan[at:at + 4] = np.array([np.nan], dtype="<f4").tobytes()
    bad = {11: good[1][:30], 12: bytes(nan), 13: b"", 14: good[4][:-1]}
    msgs = [_Msg(0, 10, good[0])] + [_Msg(0, o, v) for o, v in bad.items()] + [_Msg(0, 15, good[2])]
    src = _source({0: 10}, [msgs])
    letters: list[tuple[int, int, str]] = []
    kept: list[tuple[bytes | None, bytes | None]] = []

    def dead_letter(value: bytes | None, key: bytes | None, reason: str, p: int, o: int) -> None:
        letters.append((p, o, reason))
        kept.append((value, key))

    monkeypatch.setattr(src, "_dead_letter", dead_letter)
    rows = src.poll()
    assert src.positions == {0: 16}
    assert [(p, o) for p, o, _ in letters] == [(0, o) for o in bad]
    assert kept == [(v, b"k0-%d" % o) for o, v in bad.items()]  # each letter keeps its own record's value and key
    assert "not a finite number" in letters[1][2] and letters[2][2] == "empty value"
    trained = set(rows.sample_id.to_pylist())
    assert trained <= {day.column("sample_id")[i].as_py() for i in (0, 2)} and src.counters.records == 6
    assert src.counters.fresh + src.counters.holdout == 2


def _day() -> pa.Table:
    return next(iter(reference_samples(GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=80)).values()))


def _us(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


def test_a_repeated_sample_id_trains_once_and_is_a_dead_letter_counted_as_duplicate() -> None:
    day = _day()
    trainable = day.filter(pa.array(~is_holdout(day.column("sample_id"))))
    first = trainable.slice(0, 6)
    again = trainable.slice(2, 2)  # ids 2 and 3 once more, later on the same partition
    values = encode_samples(first) + encode_samples(again) + encode_samples(trainable.slice(6, 1))
    t_us = _us(datetime(2026, 11, 1, tzinfo=UTC))
    dedupe = SampleIdDedupe(horizon_s=3 * 3600, max_ids=1000)
    src = _source({0: 0}, [[_Msg(0, o, v) for o, v in enumerate(values[:7])], [_Msg(0, 7, values[7]), _Msg(0, 8, values[8])]],
                  t_us=t_us, dedupe=dedupe)
    sent: list[tuple[int, int, str]] = []
    src._send_dead_letter = lambda value, key, reason, p, o: sent.append((p, o, reason))  # type: ignore[method-assign]
    rows = [src.poll(), src.poll()]  # the second copy of id 3 comes in another consume call
    trained = [i for r in rows for i in r.sample_id.to_pylist()]
    ids = trainable.column("sample_id").to_pylist()
    assert sorted(trained) == sorted(ids[:7])  # each id once
    assert [(p, o) for p, o, _ in sent] == [(0, 6), (0, 7)] and all(f"duplicate sample id {ids[i]}" in r
                                                                    for (_, _, r), i in zip(sent, (2, 3)))
    assert src.take_duplicates() == [(0, 6, ids[2]), (0, 7, ids[3])]
    assert src.counters.duplicates == 2 and src.counters.dead_letters == 0 and src.counters.fresh == 7


def test_an_event_time_long_before_t_is_a_dead_letter_not_dropped_before_t() -> None:
    day = _day()
    t_us = _us(datetime(2026, 11, 1, tzinfo=UTC))
    old = day.slice(0, 2).set_column(day.schema.get_field_index("event_time"), "event_time",
                                     pa.array([datetime(1971, 3, 1, tzinfo=UTC)] * 2, day.schema.field("event_time").type))
    recent = day.slice(2, 1)  # the generator's day is before T: dropped before T, as the batch trained it
    values = encode_samples(old) + encode_samples(recent)
    src = _source({0: 0}, [[_Msg(0, o, v) for o, v in enumerate(values)]], t_us=t_us + 86_400 * 10**6)
    reasons: list[str] = []
    src._send_dead_letter = lambda value, key, reason, p, o: reasons.append(reason)  # type: ignore[method-assign]
    src.poll()
    assert src.counters.dead_letters == 2 and src.counters.dropped_before_t == 1
    assert [(p, o) for p, o, _ in src.take_dead_letters()] == [(0, 0), (0, 1)]
    assert all(r.startswith("event_time out of range: 1971-03-01") and "data.max_age_s" in r for r in reasons), reasons


def test_positions_of_a_checkpoint_must_name_every_partition_read() -> None:
    from slipstream.errors import ResumeError

    assert checked_positions("t", [0, 1], {"version": 1, "positions": {"0": 9, "1": 11, "2": 3}}) == {0: 9, 1: 11}
    with pytest.raises(ResumeError, match=r"no offset for partition\(s\) \[1\] of t"):
        checked_positions("t", [0, 1], {"version": 1, "positions": {0: 9}})
