"""The batch-phase reader: global shuffle, window and holdout filtering, exact resume."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pytest

from slipstream.samples import native
from slipstream.errors import ResumeError
from slipstream.lake.planning import plan_window_files
from slipstream.samples.ragged import take_lists, take_ranges
from slipstream.samples.schema import CATEGORICAL_COLUMNS, DENSE_COLUMNS, is_holdout
from tests.trainer_fixtures import SamplesFixture, make_samples
from trainers.data import holdout
from trainers.data.holdout import holdout_mask
from trainers.data import iceberg_source
from trainers.data.iceberg_source import IcebergSource, read_units
from trainers.data.units import epoch_spans, file_opener, plan_units
from trainers.data.rows import Rows


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> SamplesFixture:
    return make_samples(tmp_path_factory.mktemp("ice"), days=2, per_day=3000, row_group_rows=700)


def _source(fx: SamplesFixture, rank: int = 0, world: int = 1, seed: int = 3, window_days: int = 2,
            shuffle_rows: int = 1500, batch_size: int = 256, **kw: int) -> IcebergSource:
    t = fx.t_handoff
    start = t.replace(day=t.day - window_days)
    plan = plan_window_files(fx.table, fx.snapshot_id, start, t)
    open_file, _ = file_opener(fx.table.io, None)
    units = plan_units(plan, open_file)
    us = (int(start.timestamp() * 1e6), int(t.timestamp() * 1e6))
    return IcebergSource(units, open_file, rank=rank, world=world, seed=seed, batch_size=batch_size,
                         shuffle_rows=shuffle_rows, window_us=us, **kw)


def _epoch_ids(src: IcebergSource, epoch: int) -> list[str]:
    src.start_epoch(epoch)
    ids: list[str] = []
    while (b := src.next_batch()) is not None:
        ids.extend(b.sample_id.to_pylist())
    src.close()
    return ids


def _expected_training_ids(fx: SamplesFixture) -> set[str]:
    ids = fx.all_samples().column("sample_id")
    return set(pa.array(ids).filter(pa.array(~is_holdout(ids))).to_pylist())


def test_an_epoch_is_a_permutation_of_the_window_without_holdout(samples: SamplesFixture) -> None:
    src = _source(samples)
    ids = _epoch_ids(src, 0)
    assert len(ids) == len(set(ids))
    assert set(ids) == _expected_training_ids(samples)
    assert src.stats.rows_holdout > 0


def test_the_shuffle_differs_by_epoch_and_repeats_with_the_seed(samples: SamplesFixture) -> None:
    e0 = _epoch_ids(_source(samples), 0)
    e1 = _epoch_ids(_source(samples), 1)
    again = _epoch_ids(_source(samples), 0)
    assert e0 == again
    assert set(e0) == set(e1) and e0 != e1
    # the rows are mixed inside chunks too, not only the units: neighbours change
    assert sum(a == b for a, b in zip(e0, e1)) < len(e0) // 20


@pytest.mark.parametrize("kw", [{"read_threads": 1}, {"prefetch_chunks": 1}, {"prefetch_chunks": 4, "read_threads": 3}])
def test_parallel_reading_keeps_the_order(samples: SamplesFixture, kw: dict[str, int]) -> None:
    default = _source(samples)
    other = _source(samples, **kw)
    assert _epoch_ids(other, 1) == _epoch_ids(default, 1)
    assert other.stats == default.stats


@pytest.mark.parametrize("prefetch", [1, 2])
def test_read_ahead_holds_at_most_prefetch_plus_one_chunks(samples: SamplesFixture, prefetch: int) -> None:
    src = _source(samples, shuffle_rows=700, batch_size=350, prefetch_chunks=prefetch)
    n_chunks = src.epoch_plan(0).n_chunks
    assert n_chunks > prefetch + 3
    started: list[int] = []
    read_chunk = src.read_chunk

    def counted(*a: Any, **kw: Any) -> Any:
        started.append(a[2])
        return read_chunk(*a, **kw)

    src.read_chunk = counted  # type: ignore[method-assign]
    src.start_epoch(0)
    time.sleep(0.5)  # nothing taken yet: the reader fills its slots and stops there
    assert len(started) == prefetch + 1
    taken = 0
    while (b := src.next_batch()) is not None:
        taken = src._chunk + 1  # chunks the consumer has taken so far
        assert len(started) <= taken + prefetch + 1
        assert len(b)
    src.close()
    assert sorted(started) == list(range(n_chunks))


def test_row_groups_read_side_by_side_give_the_same_table(samples: SamplesFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _source(samples)
    picked = [src.units[i] for i in (0, 1, 2, len(src.units) - 2, len(src.units) - 1)]  # two files at least
    assert len({u.path for u in picked}) >= 2
    opened: list[Any] = []

    def opener(path: str) -> Any:
        opened.append(src.open_file(path))
        return opened[-1]

    with ThreadPoolExecutor(3) as pool:
        assert read_units(picked, opener, pool).equals(read_units(picked, src.open_file))
        assert len(opened) == len({u.path for u in picked})  # each file opened once
        # a failed row group read surfaces, after the others finished and with every file closed
        opened.clear()
        real = iceberg_source._read_group

        def flaky(fh: Any, metadata: Any, group: int, columns: list[str]) -> Any:
            if group == picked[1].row_group:
                raise OSError("bad block")
            return real(fh, metadata, group, columns)

        monkeypatch.setattr(iceberg_source, "_read_group", flaky)
        with pytest.raises(OSError, match="bad block"):
            read_units(picked, opener, pool)
        assert opened and all(f.closed for f in opened)


@pytest.mark.parametrize("where", [0, -1])
def test_a_read_error_surfaces_in_the_training_thread(samples: SamplesFixture, where: int) -> None:
    src = _source(samples)
    good = src.open_file
    bad = src.units[int(src.epoch_plan(0).order[where])].path  # read in the first or the last chunk

    def opener(path: str):  # type: ignore[no-untyped-def]
        if path == bad:
            raise OSError(f"cannot read {path}")
        return good(path)

    src.open_file = opener
    src.start_epoch(0)
    with pytest.raises(OSError, match="cannot read"):
        while src.next_batch() is not None:
            pass
    src.close()
    assert src._thread is None


@pytest.mark.parametrize("world", [3, 4, 7])
def test_ranks_split_the_window_disjointly_and_evenly(samples: SamplesFixture, world: int) -> None:
    # 10 row groups of at most 700 rows: dealt whole, 4 ranks would read 3, 3, 2, 2 of them
    sources = [_source(samples, rank=r, world=world) for r in range(world)]
    assert len(sources[0].units) % world
    ids = [_epoch_ids(s, 0) for s in sources]
    flat = [i for part in ids for i in part]
    assert len(flat) == len(set(flat))
    assert set(flat) == _expected_training_ids(samples)
    read = [s.stats.rows_read for s in sources]
    assert sum(read) == sum(u.rows for u in sources[0].units) and max(read) - min(read) <= 1
    assert max(map(len, ids)) - min(map(len, ids)) < 0.2 * min(map(len, ids))  # held-out and outside rows vary


def test_window_excludes_rows_before_start(samples: SamplesFixture) -> None:
    ids = _epoch_ids(_source(samples, window_days=1), 0)
    last_day = samples.days["2026-11-02"].column("sample_id")
    expected = set(pa.array(last_day).filter(pa.array(~is_holdout(last_day))).to_pylist())
    assert set(ids) == expected


@pytest.mark.parametrize("stop_after", [1, 5, 9])
def test_resume_from_state_reproduces_the_order(samples: SamplesFixture, stop_after: int) -> None:
    full = _epoch_ids(_source(samples), 0)
    src = _source(samples)
    src.start_epoch(0)
    head: list[str] = []
    for _ in range(stop_after):
        b = src.next_batch()
        assert b is not None
        head.extend(b.sample_id.to_pylist())
    state = src.state_dict()
    src.close()
    resumed = _source(samples)
    resumed.check_resumable(state)
    resumed.start_epoch(state["epoch"], state["chunk"], state["offset"])
    tail: list[str] = []
    while (b := resumed.next_batch()) is not None:
        tail.extend(b.sample_id.to_pylist())
    assert head + tail == full


def test_resume_on_another_world_size_is_refused(samples: SamplesFixture) -> None:
    state = _source(samples, rank=0, world=2).state_dict()
    with pytest.raises(ResumeError, match="same --nproc-per-node"):
        _source(samples, rank=0, world=1).check_resumable(state)


def _take(src: IcebergSource, batches: int) -> list[str]:
    ids: list[str] = []
    for _ in range(batches):
        if (b := src.next_batch()) is None:
            break
        ids.extend(b.sample_id.to_pylist())
    return ids


def _stop_mid_epoch(sources: list[IcebergSource], epoch: int, batches: list[int]) -> tuple[list[str], list[dict[str, Any]]]:
    """Each source trains its first `batches[r]` batches of `epoch`; returns the ids and the states."""
    ids: list[str] = []
    for src, n in zip(sources, batches):
        src.start_epoch(epoch)
        ids += _take(src, n)
        src.close()
    return ids, [s.state_dict() for s in sources]


@pytest.mark.parametrize("new_world", [1, 3])
def test_mid_epoch_resume_on_another_world_size_trains_the_rest_once(samples: SamplesFixture, new_world: int) -> None:
    expected = _expected_training_ids(samples)
    kw = {"shuffle_rows": 900, "batch_size": 128}
    done, states = _stop_mid_epoch([_source(samples, rank=r, world=2, **kw) for r in range(2)], 1, [5, 3])
    assert 0 < len(done) < len(expected)
    resumed = [_source(samples, rank=r, world=new_world, **kw) for r in range(new_world)]
    for src in resumed:
        src.load_state_dict({"redeal": states})
    # a second kill inside the re-dealt epoch, resumed on the same world, then on 2 ranks again
    more, states2 = _stop_mid_epoch(resumed, 1, [2] * new_world)
    same = [_source(samples, rank=r, world=new_world, **kw) for r in range(new_world)]
    for src, st in zip(same, states2):
        src.load_state_dict(st)
    more2, states3 = _stop_mid_epoch(same, 1, [1] * new_world)
    last = [_source(samples, rank=r, world=2, **kw) for r in range(2)]
    for src in last:
        src.load_state_dict({"redeal": states3})
    rest = [i for src in last for i in _epoch_ids(src, 1)]
    trained = done + more + more2 + rest
    assert len(trained) == len(set(trained)), "a sample was trained twice in the epoch"
    assert set(trained) == expected
    # the epoch after runs on the new world's own plan
    nxt = [i for src in last for i in _epoch_ids(src, 2)]
    assert sorted(nxt) == sorted(expected) and last[0].state_dict().get("pieces") is None


def test_re_deal_refuses_a_checkpoint_of_other_data(samples: SamplesFixture) -> None:
    _, states = _stop_mid_epoch([_source(samples, rank=r, world=2) for r in range(2)], 0, [2, 2])
    with pytest.raises(ResumeError, match="seed"):
        _source(samples, rank=0, world=3, seed=4).load_state_dict({"redeal": states})


@pytest.mark.parametrize("world", [1, 2, 3, 8, 40])
def test_epoch_spans_cover_every_row_once_in_equal_runs(world: int) -> None:
    sizes = np.random.default_rng(5).integers(1, 50, 17)
    covered = np.zeros(int(sizes.sum()), dtype=int)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    runs = []
    for r in range(world):
        order, spans = epoch_spans(sizes, 4, seed=9, rank=r, world=world)
        for u, (a, b) in zip(order.tolist(), spans.tolist()):
            assert 0 <= a < b <= sizes[u]
            covered[starts[u] + a : starts[u] + b] += 1
        runs.append(int((spans[:, 1] - spans[:, 0]).sum()))
    assert (covered == 1).all()
    assert max(runs) - min(runs) <= 1
    whole, _ = epoch_spans(sizes, 4, 9, 0, 1)
    assert sorted(whole.tolist()) == list(range(17)) and not np.array_equal(whole, epoch_spans(sizes, 5, 9, 0, 1)[0])


@pytest.fixture(params=[False, True], ids=["numpy", "native"])
def hasher(request: pytest.FixtureRequest) -> Iterator[None]:
    """holdout_mask's numpy path, then its native kernel."""
    if request.param and native.kernels() is None:
        pytest.skip("the native kernels are not built here (no C compiler)")
    with native.enabled(request.param):
        yield


