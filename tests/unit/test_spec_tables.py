"""A feature's embedding table in the spec: `table: hashed` (buckets) or `managed` (rows,
admit_after, eviction), refused with the line and key when the options do not fit."""

from __future__ import annotations

import pytest

from slipstream.samples.spec import SpecError, TableOptions, load_spec, parse_spec_text

BASE = """\
spec_version: 1
name: tables
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
      tags: {type: string}
      clicked: {type: long}
label:
  column: {field: clicked}
features:
  user_id: USER
  tags: {kind: list, field: tags, separator: "|", buckets: 31}
"""


def _spec(user: str):  # type: ignore[no-untyped-def]
    return parse_spec_text(BASE.replace("USER", user), "tables.yaml")


def test_a_managed_table_parses_its_options_and_sizes_the_table_by_rows() -> None:
    f = _spec("{kind: id, field: user_id, table: managed, rows: 5000, admit_after: 2, eviction: ttl, ttl_days: 30}") \
        .feature("user_id")
    assert f.table_kind == "managed" and f.buckets is None
    assert f.managed == TableOptions(rows=5000, admit_after=2, eviction="ttl", ttl_days=30)
    assert f.table_rows == 5000
    hashed = _spec("{kind: id, field: user_id, buckets: 101}").feature("user_id")
    assert hashed.table_kind == "hashed" and hashed.managed is None and hashed.table_rows == 101
    default = _spec("{kind: id, field: user_id, table: managed, rows: 9}").feature("user_id")
    assert default.managed == TableOptions(rows=9, admit_after=0, eviction="lru", ttl_days=None)


@pytest.mark.parametrize("user, key, words", [
    ("{kind: id, field: user_id, table: managed, buckets: 101}", "features.user_id.buckets", "size is `rows:`"),
    ("{kind: id, field: user_id, table: managed}", "features.user_id", "needs `rows:`"),
    ("{kind: id, field: user_id, buckets: 101, rows: 50}", "features.user_id.rows", "only apply to a managed table"),
    ("{kind: id, field: user_id, table: managed, rows: 50, eviction: ttl}", "features.user_id.eviction",
     "needs it"),
    ("{kind: id, field: user_id, table: managed, rows: 50, ttl_days: 3}", "features.user_id.ttl_days",
     "goes with `eviction: ttl`"),
    ("{kind: id, field: user_id, table: managed, rows: 1}", "features.user_id.rows", "less than the minimum"),
    ("{kind: id, field: user_id, table: managed, rows: 50, eviction: fifo}", "features.user_id.eviction",
     "is not one of ['lru', 'lfu', 'ttl']"),
    ("{kind: id, field: user_id, table: cuckoo, rows: 50}", "features.user_id.table",
     "is not one of ['hashed', 'managed']"),
])
def test_table_options_that_do_not_fit_name_the_key_and_the_fix(user: str, key: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        _spec(user)
    assert f"tables.yaml:18: {key}" in str(e.value) and words in str(e.value), str(e.value)


def test_a_list_cannot_have_a_managed_table_of_its_own() -> None:
    text = BASE.replace("USER", "{kind: id, field: user_id, buckets: 101}").replace(
        'buckets: 31}', 'table: managed, rows: 31}')
    with pytest.raises(SpecError, match="features.tags.table: only an id or categorical feature can have a managed table"):
        parse_spec_text(text, "tables.yaml")


def test_the_ratings_spec_manages_its_user_and_item_tables() -> None:
    spec = load_spec("ratings")
    assert {f.name for f in spec.features if f.managed is not None} == {"user_id", "item_id"}
    assert spec.feature("hist_items").shares == "item_id"  # the history looks up the item map
