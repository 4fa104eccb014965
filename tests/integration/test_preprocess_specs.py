"""The Spark job on other people's data: a ratings log with side tables, records missing fields,
an empty day, and a spec that gains a feature (real Spark local, a SQLite Iceberg catalog).

Expected samples come from the spec's Arrow-level featurizer run on the same records in plain
Python: the job must equal it (the stream joiner runs that featurizer too, so this is also the
batch/stream skew check at the transform level)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from slipstream.errors import RejectRateExceeded
from slipstream.lake.iceberg import get_catalog, rejects_table, samples_table
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import Spec, load_spec, parse_spec_text
from slipstream.samples.transform import Featurizer
from slipstream.settings import Settings
from spark_jobs.day_job import DayOptions, DayResult, preprocess_day
from tests.preprocess_fixtures import day_rows, impression, ts, write_jsonl

pytestmark = pytest.mark.integration

DAY = date(2026, 9, 1)
EMPTY_DAY = DAY + timedelta(days=1)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from spark_jobs.preprocess import start_spark

    session = start_spark(SparkSettings(shuffle_partitions=2), "test-preprocess-specs")
    yield session
    session.stop()


def _run(spark: Any, settings: Settings, spec: Spec, day: date, run_id: str, **kw: Any) -> DayResult:
    opts = DayOptions(spec=spec, raw_dir=settings.raw_dir, namespace=settings.namespace, run_id=run_id,
                      max_reject_rate=kw.pop("max_reject_rate", 0.3), target_bytes=64 << 20, **kw)
    return preprocess_day(spark, get_catalog(settings), opts, day)


def _epoch(day: date, hh: int, mm: int) -> str:
    return (datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(hours=hh, minutes=mm)).isoformat()


def test_a_ratings_log_with_side_tables_equals_the_featurizer(spark: Any, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    spec = load_spec("ratings")
    raw = Path(settings.raw_dir)
    good = [
        {"user_id": 1, "item_id": 10, "rating": 5.0, "ts": _epoch(DAY, 9, 0)},
        {"user_id": 1, "item_id": 11, "rating": 2.0, "ts": _epoch(DAY, 9, 5)},
        {"user_id": 1, "item_id": 12, "rating": 4.0, "ts": _epoch(DAY, 9, 9)},
        {"user_id": 2, "item_id": 10, "rating": 4.5, "ts": _epoch(DAY, 11, 0)},
        {"user_id": 3, "item_id": 13, "rating": 1.0, "ts": _epoch(DAY, 12, 0)},  # not in users.parquet
    ]
    bad = {"user_id": 2, "item_id": 11, "ts": _epoch(DAY, 11, 30)}  # rating missing: a required field
    write_jsonl(raw / "ratings" / f"day={DAY}" / "hour=09" / "part-0.jsonl.gz", good[:3] + [good[0]])  # a replayed record
    write_jsonl(raw / "ratings" / f"day={DAY}" / "hour=11" / "part-0.jsonl.gz", [good[3], bad, good[4]])
    users = pa.table({"user_id": pa.array([1, 2], pa.int64()), "gender": ["F", "M"], "age": pa.array([25, None], pa.int64()),
                      "occupation": ["artist", "doctor"]})
    items = pa.table({"item_id": pa.array([10, 11, 12], pa.int64()), "title": ["a", "b", "c"],
                      "genres": ["Drama|Romance", "Comedy", ""], "year": pa.array([1995, 2001, None], pa.int64())})
    for name, t in (("users", users), ("items", items)):
        (raw / name).mkdir(parents=True)
        pq.write_table(t, raw / name / "part-0.parquet")

    res = _run(spark, settings, spec, DAY, "ratings-1")
    assert (res.rows, res.rejects, res.raw_records) == (5, 1, 7)
    got = day_rows(samples_table(get_catalog(settings), settings.namespace, spec), DAY)
    assert got.column_names == list(spec.sample_columns)

    events = pa.Table.from_pylist([{**r, "ts": datetime.fromisoformat(r["ts"])} for r in good],
                                  schema=source_arrow_schema(spec.events))
    events = events.sort_by([("user_id", "ascending"), ("ts", "ascending")])
    want = Featurizer(spec, {"users": users, "items": items}).samples(events).sort_by("sample_id")
    for name in want.column_names:
        assert got[name].to_pylist() == want[name].to_pylist(), name
    assert got["label"].to_pylist() == want["label"].to_pylist() and sum(got["label"].to_pylist()) == 3

    rejects = rejects_table(get_catalog(settings), settings.namespace).scan(row_filter=f"day = '{DAY}'").to_arrow()
    assert rejects["reason"].to_pylist() == ["missing field rating"]
    assert rejects["record_kind"].to_pylist() == ["ratings"]

    skipped = _run(spark, settings, spec, EMPTY_DAY, "ratings-2")  # no folder at all: real logs have such days
    assert skipped.empty and skipped.rows == 0 and skipped.snapshot_id is None


def test_records_missing_required_fields_fail_with_the_field_named(spark: Any, tmp_path: Path) -> None:
    """The synthetic layout with `price` and `position` left out of every record: one clear error
    naming the fields and counts (never a JVM trace), `samples` untouched."""
    settings = Settings(home=tmp_path / "home")
    rows = [impression(f"m{i}", ts(DAY, 10, i), user=i % 3, item=100 + i) for i in range(20)]
    for r in rows:
        del r["price"], r["position"]
    write_jsonl(Path(settings.raw_dir) / "impressions" / f"day={DAY}" / "hour=10" / "part-0.jsonl.gz", rows)
    with pytest.raises(RejectRateExceeded) as err:
        _run(spark, settings, load_spec(), DAY, "missing-1")
    msg = str(err.value)
    assert f"all 20 raw records of day {DAY} rejected: missing field price in 20 records" in msg, msg
    assert "optional: true" in msg and "Py4J" not in msg and "Exception" not in msg
    table = samples_table(get_catalog(settings), settings.namespace)
    assert table.current_snapshot() is None


TINY = """
spec_version: 1
name: tiny
version: {version}
sources:
  events:
    kind: events
    id: event_id
    time: ts
    fields:
      event_id: {{type: string}}
      ts: {{type: timestamp}}
      user_id: {{type: long}}
      clicked: {{type: int}}
      device: {{type: string, optional: true, default: unknown}}
