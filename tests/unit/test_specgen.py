"""The generator for any spec: the raw zone's exact layout, data the preprocessing job would read
back into the truth's samples, a best AUC that is measurable, empty days and bad lines."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq
import pytest

from slipstream.dev.datagen import write_manifest
from slipstream.dev.spec_bad_lines import KINDS
from slipstream.dev.specgen import SpecGenConfig, featurize, generate_spec
from slipstream.samples.schema import sample_arrow_schema, source_arrow_schema
from slipstream.samples.spec import SAMPLE_ID, Spec, load_spec
from slipstream.samples.transform import sample_ids

START = date(2026, 11, 1)
EMPTY = date(2026, 11, 2)


def _cfg(**kw: object) -> SpecGenConfig:
    base: dict[str, object] = dict(start_day=START, days=3, events_per_day=3000, stream_minutes=240, seed=11)
    base.update(kw)
    return SpecGenConfig(**base)  # type: ignore[arg-type]


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


_PY_TYPES = {"string": str, "timestamp": str, "long": int, "int": int, "double": (int, float), "boolean": bool,
             "list<string>": list, "list<long>": list}


def _good_line(line: str, src: Any, path: Path) -> bool:
    """Whether a raw line is a record the job must accept: JSON, required fields present, each
    value of its field's type, no NaN, its time in the file's day and hour folder."""
    try:
        rec = json.loads(line)
    except ValueError:
        return False
    if not all(f in rec for f in src.required):
        return False
    for f in src.fields:
        v = rec.get(f.name)
        if v is not None and (not isinstance(v, _PY_TYPES[f.type]) or (f.type in ("long", "int") and isinstance(v, bool))
                              or (isinstance(v, float) and v != v)):
            return False
    ts = datetime.fromisoformat(rec[src.time])
    return path.parent.parent.name == f"day={ts.date()}" and path.parent.name == f"hour={ts.hour:02d}"


def _read_jsonl(path: Path, spec: Spec, source: str) -> tuple[pa.Table, list[str]]:
    """The good lines of a raw file as the source's Arrow schema, and the bad ones as text."""
    src = spec.source(source)
    lines = gzip.open(path).read().decode().splitlines()
    good = [ln for ln in lines if _good_line(ln, src, path)]
    table = pj.read_json(pa.py_buffer("\n".join(good).encode()), parse_options=pj.ParseOptions(
        explicit_schema=source_arrow_schema(src), unexpected_field_behavior="error")) if good else source_arrow_schema(src).empty_table()
    kept = set(good)
    return table, [ln for ln in lines if ln not in kept]


@pytest.mark.parametrize("name", ["criteo", "ratings"])
def test_writes_exactly_the_raw_zone_layout_and_the_job_reads_back_the_truth(name: str, tmp_path: Path) -> None:
    spec = load_spec(name)
    data = generate_spec(spec, _cfg(empty_days=(EMPTY,), bad_fraction=0.02), tmp_path)
    ev = spec.events.name
    files = _files(tmp_path)
    tables = {t.name for t in spec.tables}
    assert [f for f in files if f.split("/")[0] in tables] == sorted(f"{t}/part-0.parquet" for t in tables)
    timed = [f for f in files if f.split("/")[0] not in tables]
    assert timed and all(f.startswith(f"{ev}/day=2026-11-0") and f.endswith(".jsonl.gz") for f in timed)
    assert all(len(f.split("/")) == 4 and f.split("/")[2].startswith("hour=") for f in timed)
    assert {f.split("/")[1] for f in timed} == {"day=2026-11-01", "day=2026-11-03"}  # the empty day: no folder
    assert not (tmp_path / ev / f"day={EMPTY}").exists()

    parts = [_read_jsonl(tmp_path / f, spec, ev) for f in timed]
    raw = pa.concat_tables([p[0] for p in parts])
    bad = [line for p in parts for line in p[1]]
    assert raw.num_rows == 6000 and data.raw_rows_per_day == {"2026-11-01": 3000, "2026-11-02": 0, "2026-11-03": 3000}
    assert SAMPLE_ID not in raw.column_names  # a hashed-id spec's files carry no id
    assert len(bad) == sum(data.extra["bad_lines"].values()) > 0  # type: ignore[union-attr, arg-type]
    assert set(data.extra["bad_lines"]) == set(KINDS)  # type: ignore[arg-type]
    optional = [f.name for f in spec.events.fields if f.optional]
    assert all(raw.column(n).null_count for n in optional)  # some optional values left out

    side = {t: pq.read_table(tmp_path / t / "part-0.parquet") for t in tables}
    samples, _ = featurize(spec, side, raw.append_column(SAMPLE_ID, sample_ids(spec, raw)))
    truth = data.truth.filter(pc.invert(data.truth.column("after_t")))
    pos = pc.index_in(samples.column(SAMPLE_ID), value_set=truth.column(SAMPLE_ID))
    assert pos.null_count == 0 and len(truth) == samples.num_rows  # every raw record is one truth row
    assert samples.column("label").equals(truth.column("label").take(pos))


