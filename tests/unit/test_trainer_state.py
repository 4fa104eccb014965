"""Fast trainer pieces: config validation, stream shuffle/replay, resume across world sizes,
atomic checkpoints and audit parts, the model's variable-length history."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.errors import ConfigError, ResumeError
from slipstream.samples.schema import DEFAULT_SPEC
from slipstream.settings import Settings
from trainers.audit import AuditWriter, drop_uncommitted, read_audit
from trainers.checkpoint import Checkpointer
from trainers.config import ModelConfig, load_config
from trainers.data.mixer import ReplayReservoir, StreamShuffle
from trainers.models import build_model
from tests.trainer_fixtures import SMALL_BUCKETS
from trainers.rows import SOURCE_KAFKA, SOURCE_REPLAY, Features, Rows, rows_from_state, rows_to_state
from trainers.state import resume_point


@pytest.fixture(scope="module")
def table() -> pa.Table:
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=600, seed=3)
    return next(iter(reference_samples(cfg).values()))


def _kafka_rows(table: pa.Table, partitions: int = 4) -> Rows:
    n = table.num_rows
    return Rows.from_arrow(table, source=SOURCE_KAFKA, partition=np.arange(n) % partitions, offset=np.arange(n) // partitions)


def _cfg(tmp_path: Path, *sets: str) -> object:
    base = ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"]
    return load_config(None, [*base, *sets], Settings(home=tmp_path))


def test_config_validates_with_dotted_names(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "data.stop.mode=samples", "data.stop.samples=10", "model.top_mlp=[8, 4]")
    assert cfg.data.stop.samples == 10 and cfg.model.top_mlp == [8, 4]  # type: ignore[attr-defined]
    assert cfg.run.runs_dir == str(tmp_path / "runs")  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="data.replay_share"):
        _cfg(tmp_path, "data.replay_share=1.5")
    with pytest.raises(ConfigError, match="timezone"):
        _cfg(tmp_path, "data.t_handoff=2026-11-03T00:00:00")
    with pytest.raises(ConfigError, match="unknown key.*data.batchsize"):
        _cfg(tmp_path, "data.batchsize=3")
    with pytest.raises(ConfigError, match="missing required key.*data.snapshot_id"):
        load_config(None, ["data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"], Settings(home=tmp_path))


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


def _states(rows: Rows, world: int) -> list[dict[str, object]]:
    states = []
    for r in range(world):
        mine = rows.mask(rows.partition % world == r)
        states.append({"iceberg": {"epoch": 1, "chunk": 2, "offset": 5}, "replay": None,
                       "shuffle": {"rows": rows_to_state(mine), "rng": None}})
    return states


def test_stream_resume_on_another_world_size_keeps_every_buffered_row(table: pa.Table) -> None:
    rows = _kafka_rows(table)
    meta = {"world": 2, "step": 9, "phase": "stream", "epoch": 1, "positions": {str(p): 10 for p in range(4)}}
    states = _states(rows, 2)
    got: list[str] = []
    for r in range(3):
        parts = list(range(4))[r::3]
        rp = resume_point(meta, states, r, 3, parts)
        stream_rows = rows_from_state(rp.shuffle["rows"]) if rp.shuffle is not None else None
        assert stream_rows is not None and set(stream_rows.partition.tolist()) <= set(parts)
        got += stream_rows.sample_id.to_pylist()
    assert sorted(got) == sorted(table.column("sample_id").to_pylist())


def test_batch_resume_mid_epoch_on_another_world_size_re_deals_every_cursor(table: pa.Table) -> None:
    meta = {"world": 2, "step": 9, "phase": "batch", "epoch": 1}
    states = _states(Rows.from_arrow(table, source=0), 2)
    for r, s in enumerate(states):
        s["iceberg"] = {"epoch": 1, "chunk": r, "offset": 5}
    for rank in range(3):  # every new rank gets every old rank's cursor; the source takes its share
        assert resume_point(meta, states, rank, 3, None).iceberg == {"redeal": [s["iceberg"] for s in states]}
    assert resume_point(meta, states, 1, 2, None).iceberg == states[1]["iceberg"]  # same world: its own cursor
    for s in states:
        s["iceberg"] = {"epoch": 2, "chunk": 0, "offset": 0}  # an epoch boundary: simply the next epoch
    rp = resume_point(meta, states, 0, 3, None)
    assert rp.state.epoch == 1 and rp.iceberg is None


def test_checkpoint_commit_is_atomic_and_uncommitted_audit_is_dropped(tmp_path: Path, table: pa.Table) -> None:
    ck = Checkpointer(tmp_path / "checkpoint", rank=0, barrier=lambda: None, keep=2)
    audit = AuditWriter(tmp_path / "audit", rank=0)
    rows = Rows.from_arrow(table, source=0, epoch=0)
    for step in (1, 2, 3):
        audit.add(rows.slice(step * 10, step * 10 + 10), step)
        audit.write_part(step)
        ck.save(step, {"model": {}}, {"x": step}, {"step": step, "world": 1})
    assert ck.latest() == tmp_path / "checkpoint" / "step-000000003"
    assert sorted(p.name for p in (tmp_path / "checkpoint").glob("step-*")) == ["step-000000002", "step-000000003"]
    # a kill after writing the audit part of step 4 but before its checkpoint committed
    audit.add(rows.slice(40, 50), 4)
    audit.write_part(4)
    (tmp_path / "checkpoint" / "step-000000004.tmp").mkdir()
    assert json.loads((ck.latest() / "meta.json").read_text())["step"] == 3  # type: ignore[operator]
    drop_uncommitted(tmp_path / "audit", 3)
    assert read_audit(tmp_path).column("sample_id").to_pylist() == rows.slice(10, 40).sample_id.to_pylist()


def test_model_consumes_variable_length_histories_without_padding(table: pa.Table) -> None:
    rows = Rows.from_arrow(table.slice(0, 64), source=0)
    lengths = np.diff(rows.list_offsets[0])
    assert lengths.min() == 0 and lengths.max() > 1  # empty and long histories in one batch
    model = build_model(DEFAULT_SPEC, ModelConfig(buckets=SMALL_BUCKETS, embed_dim=4), seed=0)
    out = model(Features.from_rows(rows))
    assert out.shape == (64,) and torch.isfinite(out).all()
    empty = model(Features.from_rows(Rows.empty()))
    assert empty.shape == (0,)


def test_the_example_config_loads_with_the_run_keys(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "trainers" / "configs" / "example.yaml"
    cfg = load_config(example, ["data.snapshot_id=42", "data.t_handoff=2026-11-04T00:00:00Z", "run.run_id=d"],
                      Settings(home=tmp_path))
    assert cfg.data.snapshot_id == 42 and cfg.data.window_start.isoformat() == "2026-11-01T00:00:00+00:00"
    with pytest.raises(ConfigError, match="data.snapshot_id"):
        load_config(example, ["data.t_handoff=2026-11-04T00:00:00Z", "run.run_id=d"], Settings(home=tmp_path))


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


def test_pieces_refuse_a_state_they_cannot_honour(table: pa.Table) -> None:
    from trainers.drift import DriftGauge
    from trainers.state import TrainState

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


def test_the_kafka_source_refuses_positions_without_its_partitions() -> None:
    from trainers.data.kafka_source import KafkaSource

    src = KafkaSource(bootstrap="127.0.0.1:9", topic="t", dlq_topic="t.dlq", partitions=[0, 1], positions={0: 5, 1: 7},
                      t_handoff_us=0, consume_batch=10, consume_timeout_s=0.1, lag_interval_s=1.0, group="g")
    try:
        assert src.state_dict()["positions"] == {0: 5, 1: 7}
        src.load_state_dict({"version": 1, "positions": {"0": 9, "1": 11, "2": 3}})
        assert src.positions == {0: 9, 1: 11}
        with pytest.raises(ResumeError, match=r"no offset for partition\(s\) \[1\] of t"):
            src.load_state_dict({"version": 1, "positions": {0: 9}})
    finally:
        src.consumer.close()


def test_rows_of_an_older_schema_take_the_features_defaults() -> None:
    """A column the spec gained later is null in older snapshots' rows: each takes the feature's
    default through its transform, as a record without the field does, never a cast NaN."""
    from trainers.rows import RowLayout

    table = reference_samples(GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=50))["2026-11-01"]
    layout = RowLayout.from_spec(DEFAULT_SPEC)
    j = layout.sparse.index("country_hash")
    nulls = pa.nulls(table.num_rows, pa.int64())
    old = table.set_column(table.schema.get_field_index("country_hash"), "country_hash", nulls)
    old = old.set_column(old.schema.get_field_index("price_log"), "price_log", pa.nulls(table.num_rows, pa.float32()))
    rows = Rows.from_arrow(old, layout, source=0)
    assert (rows.sparse[:, j] == layout.sparse_defaults[j]).all()
    assert (rows.dense[:, layout.dense.index("price_log")] == layout.dense_defaults[layout.dense.index("price_log")]).all()
    fresh = Rows.from_arrow(table, layout, source=0)
    assert (fresh.sparse[:, j] == table.column("country_hash").to_numpy()).all()
