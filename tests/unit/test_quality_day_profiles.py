"""The profiles of a window's days computed in one grouped pass equal profiling each day alone."""

from __future__ import annotations

import dataclasses
from datetime import date, timedelta

import numpy as np
import pyarrow as pa

from slipstream.quality.day_profiles import day_numbers, profile_days, profile_window
from slipstream.quality.profiles import profile_table
from slipstream.samples.schema import DEFAULT_SPEC as SPEC
from slipstream.samples.spec import FeatureSpec
from tests.quality_fixtures import reference_days, replace_column

EPOCH = date(1970, 1, 1)
SPEC_PLUS = dataclasses.replace(SPEC, features=SPEC.features + (
    FeatureSpec(name="tag", kind="categorical", field="tag"),  # string categories
    FeatureSpec(name="score64", kind="dense", field="score64"),  # float64 numbers
    FeatureSpec(name="flag_f", kind="categorical", field="flag_f"),  # floats as categories: day by day
))


def _window() -> pa.Table:
    """Four days of samples with a gap (an empty day), shuffled across days, with nulls, NaN, inf,
    negative numbers, both zeros, long-tail categories and columns of several kinds."""
    days = [t for _, t in sorted(reference_days().items())][:5]
    del days[2]  # the third day has no rows
    data = pa.concat_tables(days)
    n = data.num_rows
    rng = np.random.default_rng(5)
    price = data.column("price_log").to_numpy().copy()
    price[rng.choice(n, 20, replace=False)] = np.nan
    price[rng.choice(n, 5, replace=False)] = np.inf
    price[rng.choice(n, 30, replace=False)] *= -1.0
    price[:3] = [0.0, -0.0, 0.0]
    data = replace_column(data, "price_log", pa.array(price, pa.float32(), mask=rng.random(n) < 0.02))
    age = data.column("item_age_log").to_numpy().copy()
    age[rng.random(n) < 0.01] = 0.0
    data = replace_column(data, "item_age_log", pa.array(age, pa.float32()))
    device = pa.array(data.column("device_hash").to_numpy(), mask=rng.random(n) < 0.05)
    data = replace_column(data, "device_hash", device)
    # a category with more distinct values a day than top-k holds
    data = replace_column(data, "category_hash", pa.array(rng.integers(0, 2_000, n), pa.int64()))
    lists = data.column("hist_items").combine_chunks()
    data = replace_column(data, "hist_items", pa.ListArray.from_arrays(lists.offsets, lists.values,
                                                                         mask=pa.array(rng.random(n) < 0.03)))
    tags = np.array(["a", "bb", "ccc", "", "long tag value"])[rng.integers(0, 5, n)]
    data = data.append_column("tag", pa.array(tags, mask=rng.random(n) < 0.02))
    data = data.append_column("score64", pa.array(rng.normal(size=n), mask=rng.random(n) < 0.02))
    data = data.append_column("flag_f", pa.array(rng.integers(0, 3, n).astype(np.float64)))
    data = data.append_column("note", pa.array(np.array(["x", "y"])[rng.integers(0, 2, n)]))  # no spec kind: a key
    return data.take(pa.array(rng.permutation(n)))


def _each_day(data: pa.Table, spec: object) -> dict[date, str]:
    numbers = day_numbers(data.column("event_time"))
    out = {}
    for k in np.unique(numbers):
        out[EPOCH + timedelta(days=int(k))] = profile_table(data.filter(pa.array(numbers == k)), spec).to_json()  # type: ignore[arg-type]  # a Spec
    return out


def test_grouped_day_profiles_equal_each_day_profiled_alone() -> None:
    data = _window()
    first = EPOCH + timedelta(days=int(day_numbers(data.column("event_time")).min()))
    window = [first + timedelta(days=i) for i in range(6)]  # the gap day and a day after the data
    want = _each_day(data, SPEC_PLUS)
    got = profile_days(data, SPEC_PLUS, window)
    assert sorted(got) == sorted(want) and len(got) == 4  # days without rows get no profile
    for d in want:
        assert got[d].to_json() == want[d], d  # every count, bucket, register and float bit
    price = got[sorted(got)[0]].columns["price_log"]
    assert price.nulls > 0 and price.nonfinite > 0 and price.hist is not None and price.hist.negative
    assert not got[sorted(got)[0]].columns["category_hash"].topk.exact  # type: ignore[union-attr]


def test_day_order_and_a_subset_of_days() -> None:
    data = _window()
    numbers = day_numbers(data.column("event_time"))
    ordered = data.take(pa.array(np.argsort(numbers, kind="stable")))  # as the gate reads a window: day by day
    days = sorted(EPOCH + timedelta(days=int(k)) for k in np.unique(numbers))
    want = _each_day(ordered, SPEC)
    got = profile_days(ordered, SPEC, days[1:3])
    assert sorted(got) == days[1:3]
    for d in days[1:3]:
        assert got[d].to_json() == want[d], d
    assert profile_days(ordered.slice(0, 0), SPEC, days) == {}
    assert profile_days(ordered, SPEC, [days[-1] + timedelta(days=3)]) == {}


def test_window_profile_from_the_same_pass_equals_profiling_the_table() -> None:
    data = _window()
    numbers = day_numbers(data.column("event_time"))
    days = sorted(EPOCH + timedelta(days=int(k)) for k in np.unique(numbers))
    # rows without an event time belong to no day but to the window
    when = pa.array(data.column("event_time").to_numpy(), data.column("event_time").type, mask=np.arange(data.num_rows) % 97 == 0)
    timeless = replace_column(data, "event_time", when)
    cases = [
        (data, SPEC_PLUS, days),  # every day
        (data, SPEC_PLUS, days[1:3]),  # the other days already stored: only the window sees their rows
        (data, SPEC_PLUS, []),
        (timeless, SPEC_PLUS, days),
        (data.take(pa.array(np.argsort(numbers, kind="stable"))), SPEC, days[:2]),  # in day order
        (data.slice(0, 0), SPEC, days),
    ]
    for table, spec, wanted in cases:
        per_day, window = profile_window(table, spec, wanted)
        assert window.to_json() == profile_table(table, spec).to_json()  # every count, bucket, register and float bit
        assert window.rows == table.num_rows
        assert {d: p.to_json() for d, p in per_day.items()} == {d: p.to_json() for d, p in profile_days(table, spec, wanted).items()}
    assert not profile_window(data, SPEC_PLUS, days)[1].columns["category_hash"].topk.exact  # type: ignore[union-attr]
