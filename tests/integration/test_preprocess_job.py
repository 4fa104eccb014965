"""The Spark preprocessing job end to end, on real Spark local[*] and a SQLite Iceberg catalog.

One small raw zone is generated once for the module and preprocessed once through the launcher
(hand-made day + two generated days in one job process); the tests then check outcomes against an
independent Python implementation (`reference_samples`) and hand-made expectations. Re-runs and
failures call the job's `preprocess_day` in ONE in-process Spark session started like the job
starts its own, because every Spark start costs 10-30 s on this shared machine.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slipstream.dev.datagen import GeneratorConfig, generate, reference_samples
from slipstream.errors import RawDataError, RejectRateExceeded
from slipstream.lake.iceberg import day_predicate, get_catalog, rejects_table, samples_table
from slipstream.pipeline.preprocess_launch import PreprocessResult, run_preprocess_days
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.samples.schema import ATTRIBUTION_WINDOW_S, DENSE_COLUMNS, IMPRESSION_ARROW_SCHEMA, NAMESPACE
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings
from spark_jobs.day_job import DayOptions, DayResult, preprocess_day
from tests.preprocess_fixtures import HAND_DAY, content_checksum, day_rows, impression, ts, write_hand_day, write_jsonl

pytestmark = pytest.mark.integration

CFG = GeneratorConfig(start_day=date(2026, 11, 1), days=2, impressions_per_day=3000, users=300, items=120,
                      corrupt_fraction=0.04, seed=11)
"""About 5 bad lines per hour file, of the five kinds datagen makes (~4% of the records)."""
DAYS = [CFG.start_day + timedelta(days=i) for i in range(CFG.days)]


@dataclass
class Prepared:
    settings: Settings
    results: dict[date, PreprocessResult]
    expected_hand: dict[str, dict[str, object]]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prepared]:
    home = tmp_path_factory.mktemp("preprocess-home")
    settings = Settings(home=home, namespace=NAMESPACE)
    generate(CFG, settings.raw_dir)
    expected = write_hand_day(Path(settings.raw_dir))
    results = run_preprocess_days(settings, [HAND_DAY, *DAYS], "run-a", max_reject_rate=0.1, timeout_s=300)
    yield Prepared(settings, {r.day: r for r in results}, expected)


@pytest.fixture(scope="module")
def spark(prepared: Prepared) -> Iterator[object]:
    from spark_jobs.preprocess import start_spark

    session = start_spark(SparkSettings(shuffle_partitions=2), "test-preprocess")
    yield session
    session.stop()


def _run_day(p: Prepared, spark: object, day: date, run_id: str, **kw: object) -> DayResult:
    """One day exactly as the job runs it (same options as the CLI defaults unless given)."""
    opts = DayOptions(**{"spec": load_spec(), "raw_dir": p.settings.raw_dir, "namespace": p.settings.namespace, "run_id": run_id,
                         "attribution_s": ATTRIBUTION_WINDOW_S, "max_reject_rate": 0.1,
                         "target_bytes": 128 << 20, **kw})  # type: ignore[arg-type]
    return preprocess_day(spark, get_catalog(p.settings), opts, day)  # type: ignore[arg-type]


def _samples(p: Prepared):  # type: ignore[no-untyped-def]
    return samples_table(get_catalog(p.settings), p.settings.namespace)


def test_output_equals_the_python_reference(prepared: Prepared) -> None:
    table = _samples(prepared)
    for day, ref in reference_samples(CFG).items():
        got = day_rows(table, date.fromisoformat(day))
        ref = ref.sort_by("sample_id")
        assert got.num_rows == ref.num_rows == prepared.results[date.fromisoformat(day)].rows
        for col in ("sample_id", "event_time", "user_id", "item_id", "device_hash", "country_hash",
                    "category_hash", "label"):
            assert got[col].to_pylist() == ref[col].to_pylist(), col
        assert got["hist_items"].to_pylist() == ref["hist_items"].to_pylist()
        for col in DENSE_COLUMNS:
            np.testing.assert_allclose(got[col].to_numpy(), ref[col].to_numpy(), rtol=1e-6, atol=1e-7)
        assert pa.compute.sum(got["label"]).as_py() > 0


def test_hand_made_join_labels_dedupe_and_history(prepared: Prepared) -> None:
    got = {r["sample_id"]: r for r in day_rows(_samples(prepared), HAND_DAY).to_pylist()}
    assert set(got) == set(prepared.expected_hand)  # the duplicate is one sample; yesterday's row is not here
    for sid, want in prepared.expected_hand.items():
        assert got[sid]["label"] == want["label"], sid
        assert got[sid]["hist_items"] == want["hist"], sid


def test_snapshot_summary_and_rejects_table(prepared: Prepared) -> None:
    catalog = get_catalog(prepared.settings)
    table = samples_table(catalog, prepared.settings.namespace)
    day = DAYS[0]
    res = prepared.results[day]
    snap = table.snapshot_by_id(res.snapshot_id)
    assert snap is not None
    props = snap.summary.additional_properties
    # the days of one run are one range job: one snapshot whose summary names the range and its totals
    results = sorted(prepared.results.values(), key=lambda r: r.day)
    assert {r.snapshot_id for r in results} == {res.snapshot_id}
    assert (props["days"], props["day_count"], props["run_id"]) == (f"{results[0].day}..{results[-1].day}", str(len(results)),
                                                                     "run-a")
    assert (props["rows"], props["rejects"]) == (str(sum(r.rows for r in results)), str(sum(r.rejects for r in results)))

    rejects = rejects_table(catalog, prepared.settings.namespace).scan(row_filter=f"day = '{day}'").to_arrow().to_pylist()
    assert res.rejects == len(rejects) >= 24 * 4
    reasons = " | ".join(r["reason"] for r in rejects)
    for fragment in ("malformed line", "missing field user_id", "price is NaN", "outside day", "wrong type: position"):
        assert fragment in reasons
    assert all(r["source_file"].endswith(".jsonl.gz") and "day=2026-11-01" in r["source_file"] for r in rejects)
    assert all(r["raw_line"] for r in rejects)


def test_rerun_replaces_the_day_idempotently(prepared: Prepared, spark: object) -> None:
    table = _samples(prepared)
    day, other = DAYS[0], DAYS[1]
    before, other_before = day_rows(table, day), content_checksum(day_rows(table, other))
    again = _run_day(prepared, spark, day, "run-b")
    table.refresh()
    after = day_rows(table, day)
    assert again.rows == after.num_rows == before.num_rows
    assert len(set(after["sample_id"].to_pylist())) == after.num_rows
    assert content_checksum(after) == content_checksum(before)
    assert content_checksum(day_rows(table, other)) == other_before
    assert table.current_snapshot().summary.additional_properties["run_id"] == "run-b"
    rejects = rejects_table(get_catalog(prepared.settings), prepared.settings.namespace)
    assert len(rejects.scan(row_filter=f"day = '{day}'").to_arrow()) == again.rejects == prepared.results[day].rejects  # replaced, not doubled


def test_bad_input_fails_clearly_and_leaves_samples_untouched(prepared: Prepared, spark: object, tmp_path: Path) -> None:
    """Reject rate, schema drift, unreadable file, missing day: each a clear domain error, and
    `samples` keeps its snapshot."""
    table = _samples(prepared)
    snapshot = table.current_snapshot().snapshot_id

    with pytest.raises(RejectRateExceeded, match=r"Worst files: .*day=2026-11-02/hour=\d\d/part-0.jsonl.gz"):
        _run_day(prepared, spark, DAYS[1], "run-strict", max_reject_rate=0.01)

    drift_raw = tmp_path / "raw"
    day = DAYS[1]
    shutil.copytree(Path(prepared.settings.raw_dir) / "clicks", drift_raw / "clicks")
    src = Path(prepared.settings.raw_dir) / "impressions" / f"day={day}"
    shutil.copytree(src, drift_raw / "impressions" / f"day={day}")
    victim = drift_raw / "impressions" / f"day={day}" / "hour=07" / "part-0.jsonl.gz"
    records = [json.loads(line) for line in gzip.open(victim).read().splitlines()[:50]]
    for r in records:
        r["ts"] = datetime.fromisoformat(r["ts"])
    drifted = pa.schema([f for f in IMPRESSION_ARROW_SCHEMA if f.name != "user_id"])
    victim.unlink()  # the producer switched this hour to Parquet and lost a column on the way
    pq.write_table(pa.Table.from_pylist(records, schema=drifted), victim.with_name("part-0.parquet"))
    with pytest.raises(RawDataError, match=r"schema drift .*hour=07/part-0.parquet: required column\(s\) user_id missing"):
        _run_day(prepared, spark, day, "run-drift", raw_dir=str(drift_raw))

    unreadable = drift_raw / "impressions" / f"day={day}" / "hour=07" / "part-0.parquet"
    unreadable.write_bytes(b"PAR1 truncated by a crashed uploader")
    with pytest.raises(RawDataError, match=r"could not be read: file \S+hour=07/part-0.parquet"):
        _run_day(prepared, spark, day, "run-unreadable", raw_dir=str(drift_raw))

    # a day without raw events is skipped (real logs have empty days), nothing committed
    skipped = _run_day(prepared, spark, date(2030, 1, 1), "run-missing")
    assert (skipped.empty, skipped.rows, skipped.snapshot_id) == (True, 0, None)

    table.refresh()
    assert table.current_snapshot().snapshot_id == snapshot


def _dedupe_day(prepared: Prepared, spark: object, tmp_path: Path, day: date, imps: list[dict[str, object]],
                caplog: pytest.LogCaptureFixture) -> tuple[dict[str, dict[str, object]], bool]:
    """Run one hand-made day; (rows by sample_id, whether the job fell back to the dedupe by id)."""
    import logging

    raw = tmp_path / "raw"
    tag = f"@{day:%m%d}"  # a sample id is unique across the table: each day's ids get the day
    imps = [{**r, "impression_id": f"{r['impression_id']}{tag}"} for r in imps]
    write_jsonl(raw / "impressions" / f"day={day}" / "hour=00" / "part-0.jsonl.gz", imps)
    write_jsonl(raw / "clicks" / f"day={day}" / "hour=00" / "part-0.jsonl.gz",
                [{"impression_id": f"x{tag}", "ts": ts(day, 9, 5)}])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="spark_jobs.day_job"):
        res = _run_day(prepared, spark, day, f"run-{day}", raw_dir=str(raw))
    fell_back = "writing the day again with the dedupe by id" in caplog.text
    table = _samples(prepared)
    rows = {r["sample_id"].removesuffix(tag): r for r in day_rows(table, day).to_pylist()}
    assert res.rows == len(rows)
    # no orphan: the files of a first write that was redone are gone
    on_disk = {f"file://{f}" for f in Path(table.location().removeprefix("file://"), "data", f"event_time_day={day}").glob("*.parquet")}
    assert on_disk == {t.file.file_path for t in table.scan(row_filter=day_predicate(table, day)).plan_files()}
    return rows, fell_back


def test_differing_copies_of_an_impression_keep_the_smallest_row(prepared: Prepared, spark: object, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The rule of `dedupe_and_label`: among copies of an id the smallest row (event_time, user_id,
    item_id, ...) is the sample, labelled against its own time, and only it enters its user's
    history. Copies of the same user and time are dropped by the writer; copies across users or
    times make the job write the day again with the dedupe by id."""
    same = date(2026, 10, 10)
    rows, fell_back = _dedupe_day(prepared, spark, tmp_path / "same", same, [
        impression("x", ts(same, 9, 0), user=8, item=802),
        impression("x", ts(same, 9, 0), user=8, item=801),  # smaller item: this copy is the sample
        impression("y", ts(same, 9, 30), user=8, item=803),
    ], caplog)
    assert not fell_back
    assert {k: (r["item_id"], r["label"], r["hist_items"]) for k, r in rows.items()} == {
        "x": (801, 1, []), "y": (803, 0, [801])}

    apart = date(2026, 10, 11)
    rows, fell_back = _dedupe_day(prepared, spark, tmp_path / "apart", apart, [
        impression("x", ts(apart, 9, 0), user=5, item=501),
        impression("x", ts(apart, 8, 0), user=6, item=601),   # earlier: this copy (user 6) is the sample
        impression("u5", ts(apart, 10, 0), user=5, item=502),
        impression("u6", ts(apart, 10, 0), user=6, item=602),
        impression("t", ts(apart, 12, 0), user=7, item=701),
        impression("t-mid", ts(apart, 11, 30), user=7, item=703),
        impression("t", ts(apart, 11, 0), user=7, item=702),  # earlier, and not next to the other copy
    ], caplog)
    assert fell_back
    assert {k: (r["user_id"], r["item_id"], r["hist_items"]) for k, r in rows.items()} == {
        "x": (6, 601, []), "u5": (5, 502, []), "u6": (6, 602, [601]), "t": (7, 702, []), "t-mid": (7, 703, [702])}
    assert rows["x"]["label"] == 0  # its click (09:05) is 65 min after the sample's 08:00: outside the window
