"""Resume across world sizes: buffered rows and cursors re-dealt, states a piece cannot honour refused."""


from __future__ import annotations

import json
from datetime import date

import numpy as np
import pyarrow as pa
import pytest

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.errors import ResumeError
from trainers.data.mixer import ReplayReservoir, StreamShuffle
from trainers.data.rows import SOURCE_KAFKA, Rows, rows_from_state, rows_to_state
from trainers.data.progress import BatchCursor, TrainState


@pytest.fixture(scope="module")
def table() -> pa.Table:
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=600, seed=3)
    return next(iter(reference_samples(cfg).values()))


def _kafka_rows(table: pa.Table, partitions: int = 4) -> Rows:
    n = table.num_rows
    return Rows.from_arrow(table, source=SOURCE_KAFKA, partition=np.arange(n) % partitions, offset=np.arange(n) // partitions)


def _states(rows: Rows, world: int) -> list[dict[str, object]]:
    states = []
    for r in range(world):
        mine = rows.mask(rows.partition % world == r)
        states.append({"iceberg": {"epoch": 1, "chunk": 2, "offset": 5}, "replay": None,
                       "shuffle": {"rows": rows_to_state(mine), "rng": None}})
    return states


def test_stream_resume_on_another_world_size_keeps_every_buffered_row(table: pa.Table) -> None:
    rows = _kafka_rows(table)
    states = _states(rows, 2)
    got: list[str] = []
    for r in range(3):
        parts = list(range(4))[r::3]
        shuffle = StreamShuffle(64, seed=0, rank=r, world=3)
        shuffle.partitions = parts
        shuffle.load_rank_states([s["shuffle"] for s in states])  # type: ignore[misc]
        stream_rows = shuffle.rows
        assert set(stream_rows.partition.tolist()) <= set(parts)
        got += stream_rows.sample_id.to_pylist()
    assert sorted(got) == sorted(table.column("sample_id").to_pylist())


def _cursor(rank: int, world: int, states: list[dict[str, object]]) -> BatchCursor:
    cursor = BatchCursor(TrainState(phase="batch", epoch=1), rank, world)
    cursor.load_rank_states([s["iceberg"] for s in states])  # type: ignore[misc]
    return cursor


def test_batch_resume_mid_epoch_on_another_world_size_re_deals_every_cursor(table: pa.Table) -> None:
    states = _states(Rows.from_arrow(table, source=0), 2)
    for r, s in enumerate(states):
        s["iceberg"] = {"epoch": 1, "chunk": r, "offset": 5}
    for rank in range(3):  # every new rank gets every old rank's cursor; the source takes its share
        assert _cursor(rank, 3, states).resumed == {"redeal": [s["iceberg"] for s in states]}
    assert _cursor(1, 2, states).resumed == states[1]["iceberg"]  # same world: its own cursor
    for s in states:
        s["iceberg"] = {"epoch": 2, "chunk": 0, "offset": 0}  # an epoch boundary: simply the next epoch
    assert _cursor(0, 3, states).resumed is None


def test_pieces_refuse_a_state_they_cannot_honour(table: pa.Table) -> None:
    from trainers.optim.drift_gauge import DriftGauge
    from trainers.data.progress import TrainState

    sh = StreamShuffle(capacity=10, seed=0, rank=0)
    with pytest.raises(ResumeError, match="stream shuffle state is version 99"):
        sh.load_state_dict({**sh.state_dict(), "version": 99})
    res = ReplayReservoir(capacity=10, start_us=0, seed=0, rank=0)
    res.offer(Rows.from_arrow(table, source=0))
    state = res.state_dict()
    with pytest.raises(ResumeError, match="holds 10 rows but 3 keys"):
        ReplayReservoir(capacity=10, start_us=0, seed=0, rank=0).load_state_dict({**state, "keys": state["keys"][:3]})
    gauge = DriftGauge(window_rows=100, low=0.1, high=0.3)
    with pytest.raises(ResumeError, match="drift gauge state .* lacks fresh/replay/weight"):
        gauge.load_state_dict({"version": 1, "fresh": 0.5})
    gauge.load_state_dict({"fresh": 0.5, "replay": 0.4, "weight": 0.5})  # written before states were versioned
    assert gauge.excess == pytest.approx(0.25)
    st = TrainState(step=7, phase="stream", epoch=1, positions={0: 4}, handoff_offsets={0: 2})
    back = TrainState()
    back.load_state_dict(json.loads(json.dumps(st.state_dict())))  # through the checkpoint's meta.json
    assert (back.step, back.phase, back.positions, back.handoff_offsets) == (7, "stream", {0: 4}, {0: 2})
    with pytest.raises(ResumeError, match="phase is 'warmup'"):
        back.load_state_dict({**st.state_dict(), "phase": "warmup"})


def test_replay_samples_of_every_old_rank_are_kept_once_on_another_world_size(table: pa.Table) -> None:
    rows = Rows.from_arrow(table, source=0)
    old = []
    for r in range(3):
        res = ReplayReservoir(capacity=10_000, start_us=0, seed=0, rank=r, world=3)
        res.offer(rows.mask(np.arange(len(rows)) % 3 == r))
        old.append(res.state_dict())
    got: list[str] = []
    for r in range(2):
        res = ReplayReservoir(capacity=10_000, start_us=0, seed=0, rank=r, world=2)
        res.load_rank_states(old)
        got += res.rows.sample_id.to_pylist()
    assert sorted(got) == sorted(table.column("sample_id").to_pylist())
    empty = ReplayReservoir(capacity=10, start_us=0, seed=0, rank=0)
    assert empty.state_dict() is None  # a rank that never offered rows saves nothing


def test_the_checkpoint_registry_loops_over_its_pieces_and_names_what_is_missing() -> None:
    from trainers.checkpoint.pieces import CheckpointPieces

    st, other = TrainState(step=7, phase="stream"), TrainState()
    pieces = CheckpointPieces()
    pieces.add("run", st, "meta")
    with pytest.raises(ValueError, match="registered twice"):
        pieces.add("run", st, "meta")
    with pytest.raises(TypeError, match="not Resharded"):
        pieces.add("run2", st, "data")
    saved = pieces.state_dicts("meta")
    back = CheckpointPieces()
    back.add("run", other, "meta")
    back.add("drift", TrainState(), "meta", optional=True)
    back.load("meta", saved, "step-7")
    assert (other.step, other.phase) == (7, "stream")
    back.add("early", TrainState(), "meta")
    with pytest.raises(ResumeError, match="step-7 has no 'early' state"):
        back.load("meta", saved, "step-7")