@pytest.mark.usefixtures("hasher")
def test_holdout_mask_matches_schema_rule() -> None:
    ids = pa.array([f"imp-{i % 13:04d}-{i}" for i in range(5000)] + ["", "x" * 40])
    assert np.array_equal(holdout_mask(ids), is_holdout(ids))
    assert np.array_equal(holdout_mask(ids.slice(100, 300)), is_holdout(ids.slice(100, 300)))
    # varied lengths, embedded NUL bytes (skipped, like schema.id_hash), a chunked and sliced array
    odd = pa.array([f"s{i}" + "\0" * (i % 3) + "ab"[: i % 3] for i in range(3000)] + ["", "\0"])
    assert np.array_equal(holdout_mask(odd), is_holdout(odd))
    chunked = pa.chunked_array([odd.slice(5, 100), ids.slice(7, 900)])
    assert np.array_equal(holdout_mask(chunked), is_holdout(chunked.to_pylist()))


def _same(a: object, b: object) -> bool:
    """Equal Rows fields: Arrow arrays, numpy arrays of one dtype, or tuples of those (lists)."""
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, pa.Array):
        return a.equals(b)
    return np.array_equal(a, b) and a.dtype == b.dtype  # type: ignore[union-attr]


def test_rows_take_and_concat_keep_histories(samples: SamplesFixture) -> None:
    table = samples.days["2026-11-01"].slice(0, 500)
    rows = Rows.from_arrow(table, source=0)
    idx = np.array([5, 3, 499, 0, 3])
    taken = rows.take(idx)
    want = table.column("hist_items").take(pa.array(idx)).to_pylist()
    values, offsets = taken.list_values[0], taken.list_offsets[0]
    got = [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(idx))]
    assert got == want
    # gathering while converting is the same as converting then gathering (a null history included)
    hist = table.column("hist_items").combine_chunks()
    with_null = table.set_column(table.schema.get_field_index("hist_items"), "hist_items",
                                 pa.array([None] + hist.to_pylist()[1:], hist.type))
    direct = Rows.from_arrow(with_null, source=0, epoch=4, take=np.array([0, 5, 3, 499, 0]))
    later = Rows.from_arrow(with_null, source=0, epoch=4).take(np.array([0, 5, 3, 499, 0]))
    for f in fields(Rows):
        assert _same(getattr(direct, f.name), getattr(later, f.name)), f.name
    picked = table.take(pa.array([0, 5, 3, 499, 0]))
    for matrix, names in ((direct.sparse[:, 2:], CATEGORICAL_COLUMNS), (direct.dense, DENSE_COLUMNS)):
        assert matrix.shape == (5, len(names))
        for j, name in enumerate(names):  # column j of the matrix is feature j, row i is taken row i
            np.testing.assert_allclose(matrix[:, j], picked.column(name).to_numpy(), rtol=1e-6)
    for bad in ([0, -1], [500, 1]):  # a negative row would wrap around in numpy; one past the end
        with pytest.raises(IndexError, match=r"rows to take must be in \[0, 500\)"):
            Rows.from_arrow(table, source=0, take=np.array(bad))
    # a slice is the take of its range, field by field (per-row fields that differ from row to row)
    n = table.num_rows
    marked = Rows.from_arrow(table, source=1, epoch=2, partition=np.arange(n) % 7, offset=np.arange(n) + 100,
                             record_ms=np.arange(n) * 3, consumed_ms=np.arange(n) * 5)
    for a, b in ((0, 10), (17, 350), (499, 500)):
        part, want_part = marked.slice(a, b), marked.take(np.arange(a, b))
        for f in fields(Rows):
            assert _same(getattr(part, f.name), getattr(want_part, f.name)), (f.name, a, b)
    both = Rows.concat([rows.slice(0, 10), rows.slice(10, 500)])
    assert _same(both.list_values, rows.list_values) and _same(both.list_offsets, rows.list_offsets)
    assert both.sample_id.to_pylist() == table.column("sample_id").to_pylist()


