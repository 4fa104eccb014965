"""Data sets side by side: DAG ids per spec file, and a spec that does not match its table or raw
zone refused in the error's first line (a real SQLite Iceberg catalog)."""

from __future__ import annotations

import shutil
from datetime import UTC
from pathlib import Path

import pytest

from slipstream.errors import DatasetMismatch
from slipstream.pipeline.datasets import DATASET_PROPERTY, check_raw_zone, dataset_refs, open_dataset_table
from slipstream.samples.spec import SPECS_DIR, load_spec
from slipstream.settings import Settings


def test_one_set_of_dags_per_spec_file(tmp_path: Path) -> None:
    (single,) = dataset_refs({"SLIPSTREAM_SPEC": "criteo"})
    assert (single.name, single.dag_id("daily_retrain"), single.run_kind("daily")) == ("criteo", "daily_retrain", "daily")
    assert single.asset_uri("samples") == "slipstream://samples"
    for name in ("criteo", "ratings"):
        shutil.copy(SPECS_DIR / f"{name}.yaml", tmp_path / f"{name}.yaml")
    (tmp_path / "_draft.yaml").write_text("not a data set yet")
    (tmp_path / "notes.txt").write_text("ignored")
    refs = dataset_refs({"SLIPSTREAM_SPECS_DIR": str(tmp_path)})
    assert [r.dag_id("daily_retrain") for r in refs] == ["daily_retrain__criteo", "daily_retrain__ratings"]
    assert [r.run_kind("daily") for r in refs] == ["daily-criteo", "daily-ratings"]
    assert refs[1].asset_uri("samples") == "slipstream://samples/ratings" and refs[1].tag == "dataset:ratings"
    assert refs[0].settings(Settings(home=tmp_path / "home")).table == "slipstream_criteo.samples"
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetMismatch, match="holds no spec file"):
        dataset_refs({"SLIPSTREAM_SPECS_DIR": str(tmp_path / "empty")})


def test_a_table_of_another_data_set_is_refused_in_the_first_line(settings: Settings) -> None:
    """The bug this guards against: a second spec's run evolved the first one's table."""
    synthetic = settings
    table = open_dataset_table(synthetic, load_spec("synthetic"))
    assert table.properties[DATASET_PROPERTY] == "synthetic"
    # criteo pointed at synthetic's namespace by mistake
    criteo = synthetic.for_dataset("criteo", env={"SLIPSTREAM_DATASET__CRITEO__NAMESPACE": synthetic.namespace})
    with pytest.raises(DatasetMismatch) as e:
        open_dataset_table(criteo, load_spec("criteo"))
    first = str(e.value).splitlines()[0]
    assert first.startswith(f"spec criteo (data set criteo) does not match table {synthetic.table}: it holds data set "
                            "synthetic (spec synthetic v1 "), first
    assert "SLIPSTREAM_DATASET__CRITEO__NAMESPACE" in first
    columns = {f.name for f in table.refresh().schema().fields}
    assert not any(c.startswith("c1") for c in columns)  # nothing of criteo's was added to the table
    # its own namespace works, and stays its own
    own = open_dataset_table(synthetic.for_dataset("criteo", env={}), load_spec("criteo"))
    assert ".".join(own.name()) == "slipstream_criteo.samples" and own.properties[DATASET_PROPERTY] == "criteo"


def test_a_table_from_before_the_mark_is_judged_by_its_columns(settings: Settings) -> None:
    from slipstream.lake.iceberg import get_catalog, samples_table

    samples_table(get_catalog(settings), settings.namespace, load_spec("synthetic"))  # no data set mark
    ratings = settings.for_dataset("ratings", env={"SLIPSTREAM_DATASET__RATINGS__NAMESPACE": settings.namespace})
    with pytest.raises(DatasetMismatch, match=r"^spec ratings \(data set ratings\) does not match table "
                                              r"slipstream_synthetic.samples: it has 3 of the spec's 8 features "
                                              r"\(not age, gender, genres, "):
        open_dataset_table(ratings, load_spec("ratings"))
    assert open_dataset_table(settings, load_spec("synthetic")).properties[DATASET_PROPERTY] == "synthetic"


def test_a_raw_zone_of_another_data_set_is_refused(settings: Settings) -> None:
    raw = Path(settings.raw_dir)
    check_raw_zone(settings, load_spec("synthetic"))  # nothing landed yet: the sensor waits
    (raw / "impressions" / "day=2025-01-01").mkdir(parents=True)
    (raw / "clicks").mkdir()
    (raw / "_rejects").mkdir()
    check_raw_zone(settings, load_spec("synthetic"))
    ratings = settings.for_dataset("ratings", env={"SLIPSTREAM_DATASET__RATINGS__RAW_DIR": str(raw)})
    with pytest.raises(DatasetMismatch, match=r"^spec ratings \(data set ratings\) does not match the raw zone .*: it holds "
                                              r"clicks/, impressions/ but the spec reads items/, ratings/, users/; point "
                                              r"SLIPSTREAM_DATASET__RATINGS__RAW_DIR"):
        check_raw_zone(ratings, load_spec("ratings"))


def test_a_run_without_data_names_its_data_set_and_raw_zone(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh deployment whose raw files are elsewhere: the first task says which data set, spec,
    raw zone and days, instead of a "table has no snapshot yet" far down the run. (Spark is not the
    subject here: the day it would find empty is reported as such.)"""
    from datetime import datetime
    from types import SimpleNamespace

    from slipstream.errors import RawDataError
    from slipstream.pipeline import preprocess_launch
    from slipstream.pipeline.datasets import DatasetRef
    from slipstream.pipeline.preprocess_launch import PreprocessResult
    from slipstream_airflow import tasks

    monkeypatch.setattr(preprocess_launch, "run_preprocess_days",
                        lambda s, days, run_id: [PreprocessResult(d, None, 0, 0, 0.1, empty=True) for d in days])
    context = {"data_interval_start": datetime(2025, 1, 2, tzinfo=UTC),
               "data_interval_end": datetime(2025, 1, 3, tzinfo=UTC),
               "dag_run": SimpleNamespace(run_id="manual__x"), "dag": SimpleNamespace(dag_id="daily_retrain")}
    with pytest.raises(RawDataError) as e:
        tasks.preprocess_window.__wrapped__(context, {"window_days": 2}, DatasetRef("synthetic", "synthetic"))
    assert str(e.value).startswith(f"data set synthetic (spec synthetic) has no samples in the window ending 2025-01-03: "
                                   f"its raw zone {settings.raw_dir} holds no file of 2025-01-01, 2025-01-02"), str(e.value)
