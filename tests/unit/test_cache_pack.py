"""Small files packed into cache blocks, against a warehouse on the local disk (no servers): a
packed window reads back byte-identical through the reader with the right hit/miss counts, blocks
leave with their window and as whole LRU units, a crash between a block's rename and its index
commit leaves nothing visible, and a file that contradicts its metadata is named and left out."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slipstream.cache.evict import evict_cache
from slipstream.cache.index import CacheIndex, CacheLayout
from slipstream.cache.pack import PACK_MIN_FILES
from slipstream.cache.reader import CacheReader
from slipstream.cache.settings import WarmKnobs
from slipstream.cache.warm import CacheItem, warm_files
from slipstream.errors import CacheWarmError


def _small_files(root: Path, days: int, per_day: int) -> dict[str, bytes]:
    """{path: content} of `per_day` distinct small files in one folder per day."""
    out = {}
    for d in range(days):
        folder = root / f"day={d}"
        folder.mkdir(parents=True)
        for i in range(per_day):
            body = os.urandom(1000 + 37 * i)
            (folder / f"part-{i:04d}.bin").write_bytes(body)
            out[str(folder / f"part-{i:04d}.bin")] = body
    return out


def _items(files: dict[str, bytes]) -> list[CacheItem]:
    return [CacheItem(p, len(b)) for p, b in files.items()]


def _disk_bytes(layout: CacheLayout) -> int:
    return sum(p.stat().st_size for d in (layout.files, layout.blocks) for p in d.rglob("*") if p.is_file())


def test_packed_window_reads_back_byte_identical(tmp_path: Path, settings: object, capsys: pytest.CaptureFixture[str]) -> None:
    files = _small_files(tmp_path / "wh", days=2, per_day=PACK_MIN_FILES)
    layout = CacheLayout(tmp_path / "cache")
    r = warm_files(layout.root, _items(files), {}, table_name="t", knobs=WarmKnobs(concurrency=3))
    assert r.copied == r.packed == len(files) and r.bytes == sum(map(len, files.values()))
    assert r.blocks >= 2, "each day's folder packs into blocks of its own"
    assert not [p for p in layout.files.rglob("*") if p.is_file()], "no file of its own was created"
    assert not list(layout.tmp.iterdir())
    with CacheIndex(layout) as index:
        assert index.total_bytes() == _disk_bytes(layout) == r.cache_bytes == r.bytes

    outside = _small_files(tmp_path / "other", days=1, per_day=1)  # never warmed
    with CacheReader(str(layout.root), {}) as reader:
        for path, body in files.items():
            with reader.open_input_file(path) as f:  # what the trainer's loader calls
                assert f.size() == len(body) and f.read() == body
            assert reader.read_file(path) == body
        [(miss, body)] = outside.items()
        assert reader.read_file(miss) == body
        st = reader.stats()
    assert (st["hits"], st["misses"]) == (2 * len(files), 1)
    assert st["bytes_local"] == 2 * r.bytes and st["bytes_remote"] == len(body)

    again = warm_files(layout.root, _items(files), {}, table_name="t")  # incremental: nothing new
    assert again.copied == 0 and again.already_cached == len(files)

    import json

    from slipstream.cli import main

    assert main(["cache", "status", "--cache-dir", str(layout.root)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["files"], status["packed_files"], status["blocks"], status["bytes"]) == (
        len(files), len(files), r.blocks, r.bytes)


def test_packed_parquet_reads_through_the_reader(tmp_path: Path) -> None:
    """A hit is a slice of a block that pyarrow reads as a Parquet file (footer, row groups)."""
    folder = tmp_path / "wh" / "day=0"
    folder.mkdir(parents=True)
    paths = []
    for i in range(PACK_MIN_FILES):
        paths.append(str(folder / f"{i:03d}.parquet"))
        pq.write_table(pa.table({"id": list(range(i, i + 50)), "label": [i % 2] * 50}), paths[-1], row_group_size=25)
    items = [CacheItem(p, os.path.getsize(p)) for p in paths]
    assert warm_files(tmp_path / "cache", items, {}, table_name="t").packed == len(paths)
    with CacheReader(str(tmp_path / "cache"), {}) as reader:
        for i, p in enumerate(paths):
            assert reader.read_row_group(p, 1, ["id"]).column("id").to_pylist() == list(range(i + 25, i + 50))
        assert (reader.stats()["hits"], reader.stats()["misses"]) == (len(paths), 0)


def test_blocks_leave_with_their_window_and_as_lru_units(tmp_path: Path) -> None:
    files = _small_files(tmp_path / "wh", days=3, per_day=PACK_MIN_FILES)
    layout = CacheLayout(tmp_path / "cache")
    warm_files(layout.root, _items(files), {}, table_name="t")
    day = {d: {p: b for p, b in files.items() if f"/day={d}/" in p} for d in range(3)}
    reader = CacheReader(str(layout.root), {})
    assert reader.read_file(next(iter(day[0]))) == next(iter(day[0].values()))  # a hit before

    # the window moves on: day 0 leaves, its blocks go; the reader now misses it (reads remote)
    r = warm_files(layout.root, _items({**day[1], **day[2]}), {}, table_name="t")
    assert r.evicted_out_of_window == len(day[0]) and r.copied == 0
    with CacheIndex(layout) as index:
        assert {e.remote for e in index.entries()} == set(day[1]) | set(day[2])
        assert index.total_bytes() == _disk_bytes(layout) == r.cache_bytes
    path0, body0 = next(iter(day[0].items()))
    assert reader.read_file(path0) == body0
    assert (reader.stats()["hits"], reader.stats()["misses"]) == (1, 1)

    # least recently used: read day 2, then keep only about one day: day 1's blocks go, whole
    for p in day[2]:
        reader.read_file(p)
    reader.flush()
    gone = evict_cache(layout.root, keep_bytes=sum(map(len, day[2].values())))
    with CacheIndex(layout) as index:
        left = {e.remote for e in index.entries()}
        assert left == set(day[2]) and index.total_bytes() == _disk_bytes(layout)
    assert gone.files == len(day[1])
    assert all(reader.read_file(p) == b for p, b in day[2].items())
    reader.close()


def test_crash_between_block_rename_and_index_commit_leaves_nothing_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    files = _small_files(tmp_path / "wh", days=1, per_day=2 * PACK_MIN_FILES)
    layout = CacheLayout(tmp_path / "cache")

    put_rows = CacheIndex.put_rows

    def crash(self: CacheIndex, *args: object, **kwargs: object) -> None:
        if kwargs.get("blocks"):  # the commit of blocks that were renamed into place
            raise KeyboardInterrupt("killed before the index commit")
        put_rows(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CacheIndex, "put_rows", crash)
    with pytest.raises(KeyboardInterrupt):
        warm_files(layout.root, _items(files), {}, table_name="t", knobs=WarmKnobs(concurrency=2))
    monkeypatch.undo()
    assert list(layout.blocks.iterdir()), "blocks were renamed into place"
    with CacheReader(str(layout.root), {}) as reader:  # ... but no reader can see them
        assert all(reader.read_file(p) == b for p, b in files.items())
        assert reader.stats()["hits"] == 0
    r = warm_files(layout.root, _items(files), {}, table_name="t")  # orphans deleted, all copied again
    assert r.copied == len(files) and r.already_cached == 0
    with CacheIndex(layout) as index:
        assert {b.name for b in index.blocks()} == {p.name for p in layout.blocks.iterdir()}
        assert index.total_bytes() == _disk_bytes(layout)


def test_a_file_that_contradicts_its_metadata_is_named_and_left_out(tmp_path: Path) -> None:
    files = _small_files(tmp_path / "wh", days=1, per_day=PACK_MIN_FILES)
    bad = sorted(files)[5]
    items = [CacheItem(p, len(b) + (1 if p == bad else 0)) for p, b in files.items()]
    layout = CacheLayout(tmp_path / "cache")
    with pytest.raises(CacheWarmError, match=f"1 of {len(files)} files.*{bad}.*table metadata says"):
        warm_files(layout.root, items, {}, table_name="t")
    with CacheReader(str(layout.root), {}) as reader:  # the others were packed and read back whole
        assert all(reader.read_file(p) == b for p, b in files.items())
        assert (reader.stats()["hits"], reader.stats()["misses"]) == (len(files) - 1, 1)


def test_an_index_from_before_packing_is_upgraded_in_place(tmp_path: Path) -> None:
    import sqlite3

    layout = CacheLayout(tmp_path / "cache")
    layout.ensure()
    old = sqlite3.connect(layout.index_path)
    old.execute("CREATE TABLE entries (key TEXT PRIMARY KEY, remote TEXT NOT NULL, size INTEGER NOT NULL, etag TEXT,"
                " table_name TEXT, snapshot INTEGER, added REAL NOT NULL, last_access REAL NOT NULL)")
    old.execute("INSERT INTO entries VALUES ('file/a/b.bin', '/a/b.bin', 10, NULL, 't', 1, 0, 0)")
    old.commit()
    old.close()
    with CacheIndex(layout) as index:
        [entry] = index.entries()
        assert (entry.key, entry.size, entry.block) == ("file/a/b.bin", 10, None)
        assert index.total_bytes() == 10 and index.packed() == {}


def test_a_second_warmup_reuses_the_block_buffers_and_reads_back_what_it_wrote(tmp_path: Path) -> None:
    """The block buffers go back to the process's pool and the next warmup takes them (no new
    mapping); what was left in a reused buffer never leaks into the next block's bytes."""
    from slipstream.cache.pack import BUFFERS

    first = _small_files(tmp_path / "wh1", days=1, per_day=PACK_MIN_FILES)
    second = _small_files(tmp_path / "wh2", days=1, per_day=PACK_MIN_FILES)
    layout = CacheLayout(tmp_path / "cache")
    warm_files(layout.root, _items(first), {}, table_name="a", knobs=WarmKnobs(concurrency=3))
    kept = BUFFERS.kept_bytes()
    assert kept > 0, "the threads gave their buffers back"
    warm_files(layout.root, _items(second), {}, table_name="b", knobs=WarmKnobs(concurrency=3))
    assert BUFFERS.kept_bytes() == kept, "the second warmup took the same buffers and gave them back"
    with CacheReader(str(layout.root), {}) as reader:
        for path, body in {**first, **second}.items():
            assert reader.read_file(path) == body


def test_the_buffer_pool_keeps_at_most_its_bytes() -> None:
    from slipstream.cache.pack import BufferPool

    pool = BufferPool(keep_bytes=3 << 20)
    bufs = [pool.take(1 << 20) for _ in range(4)]
    for b in bufs:
        pool.give(b)
    assert pool.kept_bytes() == 3 << 20
    assert pool.take(1 << 20) is bufs[0] and pool.take(2 << 20) is not None


def test_block_and_temporary_names_differ_across_threads_and_forks() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from slipstream.cache.pack import unique_name

    with ThreadPoolExecutor(8) as pool:
        names = list(pool.map(lambda _: unique_name(), range(2000)))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child names its own files: never one its parent took or will take
        os.write(write, unique_name().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    names += [child, unique_name()]
    assert len(set(names)) == len(names)
