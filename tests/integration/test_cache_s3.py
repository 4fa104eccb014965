"""The cache against a real SeaweedFS S3 server on 127.0.0.1: warmup of an Iceberg window stored
on S3, incremental re-runs, a server restart and a killed warmup mid-copy (nothing partial is
ever visible; the re-run resumes), and the stack starting the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slipstream.cache.index import CacheIndex, CacheLayout
from slipstream.cache.reader import CacheReader
from slipstream.cache.remote import filesystem_for
from slipstream.cache.settings import WarmKnobs
from slipstream.cache.warm import CacheItem, warm_files, warm_window
from slipstream.dev.s3server import S3Endpoint, S3Server
from slipstream.errors import CacheWarmError
from tests.cache_fixtures import (  # noqa: F401 - fixtures
    append_days,
    day_tables,
    s3_endpoint,
    s3_server,
    s3_settings,
    upload_files,
    window_end,
)

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _assert_consistent(layout: CacheLayout, expected: dict[str, int]) -> None:
    """Every visible cached file is whole (its remote size) and the index lists exactly them."""
    on_disk = {str(p.relative_to(layout.files)): p.stat().st_size for p in layout.files.rglob("*") if p.is_file()}
    for key, size in on_disk.items():
        assert size == expected[key], f"partial file visible: {key} has {size} of {expected[key]} bytes"
    with CacheIndex(layout) as index:
        assert {e.key: e.size for e in index.entries()} == on_disk


def test_warm_window_from_s3_incremental_and_read_through_cache(
    tmp_path: Path, s3_endpoint: S3Endpoint, day_tables, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    settings = s3_settings(tmp_path / "home", s3_endpoint, monkeypatch)
    assert settings.warehouse.startswith("s3://")
    snap3 = append_days(settings, day_tables, range(3))
    r = warm_window(settings, "samples", 2, window_end(3), snap3, None, None)
    assert r.copied == r.planned_files and r.expected_hit_ratio == 1.0
    data = [p for p in r.copied_paths if p.endswith(".parquet")]
    assert len(data) == 2 and all(p.startswith("s3://") for p in data)
    fs, _ = filesystem_for(data[0], s3_endpoint.io_properties())
    layout = CacheLayout(settings.cache_dir)
    for p in data:  # byte-identical copies
        with fs.open_input_stream(p.removeprefix("s3://")) as f:
            assert layout.local_path(p).read_bytes() == f.read()

    snap4 = append_days(settings, day_tables, range(3, 4))
    r2 = warm_window(settings, "samples", 2, window_end(4), snap4, None, None)
    new_data = [p for p in r2.copied_paths if p.endswith(".parquet")]
    assert len(new_data) == 1 and new_data[0] not in data  # only the new day's data file
    assert r2.evicted_out_of_window >= 1

    from slipstream.lake.iceberg import get_catalog

    tasks = list(get_catalog(settings).load_table(settings.table).scan(snapshot_id=snap4).plan_files())
    with CacheReader(settings.cache_dir, s3_endpoint.io_properties()) as reader:
        rows = sum(reader.read_row_group(t.file.file_path, 0, ["label"]).num_rows for t in tasks)
        st = reader.stats()
    assert rows == sum(t.num_rows for t in day_tables.values())
    assert (st["hits"], st["misses"]) == (2, 2)  # days 2..3 cached, days 0..1 read remote
    assert st["bytes_remote"] > 0 and st["bytes_local"] > 0


def test_s3_restart_mid_warmup_resumes_with_nothing_partial(
    tmp_path: Path, s3_server: S3Server, s3_endpoint: S3Endpoint,  # noqa: F811
) -> None:
    uris = upload_files(s3_endpoint, "restart", 160, 256 * 1024)
    items = [CacheItem(u, 256 * 1024) for u in uris]
    layout = CacheLayout(tmp_path / "cache")
    expected = {layout.local_path(u).relative_to(layout.files).as_posix(): 256 * 1024 for u in uris}
    outcome: dict[str, object] = {}
    seen_partial: list[str] = []
    stop = threading.Event()

    def warm() -> None:
        try:
            outcome["report"] = warm_files(layout.root, items, s3_endpoint.io_properties(), table_name="t",
                                           knobs=WarmKnobs(concurrency=4))
        except CacheWarmError as e:
            outcome["error"] = e
        finally:
            stop.set()

    def watch() -> None:  # a reader polling the cache during the copy and the restart
        while not stop.is_set():
            for p in list(layout.files.rglob("*.bin")) if layout.files.exists() else []:
                try:
                    if p.stat().st_size != 256 * 1024:
                        seen_partial.append(str(p))
                except FileNotFoundError:
                    pass
            time.sleep(0.01)

    threads = [threading.Thread(target=warm), threading.Thread(target=watch)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while not stop.is_set() and len(list(layout.files.rglob("*.bin"))) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not stop.is_set(), "the warmup finished before the restart: make the window larger"
    s3_server.stop()  # mid-copy
    time.sleep(0.5)
    s3_server.start()
    for t in threads:
        t.join(120)
    assert not seen_partial
    _assert_consistent(layout, expected)
    # the re-run copies exactly what is missing and leaves no temporary file
    before = len(list(layout.files.rglob("*.bin")))
    r = warm_files(layout.root, items, s3_endpoint.io_properties(), table_name="t", knobs=WarmKnobs(concurrency=8))
    assert r.copied == len(uris) - before and r.already_cached == before
    _assert_consistent(layout, expected)
    assert len(list(layout.files.rglob("*.bin"))) == len(uris)
    assert not list(layout.tmp.iterdir())


def test_large_object_ranged_copy_is_byte_identical(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:  # noqa: F811
    size = WarmKnobs().range_bytes * 2 + 12345  # fetched as parallel ranges, the last one short
    [uri] = upload_files(s3_endpoint, "ranged", 1, size)
    r = warm_files(tmp_path / "cache", [CacheItem(uri, size)], s3_endpoint.io_properties(), table_name="t")
    assert r.copied == 1 and r.bytes == size
    fs, inner = filesystem_for(uri, s3_endpoint.io_properties())
    with fs.open_input_stream(inner) as f:
        assert CacheLayout(tmp_path / "cache").local_path(uri).read_bytes() == f.read()
    with pytest.raises(CacheWarmError, match="table metadata says"):  # a size the store contradicts
        warm_files(tmp_path / "cache2", [CacheItem(uri, size - 1)], s3_endpoint.io_properties(), table_name="t")
    assert not list((tmp_path / "cache2" / "files").rglob("*.bin"))


def test_killed_warmup_resumes(tmp_path: Path, s3_endpoint: S3Endpoint) -> None:  # noqa: F811
    uris = upload_files(s3_endpoint, "killed", 120, 512 * 1024)
    layout = CacheLayout(tmp_path / "cache")
    expected = {layout.local_path(u).relative_to(layout.files).as_posix(): 512 * 1024 for u in uris}
    listing = tmp_path / "uris.txt"
    listing.write_text("\n".join(uris))
    code = (
        "import json,sys\n"
        "from slipstream.cache.settings import WarmKnobs\n"
        "from slipstream.cache.warm import CacheItem, warm_files\n"
        f"uris = open({str(listing)!r}).read().split()\n"
        f"warm_files({str(layout.root)!r}, [CacheItem(u, {512 * 1024}) for u in uris], json.loads(sys.argv[1]),"
        " table_name='t', knobs=WarmKnobs(concurrency=2))\n"
    )
    import json

    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(s3_endpoint.io_properties())],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while len(list(layout.files.rglob("*.bin"))) < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup of any kind runs
    finally:
        proc.wait(10)
    placed = len(list(layout.files.rglob("*.bin")))
    assert 0 < placed < len(uris), "the warmup should have been killed mid-way"
    on_disk = {str(p.relative_to(layout.files)): p.stat().st_size for p in layout.files.rglob("*") if p.is_file()}
    assert all(on_disk[k] == expected[k] for k in on_disk), "a killed copy left a partial file visible"
    r = warm_files(layout.root, [CacheItem(u, 512 * 1024) for u in uris], s3_endpoint.io_properties(),
                   table_name="t", knobs=WarmKnobs(concurrency=8))
    assert r.copied + r.already_cached == len(uris) and r.already_cached == placed
    _assert_consistent(layout, expected)
    assert not list(layout.tmp.iterdir())


def test_stack_starts_s3_only_when_wanted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slipstream.dev.s3server import S3Server as Server
    from slipstream.dev.stack import StackState, start_s3_if_wanted, stop_process
    from slipstream.settings import Settings

    settings = Settings(home=tmp_path / "home")
    monkeypatch.delenv("SLIPSTREAM_S3", raising=False)
    assert start_s3_if_wanted(settings, StackState()) is None  # auto + local warehouse: not started
    monkeypatch.setenv("SLIPSTREAM_S3", "on")
    for var in ("SLIPSTREAM_S3_ACCESS_KEY_ID", "SLIPSTREAM_S3_SECRET_ACCESS_KEY", "SLIPSTREAM_S3_PORT"):
        monkeypatch.delenv(var, raising=False)
    svc = start_s3_if_wanted(settings, StackState())
    assert svc is not None
    try:
        endpoint = Server(settings.home).last_endpoint()
        assert endpoint is not None
        props = endpoint.io_properties()
        assert props["s3.endpoint"] == svc.address and props["s3.secret-access-key"]
        assert oct((settings.home / "s3" / "s3.json").stat().st_mode & 0o777) == "0o600"
        fs, _ = filesystem_for("s3://warehouse/x", props)
        assert fs.get_file_info("warehouse").type.name == "Directory"
    finally:
        stop_process(svc.pid)
    assert not S3Server(settings.home).running()


def test_small_file_get_verifies_etag_and_reuses_connections(tmp_path: Path, s3_endpoint: S3Endpoint,  # noqa: F811
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Small files take one signed GET each (no HEAD) over a kept-alive connection per thread; the
    ETag from the GET is checked and recorded, and a body that does not match it is refused."""
    import hashlib

    from slipstream.cache import copy as copy_mod
    from slipstream.cache.remote import etag_matches
    from slipstream.cache.s3get import getter_for

    uris = upload_files(s3_endpoint, "get", 6, 20 * 1024)
    props = s3_endpoint.io_properties()
    getter = getter_for(props)
    assert getter is not None and getter_for({k: v for k, v in props.items() if k != "s3.endpoint"}) is None
    fs, _ = filesystem_for(uris[0], props)
    before = getter.connects
    r = warm_files(tmp_path / "cache", [CacheItem(u, 20 * 1024) for u in uris], props, table_name="t",
                   knobs=WarmKnobs(concurrency=1))
    assert r.copied == len(uris)
    layout = CacheLayout(tmp_path / "cache")
    with CacheIndex(layout) as index:
        for u in uris:
            with fs.open_input_stream(u.removeprefix("s3://")) as f:
                body = f.read()
            assert layout.local_path(u).read_bytes() == body
            entry = index.get(layout.local_path(u).relative_to(layout.files).as_posix())
            assert entry is not None and entry.etag and etag_matches(entry.etag, hashlib.md5(body)) is True
    assert getter.connects - before == 1, "one connection served all files of the thread"
    # a kept-alive connection the server dropped while idle is replaced transparently
    out = tmp_path / "direct"
    for _ in range(2):
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            size, etag, md5 = getter.get_to_fd(uris[2].removeprefix("s3://"), fd, lambda e: hashlib.md5())
        finally:
            os.close(fd)
        assert size == 20 * 1024 and etag_matches(etag, md5) is True
        getter._local.conns[getter.netloc].sock.shutdown(2)
    # a missing object is a FileNotFoundError (reported at once, not retried); with
    # SLIPSTREAM_CACHE_VERIFY=etag a body that does not match its ETag is refused
    by_etag = WarmKnobs(verify="etag")
    with pytest.raises(CacheWarmError, match="HTTP 404"):
        warm_files(tmp_path / "cache_c", [CacheItem(uris[0] + ".missing", 10)], props, table_name="t")
    monkeypatch.setattr(copy_mod, "etag_matches", lambda etag, md5: False)
    with pytest.raises(CacheWarmError, match="does not match its ETag"):
        warm_files(tmp_path / "cache_d", [CacheItem(uris[1], 20 * 1024)], props, table_name="t", knobs=by_etag)
    assert not list((tmp_path / "cache_d" / "files").rglob("*.bin"))
    assert not list((tmp_path / "cache_d" / "tmp").iterdir())
    # packed files are checked the same way; by default (SLIPSTREAM_CACHE_VERIFY=size) no MD5 is
    # computed, so the (patched) ETag check is not consulted, for a file of its own and packed ones
    monkeypatch.setattr("slipstream.cache.pack.etag_matches", lambda etag, md5: False)
    many = [CacheItem(u, 4096) for u in upload_files(s3_endpoint, "get-size-only", 40, 4096)]
    with pytest.raises(CacheWarmError, match="does not match its ETag"):
        warm_files(tmp_path / "cache_e", many, props, table_name="t", knobs=by_etag)
    size_only = WarmKnobs()
    assert warm_files(tmp_path / "cache_f", many, props, table_name="t", knobs=size_only).packed == 40
    assert warm_files(tmp_path / "cache_g", [CacheItem(uris[1], 20 * 1024)], props, table_name="t",
                      knobs=size_only).copied == 1