@pytest.mark.parametrize("name", ["criteo", "ratings"])
def test_best_auc_is_measurable_and_the_stream_is_featurized_samples(name: str, tmp_path: Path) -> None:
    spec = load_spec(name)
    data = generate_spec(spec, _cfg(events_per_day=20_000), tmp_path)
    for k in ("holdout_before_t", "holdout_after_t"):
        assert 0.65 < data.best_auc[k] < 0.95, data.best_auc
    stream = data.stream
    assert stream.schema == sample_arrow_schema(spec)
    t_us = int(datetime(2026, 11, 4, tzinfo=UTC).timestamp() * 1e6)
    ts = pc.cast(stream.column("event_time"), pa.int64()).to_numpy()
    assert ts.min() >= t_us - 600 * 1_000_000 and (ts >= t_us).sum() == data.truth.column("after_t").to_numpy().sum()
    pos = pc.index_in(stream.column(SAMPLE_ID), value_set=data.truth.column(SAMPLE_ID))
    assert pos.null_count == 0 and stream.column("label").equals(data.truth.column("label").take(pos))
    rate = data.extra["label_rate"]
    assert 0.15 < rate < 0.6  # type: ignore[operator]
    manifest = write_manifest(data, tmp_path / "gen" / "manifest.json")
    assert json.loads((tmp_path / "gen" / "manifest.json").read_text())["best_auc"] == data.best_auc
    assert manifest["spec"]["name"] == name  # type: ignore[index]


def test_the_same_seed_writes_the_same_data(tmp_path: Path) -> None:
    spec = load_spec("ratings")
    a = generate_spec(spec, _cfg(bad_fraction=0.01), tmp_path / "a")
    b = generate_spec(spec, _cfg(bad_fraction=0.01), tmp_path / "b")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    for f in _files(tmp_path / "a"):
        x, y = (tmp_path / "a" / f), (tmp_path / "b" / f)
        assert (gzip.open(x).read() == gzip.open(y).read()) if f.endswith(".gz") else pq.read_table(x).equals(pq.read_table(y))
    assert a.truth.equals(b.truth) and a.stream.equals(b.stream)
    c = generate_spec(spec, _cfg(seed=12), tmp_path / "c")
    assert not c.truth.column("p_true").equals(a.truth.column("p_true"))


def test_parquet_files_are_typed_and_hold_only_the_bad_rows_a_typed_file_can(tmp_path: Path) -> None:
    spec = load_spec("ratings")
    data = generate_spec(spec, _cfg(fmt="parquet", bad_fraction=0.02, days=1), tmp_path)
    files = sorted((tmp_path / "ratings").rglob("*.parquet"))
    assert files and all(pq.read_schema(f) == source_arrow_schema(spec.events) for f in files)
    t = pa.concat_tables([pq.read_table(f) for f in files])
    assert all(t.column(n).null_count == 0 for n in spec.events.required)
    kinds = data.extra["bad_lines"]
    assert set(kinds) == {"outside_day", "nan"} and t.num_rows == 3000 + sum(kinds.values())  # type: ignore[union-attr, arg-type]
    assert pc.sum(pc.is_nan(t.column("rating"))).as_py() == kinds["nan"]  # type: ignore[index]