label:
  column: {{field: clicked}}
features:
  user_id: {{kind: id, field: user_id, buckets: 11}}
{extra}
"""


def test_a_new_feature_evolves_the_table_and_old_snapshots_stay_readable(spark: Any, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    v1 = parse_spec_text(TINY.format(version=1, extra=""))
    v2 = parse_spec_text(TINY.format(version=2, extra="  device_hash: {kind: categorical, field: device, buckets: 7}"))
    raw = Path(settings.raw_dir)
    day2 = DAY + timedelta(days=1)
    for day in (DAY, day2):
        path = raw / "events" / f"day={day}" / "hour=08" / "part-0.jsonl.gz"
        path.parent.mkdir(parents=True)
        with gzip.open(path, "wt") as fh:
            for i in range(4):  # the first record has no device: it takes the default
                rec = {"event_id": f"{day}-{i}", "ts": ts(day, 8, i), "user_id": i, "clicked": i % 2}
                if i:
                    rec["device"] = "ios"
                fh.write(json.dumps(rec) + "\n")
    first = _run(spark, settings, v1, DAY, "tiny-1")
    second = _run(spark, settings, v2, day2, "tiny-2")
    table = samples_table(get_catalog(settings), settings.namespace)
    assert [f.name for f in table.schema().fields] == ["sample_id", "event_time", "user_id", "label", "device_hash"]
    old = table.scan(snapshot_id=first.snapshot_id).to_arrow()
    assert old.num_rows == 4 and "device_hash" not in old.column_names or pc.all(pc.is_null(old["device_hash"])).as_py()
    new = day_rows(table, day2)
    from slipstream.samples.schema import hash_category

    assert new["device_hash"].to_pylist() == [hash_category("unknown")] + [hash_category("ios")] * 3
    both = table.scan(snapshot_id=second.snapshot_id).to_arrow()
    assert both.num_rows == 8 and both["device_hash"].null_count == 4  # day 1's rows read the new column as null
