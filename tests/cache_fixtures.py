"""Fixtures of the cache area: a real SeaweedFS S3 server for the session, and a small `samples`
table filled day by day (one data file per day) on the local disk or on that server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from slipstream.dev.s3server import S3Endpoint, S3Server
from slipstream.settings import Settings

START_DAY = date(2026, 3, 1)
DAYS = 4


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS on free 127.0.0.1 ports for the whole session, stopped by the PID it started."""
    server = S3Server(tmp_path_factory.mktemp("s3-home"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_endpoint(s3_server: S3Server) -> S3Endpoint:
    ep = s3_server.start()  # no-op when running; restarts it if a test stopped it
    return ep


@pytest.fixture(scope="session")
def day_tables() -> dict[str, pa.Table]:
    """The reference samples of DAYS small days (computed once per session)."""
    from slipstream.dev.datagen import GeneratorConfig, reference_samples

    return reference_samples(GeneratorConfig(start_day=START_DAY, days=DAYS, impressions_per_day=300, users=100, items=50))


def window_end(days_loaded: int) -> datetime:
    """Midnight (UTC) after the last of `days_loaded` days."""
    d = START_DAY + timedelta(days=days_loaded)
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def s3_settings(home: Path, endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings whose warehouse is a fresh prefix in the S3 server's bucket (keys via SLIPSTREAM_S3_*)."""
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLIPSTREAM_HOME", str(home))
    monkeypatch.setenv("SLIPSTREAM_WAREHOUSE", endpoint.warehouse(f"wh-{home.parent.name}"))
    monkeypatch.setenv("SLIPSTREAM_CACHE_DIR", str(home / "cache"))
    return Settings.from_env()


def append_days(settings: Settings, day_tables: dict[str, pa.Table], days: range, table: str = "samples") -> int:
    """Append the given day indexes (one commit, one data file each); returns the new snapshot id."""
    from slipstream.lake.iceberg import ensure_table, get_catalog
    from slipstream.samples.schema import ICEBERG_SCHEMA, PARTITION_SPEC

    tbl = ensure_table(get_catalog(settings), f"{settings.namespace}.{table}", ICEBERG_SCHEMA, PARTITION_SPEC)
    tables = list(day_tables.values())
    for d in days:
        tbl.append(tables[d])
    snap = tbl.current_snapshot()
    assert snap is not None
    return snap.snapshot_id


def upload_files(endpoint: S3Endpoint, prefix: str, count: int, size: int, threads: int = 16) -> list[str]:
    """Write `count` files of `size` random bytes to s3://<bucket>/<prefix>/; returns their URIs."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from slipstream.cache.remote import filesystem_for

    uris = [f"s3://{endpoint.bucket}/{prefix}/part-{i:05d}.bin" for i in range(count)]
    fs, _ = filesystem_for(uris[0], endpoint.io_properties())
    payload = os.urandom(size + count)

    def put(i: int) -> None:
        with fs.open_output_stream(uris[i].removeprefix("s3://")) as out:
            out.write(payload[i:i + size])  # distinct content per file

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, range(count)))
    return uris