def test_take_lists_and_ranges() -> None:
    rng = np.random.default_rng(0)
    hist = [list(range(i, i + int(k))) for i, k in enumerate(rng.integers(0, 5, 100))]
    hist[3] = hist[40] = []
    values = np.asarray([v for h in hist for v in h], dtype=np.int64)
    offsets = np.cumsum([0] + [len(h) for h in hist]).astype(np.int64)
    for idx in (rng.permutation(100), rng.integers(0, 100, 23), np.array([3, 40]), np.array([99, 98, 0]),
                np.array([], dtype=np.int64)):
        got_v, got_o = take_lists(values, offsets, idx)
        assert [got_v[got_o[i]:got_o[i + 1]].tolist() for i in range(len(idx))] == [hist[i] for i in idx]
        assert got_o[0] == 0 and got_o[-1] == len(got_v)
    # ranges in order with gaps between them (a field of each record of a joined buffer)
    starts = offsets[:-1] + np.minimum(1, np.diff(offsets))
    got_v, got_o = take_ranges(values, starts, offsets[1:])
    assert [got_v[got_o[i]:got_o[i + 1]].tolist() for i in range(100)] == [h[1:] for h in hist]



def test_later_epochs_reuse_each_units_training_rows(samples: SamplesFixture) -> None:
    # the second epoch of one source takes the kept per-unit masks; a fresh source computes them
    src = _source(samples)
    first, second = _epoch_ids(src, 0), _epoch_ids(src, 1)
    assert len(src._unit_rows) == len(src.units)
    fresh = _source(samples)
    assert second == _epoch_ids(fresh, 1) and set(first) == set(second)
    s, f = src.stats, fresh.stats
    assert (s.rows_read, s.rows_outside_window, s.rows_holdout) == (2 * f.rows_read, 2 * f.rows_outside_window, 2 * f.rows_holdout)


