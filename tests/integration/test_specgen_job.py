"""The raw zone that the generator and `slipstream import` write is what the preprocessing job
reads (real Spark local, a SQLite Iceberg catalog): every generated record becomes the truth's
sample with the truth's label, every bad line is rejected, an empty day is skipped; the imported
hand-written ratings files become one sample per good row."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from slipstream.dev.specgen import SpecGenConfig, generate_spec
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings
from spark_jobs.day_job import DayOptions, preprocess_day

pytestmark = pytest.mark.integration

DAY, EMPTY = date(2026, 11, 1), date(2026, 11, 2)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from spark_jobs.preprocess import start_spark

    session = start_spark(SparkSettings(shuffle_partitions=2), "test-specgen-job")
    yield session
    session.stop()


@pytest.mark.parametrize("name, fmt", [("criteo", "jsonl"), ("ratings", "parquet")])
def test_the_job_turns_generated_raw_data_into_the_truths_samples(spark: Any, tmp_path: Path, name: str, fmt: str) -> None:
    settings = Settings(home=tmp_path / "home")
    spec = load_spec(name)
    data = generate_spec(spec, SpecGenConfig(start_day=DAY, days=2, events_per_day=2000, fmt=fmt, bad_fraction=0.02,
                                             empty_days=(EMPTY,)), settings.raw_dir)
    results = {}
    for day in (DAY, EMPTY):
        opts = DayOptions(spec=spec, raw_dir=settings.raw_dir, namespace=settings.namespace, run_id=f"gen-{day}",
                          max_reject_rate=0.3, target_bytes=64 << 20)
        results[day] = preprocess_day(spark, get_catalog(settings), opts, day)
    bad = sum(data.extra["bad_lines"].values())  # type: ignore[union-attr]
    assert (results[DAY].rows, results[DAY].rejects) == (2000, bad) and bad > 0
    assert results[EMPTY].rows == 0  # skipped, not a failure
    samples = samples_table(get_catalog(settings), settings.namespace, spec).scan().to_arrow()
    truth = data.truth.filter(pc.invert(data.truth.column("after_t")))
    pos = pc.index_in(samples.column("sample_id"), value_set=truth.column("sample_id"))
    assert samples.num_rows == truth.num_rows and pos.null_count == 0
    assert samples.column("label").equals(truth.column("label").take(pos))


def test_the_job_reads_what_slipstream_import_wrote(spark: Any, tmp_path: Path) -> None:
    from slipstream.lake.importer import ImportOptions, import_files

    settings = Settings(home=tmp_path / "home")
    spec = load_spec("ratings")
    d = Path(__file__).resolve().parents[1] / "data" / "import" / "ratings"
    import_files(spec, [d / "ratings.csv", d / "users.csv", d / "items.csv"], ImportOptions(raw_dir=Path(settings.raw_dir)))
    rows = {}
    for day in (date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3), date(2026, 11, 4)):
        opts = DayOptions(spec=spec, raw_dir=settings.raw_dir, namespace=settings.namespace, run_id=f"imp-{day}",
                          max_reject_rate=0.3, target_bytes=64 << 20)
        res = preprocess_day(spark, get_catalog(settings), opts, day)
        rows[str(day)] = (res.rows, res.rejects)
    assert rows == {"2026-11-01": (3, 0), "2026-11-02": (2, 0), "2026-11-03": (0, 0), "2026-11-04": (2, 0)}
    samples = samples_table(get_catalog(settings), settings.namespace, spec).scan().to_arrow()
    assert sorted(samples.column("label").to_pylist()) == [0, 0, 0, 1, 1, 1, 1]  # rating >= 4: 5, 4, 4.5, 5
