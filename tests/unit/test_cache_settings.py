"""Cache settings parsing, Kubernetes placement rendering, cache keys and ETag checks."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from slipstream.cache.placement import VOLUME_NAME, cache_placement, warmup_command
from slipstream.cache.remote import cache_key, etag_matches
from slipstream.cache.settings import CacheSettings, parse_bytes
from slipstream.errors import CacheError, ConfigError
from slipstream.settings import Settings


def test_parse_bytes_units_and_no_cap() -> None:
    assert parse_bytes("50GiB") == 50 * 2**30
    assert parse_bytes("200MB") == 200_000_000
    assert parse_bytes("1234") == 1234
    assert parse_bytes("") is None and parse_bytes("0") is None
    with pytest.raises(ConfigError, match="SLIPSTREAM_CACHE_BUDGET_BYTES"):
        parse_bytes("lots")


def test_bad_settings_name_the_variable(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    with pytest.raises(ConfigError, match="SLIPSTREAM_CACHE_VOLUME"):
        CacheSettings.from_env(s, {"SLIPSTREAM_CACHE_VOLUME": "nfs:/x"})
    with pytest.raises(ConfigError, match="SLIPSTREAM_CACHE_NODE_SELECTOR"):
        CacheSettings.from_env(s, {"SLIPSTREAM_CACHE_NODE_SELECTOR": "novalue"})
    with pytest.raises(ConfigError, match="SLIPSTREAM_CACHE_CONCURRENCY"):
        CacheSettings.from_env(s, {"SLIPSTREAM_CACHE_CONCURRENCY": "0"})


def test_placement_hostpath_affinity_matches_selector(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    cache = CacheSettings.from_env(s, {"SLIPSTREAM_CACHE_NODE_SELECTOR": "slipstream.io/cache=true,zone=a"})
    p = cache_placement(s, cache)
    assert p["node_selector"] == {"slipstream.io/cache": "true", "zone": "a"}
    terms = p["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {(m["key"], m["values"][0]) for m in terms[0]["matchExpressions"]} == set(p["node_selector"].items())
    assert p["volumes"] == [{"name": VOLUME_NAME, "hostPath": {"path": "/mnt/slipstream-cache", "type": "DirectoryOrCreate"}}]
    assert p["volume_mounts"] == [{"name": VOLUME_NAME, "mountPath": "/mnt/slipstream-cache"}]
    assert p["env"]["SLIPSTREAM_CACHE_DIR"] == "/mnt/slipstream-cache"


def test_placement_pvc(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    cache = CacheSettings.from_env(s, {"SLIPSTREAM_CACHE_VOLUME": "pvc:cache-claim", "SLIPSTREAM_CACHE_MOUNT_PATH": "/cache"})
    p = cache_placement(s, cache)
    assert p["volumes"][0]["persistentVolumeClaim"] == {"claimName": "cache-claim"}
    assert p["volume_mounts"][0]["mountPath"] == "/cache" == p["env"]["SLIPSTREAM_CACHE_DIR"]
    assert warmup_command("samples", 3, "2026-03-05T00:00:00+00:00", 42)[-2:] == ["--snapshot", "42"]


def test_cache_keys_mirror_remote_paths() -> None:
    assert cache_key("s3://warehouse/wh/a/b.parquet") == "s3/warehouse/wh/a/b.parquet"
    assert cache_key("file:///data/wh/x.parquet") == "file/data/wh/x.parquet"
    with pytest.raises(CacheError, match=r"'\.\.'"):
        cache_key("s3://warehouse/../etc/passwd")
    with pytest.raises(CacheError, match="scheme"):
        cache_key("hdfs://nn/x")


def test_etag_check() -> None:
    data = b"x" * 1000
    md5 = hashlib.md5(data)
    assert etag_matches(f'"{md5.hexdigest()}"', md5) is True
    assert etag_matches(f'"{hashlib.md5(md5.digest()).hexdigest()}-1"', md5) is True
    assert etag_matches('"00000000000000000000000000000000"', md5) is False
    assert etag_matches('"abc-3"', md5) is None


def test_warm_knobs_parse_auto_sizes_and_name_the_variable_on_bad_input(tmp_path: Path) -> None:
    s = Settings(home=tmp_path)
    default = CacheSettings.from_env(s, {}).warm
    assert default.concurrency is None and default.range_bytes == 8 << 20 and default.retry_s == 120.0
    knobs = CacheSettings.from_env(s, {"SLIPSTREAM_CACHE_CONCURRENCY": "24", "SLIPSTREAM_CACHE_BLOCK_BYTES": "4MiB",
                                       "SLIPSTREAM_CACHE_RANGE_BYTES": "2MiB", "SLIPSTREAM_CACHE_RETRY_S": "30"}).warm
    assert (knobs.concurrency, knobs.block_bytes, knobs.range_bytes, knobs.retry_s) == (24, 4 << 20, 2 << 20, 30.0)
    assert CacheSettings.from_env(s, knobs.as_env()).warm == knobs  # what a pod gets is what was parsed
    for name, bad in (("CONCURRENCY", "lots"), ("RANGE_BYTES", "1KiB"), ("RETRY_S", "soon"), ("BLOCK_BYTES", "big")):
        with pytest.raises(ConfigError, match=f"SLIPSTREAM_CACHE_{name}"):
            CacheSettings.from_env(s, {f"SLIPSTREAM_CACHE_{name}": bad})