def test_killed_packing_warmup_shows_only_whole_blocks_and_resumes(
        tmp_path: Path, s3_endpoint: S3Endpoint) -> None:  # noqa: F811
    """Small files are packed into blocks; a warmup killed mid-block leaves nothing a reader can
    see but whole, verified files, and the re-run packs exactly the rest."""
    import json

    size = 8 * 1024
    uris = upload_files(s3_endpoint, "killed-packed", 600, size)
    props = s3_endpoint.io_properties()
    layout = CacheLayout(tmp_path / "cache")
    listing = tmp_path / "uris.txt"
    listing.write_text("\n".join(uris))
    code = (
        "import json,sys\n"
        "from slipstream.cache.settings import WarmKnobs\n"
        "from slipstream.cache.warm import CacheItem, warm_files\n"
        f"uris = open({str(listing)!r}).read().split()\n"
        f"warm_files({str(layout.root)!r}, [CacheItem(u, {size}) for u in uris], json.loads(sys.argv[1]),"
        " table_name='t', knobs=WarmKnobs(concurrency=2, block_bytes=64 * 1024))\n"  # many small blocks
    )
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(props)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while (not layout.blocks.exists() or len(list(layout.blocks.glob("*.blk"))) < 4) \
                and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)  # mid-block: no cleanup of any kind runs
    finally:
        proc.wait(10)
    fs, _ = filesystem_for(uris[0], props)
    remote = {}
    for u in uris:
        with fs.open_input_stream(u.removeprefix("s3://")) as f:
            remote[u] = f.read()
    with CacheIndex(layout) as index:
        committed = {e.remote for e in index.entries()}
        assert all(e.block is not None for e in index.entries())
    assert 0 < len(committed) < len(uris), "the warmup should have been killed mid-way"
    with CacheReader(str(layout.root), props) as reader:  # every visible file is whole
        for u in sorted(committed):
            with reader.open_input_file(u) as f:
                assert f.read() == remote[u]
        assert (reader.stats()["hits"], reader.stats()["misses"]) == (len(committed), 0)

    r = warm_files(layout.root, [CacheItem(u, size) for u in uris], props, table_name="t",
                   knobs=WarmKnobs(concurrency=4))
    assert r.already_cached == len(committed) and r.copied == r.packed == len(uris) - len(committed)
    assert not list(layout.tmp.iterdir())
    with CacheIndex(layout) as index:
        assert {b.name for b in index.blocks()} == {p.name for p in layout.blocks.iterdir()}, "orphans deleted"
        assert index.total_bytes() == sum(p.stat().st_size for p in layout.blocks.iterdir())
    with CacheReader(str(layout.root), props) as reader:
        assert all(reader.read_file(u) == remote[u] for u in uris)
        assert reader.stats()["hits"] == len(uris)


