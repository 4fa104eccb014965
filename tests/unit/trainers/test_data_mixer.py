"""The stream phase's shuffle buffer and replay reservoir: every row once, the replay sample, exact state round trips."""


from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa
import pytest

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from trainers.data.mixer import ReplayReservoir, StreamShuffle
from trainers.data.rows import SOURCE_KAFKA, SOURCE_REPLAY, Rows


@pytest.fixture(scope="module")
def table() -> pa.Table:
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=600, seed=3)
    return next(iter(reference_samples(cfg).values()))


def _kafka_rows(table: pa.Table, partitions: int = 4) -> Rows:
    n = table.num_rows
    return Rows.from_arrow(table, source=SOURCE_KAFKA, partition=np.arange(n) % partitions, offset=np.arange(n) // partitions)


def test_stream_shuffle_emits_every_row_once(table: pa.Table) -> None:
    rows = _kafka_rows(table)
    sh = StreamShuffle(capacity=100, seed=1, rank=0)
    out: list[str] = []
    for s in range(0, len(rows), 37):
        sh.add(rows.slice(s, s + 37))
        out += sh.take(32, idle=False).sample_id.to_pylist()
    while len(sh):
        out += sh.take(32, idle=True).sample_id.to_pylist()
    assert sorted(out) == sorted(table.column("sample_id").to_pylist())
    assert out[:50] != table.column("sample_id").to_pylist()[:50]  # mixed, not in arrival order


def test_replay_reservoir_keeps_recent_rows_and_marks_replays(table: pa.Table) -> None:
    rows = Rows.from_arrow(table, source=0)
    cut = int(np.median(rows.event_us))
    res = ReplayReservoir(capacity=50, start_us=cut, seed=0, rank=0)
    for s in range(0, len(rows), 100):
        res.offer(rows.slice(s, s + 100))
    assert len(res) == 50 and (res.rows.event_us >= cut).all()
    drawn = res.draw(20)
    assert len(drawn) == 20 and (drawn.source == SOURCE_REPLAY).all()


def test_replay_reservoir_keeps_the_rows_with_the_largest_keys_of_all_offers(table: pa.Table) -> None:
    """The sample is exactly the `capacity` offered rows whose random keys are largest (a uniform
    sample), however the offers were merged; resumed from a checkpoint mid-way it ends the same."""
    rows = Rows.from_arrow(table, source=0)
    res = ReplayReservoir(capacity=60, start_us=0, seed=4, rank=1)
    rng = np.random.default_rng([4, 1, 29])
    keyed: list[tuple[float, str]] = []
    resumed = None
    for s in range(0, len(rows), 7):
        part = rows.slice(s, s + 7)
        res.offer(part)
        if resumed is not None:
            resumed.offer(part)
        keyed += zip(rng.random(len(part)).tolist(), part.sample_id.to_pylist())
        if s == 350:
            resumed = ReplayReservoir(capacity=60, start_us=0, seed=0, rank=0)
            resumed.load_state_dict(res.state_dict())
    want = [sid for _, sid in sorted(keyed, reverse=True)[:60]]
    assert res.rows.sample_id.to_pylist() == want, "the largest keys, largest first"
    assert resumed is not None and resumed.rows.sample_id.to_pylist() == want


def test_buffers_resume_from_their_state_dict_exactly(table: pa.Table) -> None:
    rows = _kafka_rows(table)
    sh = StreamShuffle(capacity=50, seed=1, rank=0)
    sh.add(rows.slice(0, 300))
    sh.take(20, idle=False)
    saved = sh.state_dict()
    again = StreamShuffle(capacity=50, seed=9, rank=3)  # another seed: the saved RNG must win
    again.load_state_dict(saved)
    assert sh.take(40, idle=True).sample_id.to_pylist() == again.take(40, idle=True).sample_id.to_pylist()

    res = ReplayReservoir(capacity=40, start_us=0, seed=0, rank=0)
    res.offer(Rows.from_arrow(table, source=0))
    copy = ReplayReservoir(capacity=40, start_us=0, seed=5, rank=1)
    copy.load_state_dict(res.state_dict())
    assert res.draw(30).sample_id.to_pylist() == copy.draw(30).sample_id.to_pylist()
    assert copy.replayed == 30


def test_the_replay_reservoir_never_holds_a_row_at_or_after_its_end(table: pa.Table) -> None:
    """Its end is where the batch phase's training rows end: the validation days after it are
    evaluation rows and are never replayed, whatever is offered."""
    rows = Rows.from_arrow(table, source=0)
    end = int(np.quantile(rows.event_us, 0.7))
    res = ReplayReservoir(capacity=10_000, start_us=0, seed=0, rank=0, end_us=end)
    res.offer(rows)
    assert len(res) == int((rows.event_us < end).sum()) > 0 and (res.rows.event_us < end).all()
    assert (res.draw(500).event_us < end).all()