def test_click_labels_come_from_clicks_in_their_own_hour_some_beyond_the_window(tmp_path: Path) -> None:
    spec = load_spec("synthetic")  # a click_within spec, generated the generic way
    data = generate_spec(spec, _cfg(days=2, empty_days=(EMPTY,)), tmp_path)
    clicks, _ = zip(*[_read_jsonl(f, spec, "clicks") for f in sorted((tmp_path / "clicks").rglob("*.jsonl.gz"))])
    c = pa.concat_tables(clicks)
    assert not (tmp_path / "clicks" / f"day={EMPTY}").exists()  # clicks that would land on the empty day are not logged
    imps = pa.concat_tables([_read_jsonl(f, spec, "impressions")[0] for f in sorted((tmp_path / "impressions").rglob("*.gz"))])
    when = dict(zip(imps.column("impression_id").to_pylist(), pc.cast(imps.column("ts"), pa.int64()).to_pylist()))
    delay = Counter()
    for i, t in zip(c.column("impression_id").to_pylist(), pc.cast(c.column("ts"), pa.int64()).to_pylist()):
        if i in when:
            delay["within" if 0 <= t - when[i] <= 1800 * 1_000_000 else "beyond"] += 1
    truth = data.truth.filter(pc.invert(data.truth.column("after_t")))
    assert delay["beyond"] > 0 and delay["within"] == pc.sum(truth.column("label")).as_py()
    assert 0.05 < np.mean(truth.column("label").to_numpy()) < 0.15


def test_config_errors_name_the_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty days 2026-12-01 are outside"):
        _cfg(empty_days=(date(2026, 12, 1),))
    with pytest.raises(ValueError, match="bad_fraction"):
        _cfg(bad_fraction=1.5)


