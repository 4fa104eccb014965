"""`commit_day_overwrite` on a real SQLite catalog: replace a day, race a concurrent writer."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.errors import ConfigError
from slipstream.lake.iceberg import commit_day_overwrite, day_predicate, samples_table
from slipstream.samples.schema import NAMESPACE
from tests.preprocess_fixtures import content_checksum, day_rows

CFG = GeneratorConfig(start_day=date(2026, 11, 1), days=2, impressions_per_day=400, users=50, items=30)
D1, D2 = date(2026, 11, 1), date(2026, 11, 2)


@pytest.fixture(scope="module")
def days() -> dict[date, pa.Table]:
    return {date.fromisoformat(k): v for k, v in reference_samples(CFG).items()}


def _files(table, tag: str, rows: pa.Table, day: date, parts: int = 2) -> list[str]:  # type: ignore[no-untyped-def]
    folder = Path(table.location().removeprefix("file://")) / "data" / f"event_time_day={day}"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    step = -(-rows.num_rows // parts)
    for i in range(parts):
        path = folder / f"{tag}-{i}.parquet"
        pq.write_table(rows.slice(i * step, step), path)
        out.append(str(path))
    return out


def test_rerun_replaces_the_day_and_keeps_the_others(catalog, days) -> None:  # type: ignore[no-untyped-def]
    table = samples_table(catalog, NAMESPACE)
    commit_day_overwrite(table, D1, _files(table, "a", days[D1], D1), snapshot_properties={"run_id": "a"})
    commit_day_overwrite(table, D2, _files(table, "a", days[D2], D2))
    d2_sum = content_checksum(day_rows(table, D2))
    snap = commit_day_overwrite(table, D1, _files(table, "b", days[D1], D1), snapshot_properties={"run_id": "b"})
    table.refresh()
    rows = day_rows(table, D1)
    assert rows.num_rows == days[D1].num_rows
    assert len(set(rows["sample_id"].to_pylist())) == rows.num_rows
    assert content_checksum(rows) == content_checksum(days[D1])
    assert content_checksum(day_rows(table, D2)) == d2_sum
    assert table.current_snapshot().snapshot_id == snap
    assert table.current_snapshot().summary.additional_properties["run_id"] == "b"
    live = {f.file.file_path for f in table.scan().plan_files()}
    assert not any("/a-" in p and "2026-11-01" in p for p in live)


def test_concurrent_writer_of_the_same_day_retries_on_the_new_base(catalog, days) -> None:  # type: ignore[no-untyped-def]
    """Two runs load the table at the same base; the second commit conflicts, retries on the
    refreshed table and wins: the day holds exactly one run's rows, never both."""
    first = samples_table(catalog, NAMESPACE)
    second = catalog.load_table(f"{NAMESPACE}.samples")
    files_a, files_b = _files(first, "run1", days[D1], D1), _files(first, "run2", days[D1], D1)
    base = second.metadata.current_snapshot_id
    commit_day_overwrite(first, D1, files_a, snapshot_properties={"run_id": "run1"})
    assert second.metadata.current_snapshot_id == base  # stale: its commit must conflict first
    commit_day_overwrite(second, D1, files_b, snapshot_properties={"run_id": "run2"})
    final = catalog.load_table(f"{NAMESPACE}.samples")
    rows = day_rows(final, D1)
    assert rows.num_rows == days[D1].num_rows
    live = {f.file.file_path for f in final.scan().plan_files()}
    assert len(live) == len(files_b) and all("/run2-" in p for p in live)
    assert final.current_snapshot().summary.additional_properties["run_id"] == "run2"


def test_a_file_of_another_day_is_refused_before_any_commit(catalog, days) -> None:  # type: ignore[no-untyped-def]
    table = samples_table(catalog, NAMESPACE)
    both = pa.concat_tables([days[D1].slice(0, 10), days[D2].slice(0, 10)])
    with pytest.raises(ConfigError, match="must contain exactly that day's rows"):
        commit_day_overwrite(table, D1, _files(table, "mixed", both, D1, parts=1))
    assert table.current_snapshot() is None


def test_a_reader_at_any_snapshot_sees_a_re_run_day_whole(catalog, days) -> None:  # type: ignore[no-untyped-def]
    """A re-run of a day is ONE overwrite snapshot: a time-travel reader pinned to any snapshot sees
    the day with the old run's rows or the new run's, never without it (issue 23, item 10)."""
    table = samples_table(catalog, NAMESPACE)
    commit_day_overwrite(table, D1, _files(table, "a", days[D1], D1))
    commit_day_overwrite(table, D2, _files(table, "a", days[D2], D2))
    commit_day_overwrite(table, D1, _files(table, "b", days[D1].slice(0, 100), D1))  # the re-run
    table.refresh()
    snapshots = table.snapshots()
    assert len(snapshots) == 3
    assert snapshots[-1].summary.operation.value == "overwrite"
    seen = []
    for snap in snapshots:
        n = table.scan(row_filter=day_predicate(table, D1), snapshot_id=snap.snapshot_id).to_arrow().num_rows
        seen.append(n)
    assert seen == [days[D1].num_rows, days[D1].num_rows, 100]


def test_a_range_commit_replaces_its_days_in_one_snapshot_and_leaves_the_others(catalog, days) -> None:  # type: ignore[no-untyped-def]
    """Days 1 and 2 replaced together: one new snapshot; the snapshot before still shows both old
    days whole (a reader never sees one day new and the other old), a third day is untouched."""
    from slipstream.lake.iceberg import commit_days_overwrite

    table = samples_table(catalog, NAMESPACE)
    d3 = date(2026, 11, 3)
    shifted = days[D2].set_column(1, "event_time", pa.compute.add(days[D2].column("event_time"), pa.scalar(86_400_000_000, pa.duration("us"))))
    commit_days_overwrite(table, {D1: _files(table, "a", days[D1], D1), D2: _files(table, "a", days[D2], D2),
                                  d3: _files(table, "a", shifted, d3)})
    before = table.current_snapshot().snapshot_id
    d3_sum = content_checksum(day_rows(table, d3))
    snap = commit_days_overwrite(table, {D1: _files(table, "b", days[D1], D1, parts=1), D2: []},
                                 snapshot_properties={"run_id": "b"})
    table.refresh()
    assert [s.snapshot_id for s in table.snapshots()][-2:] == [before, snap]
    assert day_rows(table, D2).num_rows == 0  # a day with no files is emptied
    assert content_checksum(day_rows(table, D1)) == content_checksum(days[D1])
    assert content_checksum(day_rows(table, d3)) == d3_sum
    live = {f.file.file_path for f in table.scan().plan_files()}
    assert not any("/a-" in p and "event_time_day=2026-11-0" + n in p for p in live for n in "12")
    old = table.scan(snapshot_id=before).to_arrow()
    assert old.num_rows == days[D1].num_rows + days[D2].num_rows + shifted.num_rows


def test_a_range_commit_refuses_a_file_of_a_day_it_does_not_name(catalog, days) -> None:  # type: ignore[no-untyped-def]
    from slipstream.lake.iceberg import commit_days_overwrite

    table = samples_table(catalog, NAMESPACE)
    with pytest.raises(ConfigError, match="not 2026-11-01"):
        commit_days_overwrite(table, {D1: _files(table, "x", days[D2], D2)})
    assert table.current_snapshot() is None