@pytest.mark.usefixtures("hasher")
def test_holdout_mask_over_runs_of_equal_length_ids() -> None:
    # counters (runs of one length sharing a prefix), fixed-length ids with no shared prefix, a
    # NUL inside a run, and the same ids hashed by both strategies (runs and longest first)
    rng = np.random.default_rng(1)
    arrays = [
        pa.array([f"imp-0003-{i}" for i in range(20_000)]).slice(55, 15_000),
        pa.array([f"{v:016x}" for v in rng.integers(0, 2**62, 3000)]),
        pa.array([f"a\0{i:04d}" for i in range(2000)] + [None, "z"]),
    ]
    for ids in arrays:
        want = is_holdout(pa.array(ids.to_pylist(), pa.string()).fill_null(""))
        assert np.array_equal(holdout_mask(ids), want)
        for max_runs, mean in ((0, 1 << 30), (1 << 30, 1)):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(holdout, "_MAX_RUNS", max_runs)
                mp.setattr(holdout, "_MIN_MEAN_RUN", mean)
                assert np.array_equal(holdout_mask(ids), want)


def test_a_mid_epoch_checkpoint_of_another_deal_is_refused(samples: SamplesFixture) -> None:
    src = _source(samples)
    src.start_epoch(0)
    _take(src, 2)
    old = {**src.state_dict(), "algorithm": "units:default_rng([seed,epoch]).permutation/round-robin"}
    src.close()
    with pytest.raises(ResumeError, match="Finish the epoch with the Slipstream that wrote"):
        _source(samples).load_state_dict(old)
    _source(samples).load_state_dict({**old, "chunk": 0, "offset": 0})  # at an epoch's start: nothing to lose