def test_generate_command_for_a_spec_writes_the_raw_zone_and_the_manifest(settings: object, capsys: pytest.CaptureFixture[str]) -> None:
    from slipstream.cli import main

    rc = main(["generate", "--spec", "criteo", "--days", "2", "--events-per-day", "500", "--empty-day", "2026-11-02",
               "--bad-fraction", "0.05", "--no-stream"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    home = Path(settings.home)  # type: ignore[attr-defined]
    assert out["spec"]["name"] == "criteo" and out["raw_rows_per_day"] == {"2026-11-01": 500, "2026-11-02": 0}
    assert json.loads((home / "generator" / "manifest.json").read_text())["best_auc"] == out["best_auc"]
    # the data set's own raw zone (<raw root>/<data set>), not the default data set's
    assert sorted(p.name for p in (home / "raw" / "criteo" / "displays").iterdir()) == ["day=2026-11-01"]
    assert not (home / "raw" / "synthetic").exists()


def test_generate_affinity_reaches_the_ratings_world_and_is_refused_for_the_synthetic_spec(
        settings: object, capsys: pytest.CaptureFixture[str]) -> None:
    from slipstream.cli import main

    args = ["generate", "--spec", "ratings", "--days", "2", "--events-per-day", "3000", "--no-stream", "--seed", "5"]
    assert main([*args, "--affinity", "0"]) == 0
    additive = json.loads(capsys.readouterr().out)["best_auc"]["holdout_before_t"]
    assert main([*args, "--affinity", "1.5"]) == 0
    tastes = json.loads(capsys.readouterr().out)["best_auc"]["holdout_before_t"]
    assert tastes > additive + 0.02, (tastes, additive)
    assert main(["generate", "--spec", "synthetic", "--days", "1", "--no-stream", "--affinity", "1"]) == 2
    assert "--affinity are for the generic generator" in capsys.readouterr().err


SHOP = """\
spec_version: 1
name: shop
version: 1
sources:
  views:
    kind: events
    id: view_id
    time: at
    fields:
      view_id: {type: string}
      at: {type: timestamp}
      shopper: {type: string}
      sku: {type: long}
      tags: {type: list<string>, optional: true}
      basket: {type: double, optional: true, default: 0}
      bought: {type: boolean}
  skus:
    kind: table
    key: sku
    fields:
      sku: {type: long}
      brand: {type: string, optional: true, default: none}
label:
  column: {field: bought}
features:
  shopper: {kind: id, field: shopper, buckets: 5003}
  sku: {kind: id, field: sku, buckets: 1009}
  tags: {kind: list, field: tags, buckets: 101}
  basket: {kind: dense, field: basket, log1p: true}
  brand: {kind: categorical, field: skus.brand, buckets: 211}
  recent: {kind: sequence, field: sku, per: shopper, length: 5, shares: sku}
"""


def test_a_users_own_spec_generates_and_imports_back_to_the_same_samples(tmp_path: Path) -> None:
    from slipstream.lake.importer import ImportOptions, import_files
    from slipstream.samples.spec import parse_spec_text

    spec = parse_spec_text(SHOP, "shop.yaml")
    data = generate_spec(spec, _cfg(days=2, events_per_day=4000), tmp_path / "gen")
    assert 0.6 < data.best_auc["holdout_before_t"] < 0.95
    files = sorted((tmp_path / "gen" / "views").rglob("*.jsonl.gz"))
    raw = tmp_path / "imported"
    views = import_files(spec, files, ImportOptions(raw_dir=raw, source="views")).sources["views"]
    import_files(spec, [tmp_path / "gen" / "skus" / "part-0.parquet"], ImportOptions(raw_dir=raw, source="skus"))
    assert (views.records, views.imported, views.rejected) == (8000, 8000, 0)
    events = pq.read_table(raw / "views", schema=source_arrow_schema(spec.events))
    samples, _ = featurize(spec, {"skus": pq.read_table(raw / "skus")}, events.append_column(SAMPLE_ID, sample_ids(spec, events)))
    truth = data.truth.filter(pc.invert(data.truth.column("after_t")))
    pos = pc.index_in(samples.column(SAMPLE_ID), value_set=truth.column(SAMPLE_ID))
    assert pos.null_count == 0 and samples.column("label").equals(truth.column("label").take(pos))
    assert pc.sum(pc.list_value_length(samples.column("recent"))).as_py() > 0


def test_a_user_item_affinity_is_what_a_recommender_can_learn_beyond_the_logistic_baseline(tmp_path: Path) -> None:
    """Ratings name a user and an item: the hidden model gets a latent user-item affinity (who likes
    what), which lifts the best achievable AUC above the additive part's; without it (affinity 0,
    or a spec naming no user and item) the world is additive, and the rest of it is the same."""
    from slipstream.dev.spec_world import build_world

    spec = load_spec("ratings")
    plain = build_world(spec, seed=3, users=300, items=200, max_vocab=100, affinity=0.0)
    tastes = build_world(spec, seed=3, users=300, items=200, max_vocab=100, affinity=1.0)
    assert plain.affinity is None and tastes.affinity is not None
    assert (tastes.affinity.user, tastes.affinity.item) == ("user_id", "item_id")
    assert all(np.array_equal(plain.sparse[k].effects, tastes.sparse[k].effects) for k in plain.sparse)
    assert build_world(load_spec("criteo"), seed=3, users=300, items=200, max_vocab=100, affinity=1.0).affinity is None

    kw = dict(days=4, events_per_day=4000, stream_minutes=60, missing=False)
    additive = generate_spec(spec, _cfg(affinity=0.0, **kw), tmp_path / "additive").best_auc["holdout_before_t"]
    liked = generate_spec(spec, _cfg(affinity=1.0, **kw), tmp_path / "affinity").best_auc["holdout_before_t"]
    assert liked > additive + 0.02, (liked, additive)
    with pytest.raises(Exception, match="affinity must be >= 0"):
        _cfg(affinity=-1.0)
