"""Honest scores: the bootstrap over users, the prequential record as a checkpoint piece (no score
lost or counted twice on a resume at any world size), windows of event time, and dense statistics
that never see an evaluation row."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.samples.schema import DEFAULT_SPEC, is_holdout
from slipstream.scoring import UserBootstrap, auc
from trainers.checkpoint.pieces import CheckpointPieces
from trainers.checkpoint.statefile import decode_state, encode_state
from trainers.data.dense_stats import window_dense_stats
from trainers.data.rows import RowLayout
from trainers.data.units import WorkUnit
from trainers.eval.prequential import PrequentialScores, progress, window_seconds, windows


def _scored(piece: PrequentialScores, start: int, n: int) -> None:
    """Rows `start..start+n` (their label, user and event time encode their index)."""
    idx = np.arange(start, start + n)
    piece.add((idx % 3 == 0).astype(np.float32), idx % 7, idx * 1_000_000, model=idx / 1e6, baseline=idx / 2e6)


def test_the_bootstrap_resamples_users_and_pairs_the_models() -> None:
    rng = np.random.default_rng(0)
    users = rng.integers(0, 200, 4000)
    y = (rng.random(4000) < 0.3).astype(float)
    good = 0.5 * y + rng.random(4000)
    worse = good + 0.3 * rng.standard_normal(4000)
    boot = UserBootstrap(y, users)
    a, b, d = boot.auc(good), boot.auc(worse), boot.diff(good, worse)
    assert a.value == pytest.approx(auc(y, good)) and a.lo < a.value < a.hi
    assert d.value == pytest.approx(a.value - b.value) and d.lo > 0  # clearly better, shown so
    # paired: same users in every resample, so the difference's interval is narrower than two
    # independent intervals would make it
    assert d.width < 0.9 * float(np.hypot(a.width, b.width))
    # whole users are resampled, not rows: ten identical rows per user are one observation, not ten
    y10, p10, u10 = np.repeat(y[:400], 10), np.repeat(good[:400], 10), np.repeat(np.arange(400), 10)
    by_user, by_row = UserBootstrap(y10, u10).auc(p10), UserBootstrap(y10, np.arange(4000)).auc(p10)
    assert by_user.width > 2 * by_row.width
    assert not UserBootstrap(y[:5], users[:5]).auc(good[:5]).has_interval  # too few rows: no interval


def test_prequential_scores_survive_a_resume_on_any_world_size_exactly_once() -> None:
    olds = [PrequentialScores(10_000, r, 2) for r in range(2)]
    _scored(olds[0], 0, 300)
    _scored(olds[1], 300, 200)
    states = [decode_state(encode_state({"p": p.state_dict()})[0])["p"] for p in olds]
    for world in (1, 2, 3):
        news = [PrequentialScores(10_000, r, world) for r in range(world)]
        for p in news:
            p.load_rank_states(states)
        got = np.concatenate([p.columns()["event_us"] for p in news]) // 1_000_000
        assert sorted(got.tolist()) == list(range(500))  # every score once, none twice
        assert sum(p.seen for p in news) == 500
    one = PrequentialScores(10_000, 0, 1)
    one.load_rank_states([None, None])  # a checkpoint from before the stream phase
    assert len(one) == 0 and one.state_dict() is None


def test_prequential_scores_keep_the_newest_rows_past_their_cap_and_count_all() -> None:
    p = PrequentialScores(1000, 0, 1)
    for s in range(0, 5000, 250):
        _scored(p, s, 250)
    cols = p.columns()
    assert len(cols["label"]) == 1000 and p.seen == 5000
    assert cols["event_us"].min() // 1_000_000 == 4000  # the newest thousand
    p.mark_live()
    _scored(p, 5000, 10)
    assert len(p.columns(since_live=True)["label"]) == 10


def test_a_prequential_piece_registers_as_data() -> None:
    pieces = CheckpointPieces()
    pieces.add("prequential", PrequentialScores(10, 0, 1), "data")
    assert pieces.names("data") == ["prequential"]


def test_windows_cut_the_stream_by_event_time_with_intervals() -> None:
    assert (window_seconds(6 * 3600), window_seconds(50 * 60), window_seconds(7 * 86400)) == (1800, 300, 86400)
    rng = np.random.default_rng(1)
    n = 6000
    ev = np.sort(rng.integers(0, 6 * 3600, n)) * 1_000_000 + 1_764_806_400_000_000
    y = (rng.random(n) < 0.3).astype(np.float32)
    cols = {"label": y, "model": (y * 0.3 + rng.random(n)).astype(np.float32), "baseline": rng.random(n).astype(np.float32),
            "batch_only": rng.random(n).astype(np.float32), "popularity": np.full(n, np.nan, np.float32),
            "best": np.full(n, np.nan, np.float32), "user": rng.integers(0, 300, n), "event_us": ev}
    ws = windows(cols)
    assert 6 <= len(ws) <= 12 and sum(w.scores.rows for w in ws) == n
    assert all(w.scores.model is not None and w.scores.model.lo is not None for w in ws)
    assert all(w.scores.popularity is None for w in ws)  # NaN scores: not scored, never a made-up AUC


def test_dense_statistics_never_see_the_validation_days_or_the_hold_out(tmp_path: Path) -> None:
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=2, impressions_per_day=3000, seed=5)
    table = pa.concat_tables(list(reference_samples(cfg).values()))
    path = tmp_path / "part.parquet"
    pq.write_table(table, path)
    layout = RowLayout.from_spec(DEFAULT_SPEC)
    units = [WorkUnit(str(path), g, pq.ParquetFile(path).metadata.row_group(g).num_rows)
             for g in range(pq.ParquetFile(path).num_row_groups)]
    end = int(cfg.t_handoff.timestamp() * 1_000_000) - 86_400_000_000  # the last day validates
    mean, _ = window_dense_stats(units, lambda p: open(p, "rb"), layout, end_us=end)
    us = table.column("event_time").cast(pa.int64()).to_numpy()
    train = (us < end) & ~is_holdout(table.column("sample_id"))
    col = layout.dense[0]
    expected = table.column(col).to_numpy()[train].astype(np.float64).mean()
    assert mean[0] == pytest.approx(expected, rel=1e-9)
    assert mean[0] != pytest.approx(table.column(col).to_numpy().astype(np.float64).mean(), rel=1e-9)


def test_the_progress_curve_follows_the_steps_whatever_the_event_times() -> None:
    """Rows scored by a model that improves with every step, their event times shuffled (a replay's
    buffer): per window of event time the AUC is flat, per block of steps it rises."""
    rng = np.random.default_rng(3)
    p = PrequentialScores(100_000, 0, 1)
    for step in range(40):
        y = (rng.random(100) < 0.3).astype(np.float32)
        skill = step / 40  # the model's signal grows as it trains
        p.add(y, rng.integers(0, 500, 100), rng.integers(0, 6 * 3600, 100) * 1_000_000, step,
              model=skill * y + rng.random(100), baseline=rng.random(100))
    cols = p.columns()
    blocks = progress(cols)
    aucs = [b.scores.model.auc for b in blocks if b.scores.model is not None]
    assert len(blocks) == 10 and sum(b.scores.rows for b in blocks) == 4000
    assert blocks[0].first_step == 0 and blocks[-1].last_step == 39 and aucs[-1] > aucs[0] + 0.2
    flat = [w.scores.model.auc for w in windows(cols) if w.scores.model is not None]
    assert max(flat) - min(flat) < 0.15  # every window mixes all training stages


def test_without_a_user_feature_every_row_is_its_own_group_across_steps() -> None:
    """A spec that names no user (criteo): the bootstrap resamples rows, and rows scored in
    different steps (or on different ranks) never share a group."""
    import dataclasses

    from slipstream.samples.spec import load_spec
    from trainers.data.rows import Rows
    from trainers.eval.scoring import user_groups

    spec = load_spec("criteo")
    assert spec.with_role("user") is None
    empty = Rows.empty(RowLayout.from_spec(spec))
    steps = [dataclasses.replace(empty, sample_id=pa.array([f"s-{i}" for i in range(s, s + 100)])) for s in (0, 100, 200)]
    groups = np.concatenate([user_groups(rows, spec) for rows in steps])
    assert len(np.unique(groups)) == 300
