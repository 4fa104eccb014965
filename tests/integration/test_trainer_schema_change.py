"""A spec gains a feature mid-window: the table evolves (older snapshots' rows read the new column
as null) and the trainer trains across the change, the old days taking the feature's default."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.pipeline.run_metrics import parse_run_metrics
from slipstream.samples.schema import sample_arrow_schema
from slipstream.samples.spec import load_spec, resolve_spec_path
from slipstream.settings import Settings
from slipstream.stream.kafka import create_topic
from tests.trainer_fixtures import START_DAY, SamplesFixture, train_config, training_ids

pytestmark = pytest.mark.integration


def _spec_files(tmp_path: Path) -> tuple[Path, Path]:
    """v1: the synthetic spec without `country_hash`; v2: the synthetic spec (it has it). Both are
    versions of one data set's spec file (`shop.yaml`: one name, one namespace and topic)."""
    text = resolve_spec_path("synthetic").read_text()
    v1 = "\n".join(line for line in text.splitlines() if not line.strip().startswith("country_hash:"))
    v1 = v1.replace("max_distinct: {device_hash: 64, country_hash: 300,", "max_distinct: {device_hash: 64,")
    paths = tmp_path / "v1" / "shop.yaml", tmp_path / "v2" / "shop.yaml"
    for p in paths:
        p.parent.mkdir()
    paths[0].write_text(v1)
    paths[1].write_text(text.replace("\nversion: 1\n", "\nversion: 2\n"))
    return paths


def test_a_feature_added_mid_window_trains_across_the_schema_change(tmp_path: Path, kafka_bootstrap: str) -> None:
    from trainers.config.schema import resolve
    from trainers.train import run

    v1_path, v2_path = _spec_files(tmp_path)
    v1, v2 = load_spec(str(v1_path)), load_spec(str(v2_path))
    assert "country_hash" not in [f.name for f in v1.features] and "country_hash" in [f.name for f in v2.features]
    gen = GeneratorConfig(start_day=START_DAY, days=3, impressions_per_day=8_000, seed=5)
    days = reference_samples(gen)
    home = tmp_path / "home"
    catalog = get_catalog(Settings(home=home))
    namespace = Settings(home=home, spec=str(v2_path)).namespace  # the data set's: slipstream_shop
    first_day, *later = sorted(days)
    old = samples_table(catalog, namespace, v1)  # the table as spec v1 made it: no country_hash
    old.append(days[first_day].select(sample_arrow_schema(v1).names))
    table = samples_table(catalog, namespace, v2)  # spec v2 evolves it
    for day in later:
        table.append(days[day].select(sample_arrow_schema(v2).names))
    table = catalog.load_table(table.name())
    columns = [f.name for f in table.schema().fields]
    assert sorted(columns) == sorted(sample_arrow_schema(v2).names) and columns[-1] == "country_hash"  # added last
    assert table.scan().to_arrow()["country_hash"].null_count == days[first_day].num_rows

    settings = Settings(home=home, spec=str(v2_path))
    snap = table.current_snapshot()
    assert snap is not None
    fx = SamplesFixture(settings, table, snap.snapshot_id, gen, days)
    topic = f"samples-evolve-{tmp_path.name}"
    create_topic(kafka_bootstrap, topic, 1)
    raw = train_config(fx, run_id="evolve", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=f"{topic}.dlq",
                       window_days=3, data={"epochs": 2, "batch_size": 512})
    s = run(resolve(raw, settings), settings)

    # both epochs read every training row of both schema versions; the model learned from them
    expected = len(training_ids(fx, window_days=3))
    assert s["samples_iceberg"] == 2 * expected, (s["samples_iceberg"], expected)
    before = parse_run_metrics(s).evaluation.holdout_before_t
    assert before is not None and before.model is not None and (before.model.auc or 0) > 0.55, before
    config = (Path(settings.runs_dir) / "evolve" / "config.json").read_text()
    assert v2.digest in config  # the run trained on spec v2, old rows and all
    assert pa.types.is_integer(table.schema().as_arrow().field("country_hash").type)