def test_warmup_waits_out_a_store_restart_longer_than_a_few_seconds(
    tmp_path: Path, s3_server: S3Server, s3_endpoint: S3Endpoint,  # noqa: F811
) -> None:
    """The store is down for 6 s mid-warmup (the old retry budget was 4 tries in 3.5 s): the
    warmup waits (SLIPSTREAM_CACHE_RETRY_S) and places every file, nothing failed."""
    size = 256 * 1024
    uris = upload_files(s3_endpoint, "long-restart", 120, size)
    layout = CacheLayout(tmp_path / "cache")
    outcome: dict[str, object] = {}

    def warm() -> None:
        try:
            outcome["report"] = warm_files(layout.root, [CacheItem(u, size) for u in uris], s3_endpoint.io_properties(),
                                           table_name="t", knobs=WarmKnobs(concurrency=2, retry_s=60))
        except Exception as e:  # noqa: BLE001 - asserted below
            outcome["error"] = e

    thread = threading.Thread(target=warm)
    thread.start()
    deadline = time.monotonic() + 60
    while len(list(layout.files.rglob("*.bin"))) < 5 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread.is_alive(), "the warmup finished before the restart: make the window larger"
    s3_server.stop()
    time.sleep(6.0)
    s3_server.start()
    thread.join(120)
    assert "error" not in outcome, outcome.get("error")
    report = outcome["report"]
    assert report.copied == len(uris) and report.expected_hit_ratio == 1.0  # type: ignore[attr-defined]
    _assert_consistent(layout, {layout.local_path(u).relative_to(layout.files).as_posix(): size for u in uris})
