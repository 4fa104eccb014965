"""KafkaSource.poll keeps each record once: a re-fetch after a reconnect re-delivers offsets the
source already read, and those must not train twice (fast path and one-by-one path agree)."""

from __future__ import annotations

from datetime import date

import numpy as np
import pytest

from slipstream.samples.schema import DEFAULT_SPEC
from trainers.data.rows import DEFAULT_LAYOUT
from slipstream.samples.codec import codec_for, decode_samples, encode_samples
from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.samples.schema import is_holdout
from trainers.data.kafka_source import KafkaSource, StreamCounters


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


class _Consumer:
    def __init__(self, batches: list[list[_Msg]]) -> None:
        self.batches = batches

    def consume(self, num_messages: int, timeout: float) -> list[_Msg]:
        return self.batches.pop(0) if self.batches else []


def _source(positions: dict[int, int], batches: list[list[_Msg]]) -> KafkaSource:
    src = KafkaSource.__new__(KafkaSource)
    src.spec, src.layout = DEFAULT_SPEC, DEFAULT_LAYOUT
    src.topic, src.dlq_topic, src.bootstrap = "t", "t-dlq", "127.0.0.1:1"
    src.partitions = sorted(positions)
    src.positions = dict(positions)
    src.t_us, src.consume_batch, src.consume_timeout_s = 0, 100, 0.0
    src.tail_us = np.iinfo(np.int64).max  # no forward tail
    src.counters = StreamCounters()
    src.wait_s, src.idle, src._dlq = 0.0, False, None
    src.max_future_us, src.dead_lettered = 3600 * 10**6, []
    src.consumer = _Consumer(batches)  # type: ignore[assignment]
    return src


@pytest.fixture(scope="module")
def values() -> list[bytes]:
    day = next(iter(reference_samples(GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=50)).values()))
    return encode_samples(day)


@pytest.mark.parametrize("order", ["in_order", "refetch_inside_batch", "behind_position"])
def test_poll_reads_each_offset_once(values: list[bytes], order: str) -> None:
    offs = {"in_order": [5, 6, 7, 8], "refetch_inside_batch": [5, 6, 5, 6, 7, 8], "behind_position": [3, 4, 5, 6, 7, 8]}[order]
    msgs = [_Msg(0, o, values[o]) for o in offs] + [_Msg(1, o, values[20 + o]) for o in (2, 3)]
    src = _source({0: 5, 1: 2}, [msgs])
    rows = src.poll()
    assert src.counters.records == 6
    pairs = list(zip(rows.partition.tolist(), rows.offset.tolist()))  # held-out rows are filtered out
    assert len(pairs) == len(set(pairs)) and set(pairs) <= {(0, 5), (0, 6), (0, 7), (0, 8), (1, 2), (1, 3)}
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
