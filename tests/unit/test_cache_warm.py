"""Warmup and cached reads against a warehouse on the local disk (no servers): window planning
at a snapshot, atomic placement, incremental re-runs, eviction, locking, hit/miss accounting."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from slipstream.cache.index import CacheIndex, CacheLayout, cache_lock
from slipstream.cache.reader import CacheReader
from slipstream.cache.warm import warm_window
from slipstream.errors import CacheBusy
from slipstream.settings import Settings
from tests.cache_fixtures import append_days, day_tables, window_end  # noqa: F401 - fixture


def _data_files(cache_dir: str) -> set[str]:
    return {p.name for p in (Path(cache_dir) / "files").rglob("*.parquet")}


def _table_data_files(settings: Settings, snapshot: int) -> dict[str, str]:
    """{day partition value: data file name} at a snapshot."""
    from slipstream.lake.iceberg import get_catalog

    tbl = get_catalog(settings).load_table(settings.table)
    return {Path(t.file.file_path).parent.name: Path(t.file.file_path).name
            for t in tbl.scan(snapshot_id=snapshot).plan_files()}


def test_window_at_snapshot_and_incremental(settings: Settings, day_tables) -> None:  # noqa: F811
    snap3 = append_days(settings, day_tables, range(3))
    snap4 = append_days(settings, day_tables, range(3, 4))  # lands after the pinned snapshot
    files = _table_data_files(settings, snap4)
    # window = days 1..2 at snap3: day 0 is outside the window, day 3 was added after the snapshot
    r = warm_window(settings, "samples", 2, window_end(3), snap3, None, None)
    cached = _data_files(settings.cache_dir)
    assert cached == {files["event_time_day=2026-03-02"], files["event_time_day=2026-03-03"]}
    assert r.copied == r.planned_files and r.already_cached == 0 and r.expected_hit_ratio == 1.0
    assert not list((Path(settings.cache_dir) / "tmp").iterdir()), "no temporary file left behind"
    # every cached file is a byte-identical, readable copy
    for p in (Path(settings.cache_dir) / "files").rglob("*.parquet"):
        remote = next(Path(settings.warehouse.removeprefix("file://")).rglob(p.name))
        assert p.read_bytes() == remote.read_bytes()
        assert pq.read_metadata(p).num_rows > 0

    # the next day lands: the re-run copies only the new day's files and drops the day that left
    r2 = warm_window(settings, "samples", 2, window_end(4), snap4, None, None)
    assert _data_files(settings.cache_dir) == {files["event_time_day=2026-03-03"], files["event_time_day=2026-03-04"]}
    new_data = [p for p in r2.copied_paths if p.endswith(".parquet")]
    assert [Path(p).name for p in new_data] == [files["event_time_day=2026-03-04"]]
    assert r2.evicted_out_of_window >= 1 and r2.already_cached >= 1
    # a third run with nothing new copies nothing
    r3 = warm_window(settings, "samples", 2, window_end(4), snap4, None, None)
    assert r3.copied == 0 and r3.bytes == 0 and r3.already_cached == r3.planned_files


def test_budget_evicts_least_recently_used_first(settings: Settings, day_tables, tmp_path: Path) -> None:  # noqa: F811
    snap_a = append_days(settings, day_tables, range(2), table="a")
    snap_b = append_days(settings, day_tables, range(2, 3), table="b")
    warm_window(settings, "a", 2, window_end(2), snap_a, None, None)
    layout = CacheLayout(settings.cache_dir)
    with CacheIndex(layout) as index:
        a_entries = index.entries()
    a_data = sorted((e for e in a_entries if e.key.endswith(".parquet")), key=lambda e: e.key)
    assert len(a_data) == 2
    # read one of table a's files: it becomes the most recently used entry of the cache
    with CacheReader(settings.cache_dir, {}) as reader:
        reader.read_file(a_data[1].remote)
    # how much table b's window needs (warmed into a scratch cache)
    need_b = warm_window(settings, "b", 1, window_end(3), snap_b, str(tmp_path / "scratch"), None).cache_bytes
    # room for b plus exactly the file just read: everything else of table a must go, LRU first
    budget = need_b + a_data[1].size
    rb = warm_window(settings, "b", 1, window_end(3), snap_b, None, budget)
    assert rb.expected_hit_ratio == 1.0 and rb.cache_bytes <= budget
    assert rb.evicted_lru == len(a_entries) - 1 and rb.evicted_out_of_window == 0
    with CacheIndex(layout) as index:
        entries = index.entries()
    assert [e.key for e in entries if e.table_name == f"{settings.namespace}.a"] == [a_data[1].key]
    assert sum(e.size for e in entries) == rb.cache_bytes
    on_disk = {str(p.relative_to(layout.files)): p.stat().st_size for p in layout.files.rglob("*") if p.is_file()}
    assert on_disk == {e.key: e.size for e in entries}


def test_window_larger_than_budget_copies_what_fits(settings: Settings, day_tables, tmp_path: Path) -> None:  # noqa: F811
    snap = append_days(settings, day_tables, range(3))
    full = warm_window(settings, "samples", 3, window_end(3), snap, str(tmp_path / "scratch"), None).cache_bytes
    r = warm_window(settings, "samples", 3, window_end(3), snap, None, int(full * 0.8))
    assert r.skipped_over_budget == 1 and 0.5 < r.expected_hit_ratio < 1.0
    assert r.cache_bytes <= int(full * 0.8)


def test_lock_contention_and_concurrent_warmups(settings: Settings, day_tables, monkeypatch) -> None:  # noqa: F811
    snap = append_days(settings, day_tables, range(3))
    layout = CacheLayout(settings.cache_dir)
    monkeypatch.setenv("SLIPSTREAM_CACHE_LOCK_TIMEOUT_S", "0.3")
    with cache_lock(layout, 1.0):
        with pytest.raises(CacheBusy, match=r"pid \d+"):
            warm_window(settings, "samples", 3, window_end(3), snap, None, None)
    monkeypatch.setenv("SLIPSTREAM_CACHE_LOCK_TIMEOUT_S", "60")
    reports, errors = [], []

    def run() -> None:
        try:
            reports.append(warm_window(settings, "samples", 3, window_end(3), snap, None, None))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # one warmup copied everything, the others found it cached: nothing copied twice
    assert sorted(r.copied for r in reports) == [0, 0, reports[0].planned_files]
    with CacheIndex(layout) as index:
        entries = index.entries()
    assert len(entries) == reports[0].planned_files
    assert {e.key for e in entries} == {str(p.relative_to(layout.files)) for p in layout.files.rglob("*") if p.is_file()}


def test_reader_hits_misses_and_populate(settings: Settings, day_tables) -> None:  # noqa: F811
    snap = append_days(settings, day_tables, range(3))
    warm_window(settings, "samples", 1, window_end(3), snap, None, None)  # only the last day
    from slipstream.lake.iceberg import get_catalog

    tasks = list(get_catalog(settings).load_table(settings.table).scan(snapshot_id=snap).plan_files())
    paths = sorted(t.file.file_path for t in tasks)  # day 0, 1, 2: only day 2 is cached
    reader = CacheReader(settings.cache_dir, {})
    rows = [reader.read_row_group(p, 0, ["label", "sample_id"]).num_rows for p in paths]
    assert rows == [t.num_rows for t in day_tables.values()][:3]
    st = reader.stats()
    assert (st["hits"], st["misses"]) == (1, 2)
    assert st["bytes_local"] > 0 and st["bytes_remote"] > 0
    with reader.open_input_file(paths[2]) as f:
        assert f.size() == Path(paths[2].removeprefix("file://")).stat().st_size
    assert reader.stats()["hits"] == 2

    populating = CacheReader(settings.cache_dir, {}, populate=True)
    populating.read_file(paths[0])  # a miss that copies the file in
    populating.read_file(paths[0])  # now a hit
    st = populating.stats()
    assert (st["misses"], st["populated"], st["hits"]) == (1, 1, 1)  # the populating read is a miss
    populating.close()
    with CacheIndex(CacheLayout(settings.cache_dir)) as index:
        assert any(e.remote == paths[0] for e in index.entries())


def test_reader_during_eviction_keeps_reading(settings: Settings, day_tables) -> None:  # noqa: F811
    from slipstream.cache.evict import evict_cache

    snap = append_days(settings, day_tables, range(1))
    r = warm_window(settings, "samples", 1, window_end(1), snap, None, None)
    path = next(p for p in r.copied_paths if p.endswith(".parquet"))
    reader = CacheReader(settings.cache_dir, {})
    f = reader.open_input_file(path)  # a hit, held open
    gone = evict_cache(settings.cache_dir)
    assert gone.files == r.copied and not (Path(settings.cache_dir) / "files").joinpath("file").exists()
    assert pq.ParquetFile(f).read().num_rows == day_tables["2026-03-01"].num_rows  # the open copy stays readable
    assert reader.read_row_group(path, 0, ["label"]).num_rows == day_tables["2026-03-01"].num_rows
    assert (reader.stats()["hits"], reader.stats()["misses"]) == (1, 1)  # after the eviction: a miss, read remote


def test_cli_warm_status_evict(settings: Settings, day_tables, capsys) -> None:  # noqa: F811
    import json

    from slipstream.cli import main

    snap = append_days(settings, day_tables, range(2))
    assert main(["cache", "warm", "--window-days", "2", "--end", window_end(2).isoformat(),
                 "--snapshot", str(snap), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["snapshot_id"] == snap and report["copied"] == report["planned_files"] > 2
    assert main(["cache", "status"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["files"] == report["copied"] and status["bytes"] == report["cache_bytes"]
    assert main(["cache", "evict", "--keep", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["evicted"] == report["copied"]
    assert main(["cache", "warm", "--window-days", "0"]) == 2  # a clear error, not a traceback
    assert "window_days must be >= 1" in capsys.readouterr().err
