"""The quality gate on real Iceberg data (SQLite catalog): good days pass, planted faults fail
or warn as configured and are named with their observed values."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slipstream.errors import ConfigError, QualityGateFailed
from slipstream.lake.iceberg import get_catalog
from slipstream.quality.config import GateConfig
from slipstream.quality.gate import run_gate
from slipstream.quality.profiles import profile_table
from slipstream.quality.store import read_profiles, read_results, write_profile
from slipstream.samples.schema import DEFAULT_SPEC as SPEC
from slipstream.settings import Settings
from tests.quality_fixtures import DAYS, day_of, fill_samples, reference_days, replace_column

LAST = day_of(DAYS - 1)


FAST = GateConfig(data_docs=False)
"""GX Data Docs cost ~1 s per gate; one test checks them, the rest skip them."""


def _setup(settings: Settings, last: pa.Table | None = None, with_profiles: bool = False) -> int:
    days = dict(reference_days())
    key = str(LAST)
    if last is not None:
        days[key] = last
    catalog = get_catalog(settings)
    snap = fill_samples(catalog, settings.namespace, days)
    if with_profiles:
        for k, t in days.items():
            if k != key:
                d = datetime.fromisoformat(k).date()
                write_profile(catalog, settings.namespace, day=d, snapshot_id=snap, run_id="seed", profile=profile_table(t, SPEC))
    return snap


def _last() -> pa.Table:
    return reference_days()[str(LAST)]


def _nulls(t: pa.Table) -> pa.Table:
    mask = np.zeros(t.num_rows, bool)
    mask[::80] = True  # 50 of 4000
    vals = pa.array(t.column("label").to_numpy(), pa.int32(), mask=mask)
    return replace_column(t, "label", vals)


def _out_of_range(t: pa.Table) -> pa.Table:
    x = t.column("price_log").to_numpy().copy()
    x[:3] = 3.5
    return replace_column(t, "price_log", x)


def _duplicates(t: pa.Table) -> pa.Table:
    return pa.concat_tables([t, t.slice(100, 7)])


def _tenth(t: pa.Table) -> pa.Table:
    return t.slice(0, t.num_rows // 10)


def _ctr_collapse(t: pa.Table) -> pa.Table:
    return replace_column(t, "label", np.zeros(t.num_rows, np.int32))


FAULTS: list[tuple[str, Callable[[pa.Table], pa.Table], str, str]] = [
    ("nulls", _nulls, "not_null.label", "observed 50"),
    ("out_of_range", _out_of_range, "range.max.price_log", "observed 3.5"),
    ("duplicate_ids", _duplicates, "unique.sample_id", "observed 7 (e.g. imp-"),
    ("tenth_of_a_day", _tenth, "row_count.vs_expected", "observed 0.1 (400 rows vs 4,000 expected: the median of 7 days)"),
    ("ctr_collapse", _ctr_collapse, "ctr", "observed 0,"),
]


def test_good_day_passes_and_persists(settings: Settings) -> None:
    snap = _setup(settings)
    res = run_gate(settings, spec=SPEC, day=LAST, window=None, snapshot_id=snap, run_id="run-good")  # default: with GX Data Docs
    assert res.passed and res.warnings == []
    assert res.rows == 4000
    names = {r.name for r in res.results}
    assert {"schema", "unique.sample_id", "ctr", "row_count.vs_expected", "label.binary"} <= names
    assert next(r for r in res.results if r.name == "row_count.vs_expected").observed.startswith("1 ")
    catalog = get_catalog(settings)
    stored = read_results(catalog, settings.namespace, "run-good")
    assert stored.num_rows == len(res.results)
    assert all(stored.column("success").to_pylist())
    assert set(stored.column("severity").to_pylist()) == {"critical", "warning"}
    assert res.html_path is not None and "PASSED" in res.html_path.read_text()
    assert res.html_path.parent == Path(settings.runs_dir) / "run-good" / "quality"
    assert res.data_docs is not None and res.data_docs.name == "index.html"
    validations = list((res.data_docs.parent / "validations").rglob("*.html"))
    assert len(validations) == 1  # GX's own rendering of this validation
    assert "duplicate_sample_ids" in validations[0].read_text()
    prof = read_profiles(catalog, settings.namespace, LAST, LAST + timedelta(days=1))
    assert prof[LAST].rows == 4000
    # idempotent: re-running replaces rather than appends
    run_gate(settings, spec=SPEC, day=LAST, window=None, snapshot_id=snap, run_id="run-good", config=FAST)
    assert read_results(catalog, settings.namespace, "run-good").num_rows == len(res.results)


@pytest.mark.parametrize("fault,plant,expectation,observed", FAULTS, ids=[f[0] for f in FAULTS])
def test_planted_fault_fails_naming_expectation_and_value(
    settings: Settings, fault: str, plant: Callable[[pa.Table], pa.Table], expectation: str, observed: str
) -> None:
    snap = _setup(settings, plant(_last()))
    with pytest.raises(QualityGateFailed) as exc:
        run_gate(settings, spec=SPEC, day=LAST, window=None, snapshot_id=snap, run_id=f"run-{fault}", config=FAST)
    msg = str(exc.value)
    line = next((ln for ln in msg.splitlines() if ln.strip().startswith(expectation + " ")), None)
    assert line is not None, msg
    assert observed in line, line
    # the failure was persisted before raising
    stored = read_results(get_catalog(settings), settings.namespace, f"run-{fault}").to_pylist()
    row = next(r for r in stored if r["expectation"] == expectation)
    assert row["success"] is False and row["severity"] == "critical"


def test_event_time_outside_day_is_caught(settings: Settings) -> None:
    # A file that sits in the day's partition but holds a row of the next day (a bad add_files).
    snap = _setup(settings)
    import pyarrow.parquet as pq

    from slipstream.lake.iceberg import samples_table

    table = samples_table(get_catalog(settings), settings.namespace)
    task = next(x for x in table.scan(snapshot_id=snap).plan_files() if x.file.partition[0] == (LAST - date(1970, 1, 1)).days)
    path = task.file.file_path.removeprefix("file://")
    data = pq.read_table(path)
    ts = pc.cast(data.column("event_time"), pa.int64()).to_numpy().copy()
    ts[0] += 86_400_000_000
    pq.write_table(replace_column(data, "event_time", pa.array(ts, pa.timestamp("us", tz="UTC"))), path)
    with pytest.raises(QualityGateFailed, match=r"event_time.in_interval \[critical\]: observed 1 "):
        run_gate(settings, spec=SPEC, day=LAST, window=None, snapshot_id=snap, run_id="run-late", config=FAST)


def test_ctr_bound_as_warning_lets_training_go_on(settings: Settings) -> None:
    snap = _setup(settings, _ctr_collapse(_last()))
    res = run_gate(settings, spec=SPEC, day=LAST, window=None, snapshot_id=snap, run_id="r",
                   config=GateConfig(severity={"ctr": "warning"}, data_docs=False))
    assert res.passed
    assert [w.name for w in res.warnings] == ["ctr"]
    assert res.warnings[0].observed == "0"


def _drifted(t: pa.Table) -> pa.Table:
    x = np.clip(t.column("price_log").to_numpy() * 1.5, 0, 1)
    return replace_column(t, "price_log", x)


def test_drifted_feature_warns(settings: Settings) -> None:
    snap = _setup(settings, _drifted(_last()), with_profiles=True)
    res = run_gate(settings, spec=SPEC, day=LAST, window=None, snapshot_id=snap, run_id="r", config=FAST)
    assert res.passed
    assert [w.name for w in res.warnings] == ["drift.price_log"]
    shift = next(s for s in res.drift if s.feature == "price_log")
    assert shift.score > 0.2 and shift.method == "psi"
    assert all(s.score < 0.05 for s in res.drift if s.feature != "price_log")


def test_drift_configured_critical_fails(settings: Settings) -> None:
    snap = _setup(settings, _drifted(_last()), with_profiles=True)
    with pytest.raises(QualityGateFailed, match=r"drift.price_log \[critical\]: observed \d"):
        run_gate(settings, spec=SPEC, day=LAST, window=None, snapshot_id=snap, run_id="r",
                 config=GateConfig(severity={"drift.": "critical"}, data_docs=False))


def test_window_mode_and_snapshot_pinning(settings: Settings) -> None:
    snap = _setup(settings)
    start = datetime(day_of(1).year, day_of(1).month, day_of(1).day, tzinfo=UTC)
    window = (start, start + timedelta(days=DAYS - 1))
    res = run_gate(settings, spec=SPEC, day=None, window=window, snapshot_id=snap, run_id="w", config=FAST)
    assert res.passed and res.rows == 4000 * (DAYS - 1)
    assert res.scope.startswith("window:")
    # a bad commit after the pin does not change what the pinned gate sees
    from slipstream.lake.iceberg import samples_table

    samples_table(get_catalog(settings), settings.namespace).append(_duplicates(_last()).slice(4000))
    again = run_gate(settings, spec=SPEC, day=None, window=window, snapshot_id=snap, run_id="w", config=FAST)
    assert again.passed and again.rows == res.rows


def test_bad_arguments_are_named(settings: Settings) -> None:
    snap = _setup(settings)
    with pytest.raises(ConfigError, match="exactly one of day"):
        run_gate(settings, spec=SPEC, day=LAST, window=(datetime.now(UTC),) * 2, snapshot_id=snap, run_id="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="snapshot 123 does not exist"):
        run_gate(settings, spec=SPEC, day=LAST, window=None, snapshot_id=123, run_id="x", config=FAST)


def test_empty_day_fails_with_one_clear_expectation(settings: Settings) -> None:
    snap = _setup(settings)
    with pytest.raises(QualityGateFailed) as exc:
        run_gate(settings, spec=SPEC, day=day_of(DAYS + 3), window=None, snapshot_id=snap, run_id="empty", config=FAST)
    assert "1 critical expectation(s) failed" in str(exc.value)
    assert "rows.nonempty [critical]: observed 0" in str(exc.value)


def test_schema_problems_name_column_and_types() -> None:
    from slipstream.quality.metrics import schema_problems
    from slipstream.samples.schema import ARROW_SCHEMA

    assert schema_problems(ARROW_SCHEMA, SPEC) == []
    bad = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("label"))
    bad = bad.set(bad.get_field_index("price_log"), pa.field("price_log", pa.float64()))
    assert schema_problems(bad, SPEC) == ["price_log: double (expected float)", "label: missing"]


def test_aggregates_from_profile_match_row_level_counts() -> None:
    # compute_aggregates skips the label and event_time row passes when the profile's exact
    # min/max already bound them; planted bad rows must still be counted exactly.
    from slipstream.quality.metrics import compute_aggregates

    start = datetime(LAST.year, LAST.month, LAST.day, tzinfo=UTC)
    end = start + timedelta(days=1)
    good = _last()
    agg = compute_aggregates(good, profile_table(good, SPEC), start, end, SPEC)
    assert agg.values["label_not_binary"] == 0 and agg.values["events_outside_interval"] == 0

    lab = good.column("label").to_numpy().copy()
    lab[:3] = 2
    ts = pc.cast(good.column("event_time"), pa.int64()).to_numpy().copy()
    ts[5] = int((start - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1_000_000 - 1  # the day before's last µs
    ts[6] = int((end - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1_000_000  # end is exclusive
    bad = replace_column(replace_column(good, "label", pa.array(lab, pa.int32())), "event_time",
                         pa.array(ts, pa.timestamp("us", tz="UTC")))
    agg = compute_aggregates(bad, profile_table(bad, SPEC), start, end, SPEC)
    assert agg.values["label_not_binary"] == 3
    assert agg.values["events_outside_interval"] == 2
