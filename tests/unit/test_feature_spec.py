"""Feature specs: the shipped ones load, every derived schema follows them, and a broken spec is
refused with the file, the line and the key named."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from slipstream.samples import schema
from slipstream.samples.spec import SpecError, load_spec, parse_spec_text

SPECS = ("synthetic", "criteo", "ratings")

GOOD = """\
spec_version: 1
name: tiny
version: 1
sources:
  events:
    kind: events
    id: event_id
    time: ts
    fields:
      event_id: {type: string}
      ts: {type: timestamp}
      user_id: {type: long}
      score: {type: double, optional: true, default: 0}
label:
  rule: score >= 0.5
features:
  user_id: {kind: id, field: user_id, buckets: 101}
  score_clipped: {kind: dense, field: score, clip: [0, 1]}
"""


@pytest.mark.parametrize("name", SPECS)
def test_shipped_specs_load_and_derive_their_schemas(name: str) -> None:
    spec = load_spec(name)
    arrow = schema.sample_arrow_schema(spec)
    assert arrow.names == list(spec.sample_columns)
    assert arrow.names[:2] == ["sample_id", "event_time"] and arrow.names[-1] == "label"
    ice = schema.iceberg_schema(spec)
    assert [f.name for f in ice.fields] == arrow.names
    ids = [f.field_id for f in ice.fields]
    assert len(set(ids)) == len(ids)
    assert schema.partition_spec(ice).fields[0].source_id == ice.find_field("event_time").field_id


def test_the_default_spec_is_todays_sample_schema() -> None:
    spec = load_spec()
    assert schema.ARROW_SCHEMA.names == [
        "sample_id", "event_time", "user_id", "item_id", "price_log", "position_norm", "item_age_log",
        "user_tenure_log", "device_hash", "country_hash", "category_hash", "hist_items", "label"]
    assert schema.ARROW_SCHEMA.field("hist_items").type == pa.list_(pa.int64())
    assert schema.ICEBERG_SCHEMA.find_field("hist_items").field_id == 12
    assert [f.name for f in spec.sparse] == ["user_id", "item_id", "device_hash", "country_hash", "category_hash"]
    assert spec.feature("hist_items").length == schema.HIST_LEN == 20


def test_a_spec_file_roundtrips_through_its_dict(tmp_path: Path) -> None:
    from slipstream.samples.spec import spec_from_dict

    spec = load_spec("ratings")
    again = spec_from_dict(spec.to_dict(), "plan.json")
    assert again == spec and again.digest == spec.digest


@pytest.mark.parametrize(
    "change, line, key, words",
    [
        (("user_id: {kind: id, field: user_id, buckets: 101}", "user_id: {kind: id, field: user, buckets: 101}"),
         17, "features.user_id.field", "user is not a field of the events source events"),
        (("score_clipped: {kind: dense, field: score, clip: [0, 1]}", "score_clipped: {kind: dense, field: score, clip: [1, 0]}"),
         18, "features.score_clipped.clip", "lo < hi"),
        (("score: {type: double, optional: true, default: 0}", "score: {type: double, optional: true}"),
         13, "sources.events.fields.score", "needs a default"),
        (("rule: score >= 0.5", "rule: score is high"), 15, "label.rule", "does not match"),
        (("user_id: {kind: id, field: user_id, buckets: 101}", "user_id: {kind: id, field: user_id, bucket: 101}"),
         17, "features.user_id", "allowed keys"),
        (("user_id: {kind: id, field: user_id, buckets: 101}", "label: {kind: id, field: user_id, buckets: 101}"),
         17, "features.label", "column every sample has"),
        (("user_id: {kind: id, field: user_id, buckets: 101}", "user_id: {kind: id, field: user_id}"),
         17, "features.user_id", "needs `buckets:`"),
    ],
)
def test_a_broken_spec_names_the_line_and_key(change: tuple[str, str], line: int, key: str, words: str) -> None:
    text = GOOD.replace(change[0], change[1])
    assert text != GOOD
    with pytest.raises(SpecError) as err:
        parse_spec_text(text, "specs/tiny.yaml")
    msg = str(err.value)
    assert f"specs/tiny.yaml:{line}: {key}" in msg, msg
    assert words in msg, msg


def test_a_missing_or_unparsable_spec_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"not found: give a path .* shipped specs \(criteo, ratings, synthetic\)"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match=r"tiny.yaml:\d+: not valid YAML .*: fix the syntax"):
        parse_spec_text("name: x\nsources: [\n  a: b\n", "tiny.yaml")


def test_good_spec_parses_its_parts() -> None:
    spec = parse_spec_text(GOOD)
    assert spec.events.name == "events" and spec.events.required == ("event_id", "ts", "user_id")
    assert spec.label.kind == "rule" and spec.label.describe() == "score >= 0.5"
    assert spec.feature("score_clipped").dense_range() == (0.0, 1.0)
