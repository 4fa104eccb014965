"""Day-to-day traffic of a generated data set (`slipstream.dev.specgen`): how many events each day
gets, who makes them, and what changes on purpose.

Real logs are not a steady stream of independent rows. A day's volume moves with the weekday and
at random, and on some days a handful of users make a large share of the rows (a new user who
rates 500 films in one sitting): every feature that describes the user then swings for that day
although nothing is wrong. `Traffic.bursty()` draws such days; `Drift`s change one feature's
distribution from a day on (a real change a quality check should see), and `volume_days` /
`label_days` make a day an outage (a tenth of the rows, a doubled label rate).

Everything is drawn from the generator's seed and the day, so a world is reproducible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.dev.spec_world import FieldPlan, Vocab, World
from slipstream.errors import ConfigError
from slipstream.samples.spec import FeatureSpec, Spec

DRIFTABLE_KINDS = ("dense", "categorical", "list")
"""Feature kinds a `Drift` can move (ids and sequences follow from who the users and items are)."""


@dataclass(frozen=True)
class Drift:
    """From `day` on, `share` of the feature's mass moves: a categorical or list value that was
    rare takes `share` of the rows, a dense field's values shift by `share` * 2 of their spread
    (0.35: about 0.7 standard deviations), and a side-table feature moves through the entities
    that carry it (those with the chosen value, or above the median, get more events)."""

    feature: str
    day: date
    share: float = 0.35

    def __post_init__(self) -> None:
        if not 0 < self.share < 1:
            raise ConfigError(f"drift share of {self.feature} must be in (0, 1), got {self.share}")


@dataclass(frozen=True, kw_only=True)
class Traffic:
    volume_sd: float = 0.0
    """Spread of a day's volume around its weekday's level (log scale: 0.35 is about ±35 %)."""
    weekly: tuple[float, ...] = (1.0,) * 7
    """Volume factor of Monday ... Sunday."""
    spike_share: float = 0.0
    """Share of days whose volume is multiplied by `spike_factor` (a campaign, a crawler)."""
    spike_factor: float = 3.0
    burst_share: tuple[float, float] = (0.0, 0.0)
    """Each day, a share drawn uniformly in this range of its events comes from `burst_users` users
    chosen at random (the spec's `role: user` id; no effect on a spec without users)."""
    burst_users: int = 3
    drifts: tuple[Drift, ...] = ()
    volume_days: Mapping[date, float] = field(default_factory=dict)
    """Day -> share of the weekday's normal volume (0.1: an outage that lost 90 % of the events)."""
    label_days: Mapping[date, float] = field(default_factory=dict)
    """Day -> label rate factor (2.0: twice the positives, e.g. a labelling bug)."""

    def __post_init__(self) -> None:
        if len(self.weekly) != 7 or min(self.weekly) <= 0:
            raise ConfigError(f"weekly must be 7 positive factors (Monday first), got {self.weekly}")
        lo, hi = self.burst_share
        if not 0 <= lo <= hi < 1:
            raise ConfigError(f"burst_share must be (lo, hi) with 0 <= lo <= hi < 1, got {self.burst_share}")
        if self.volume_sd < 0 or not 0 <= self.spike_share < 1 or self.burst_users < 1:
            raise ConfigError("volume_sd must be >= 0, spike_share in [0, 1) and burst_users >= 1")
        if any(f <= 0 for f in self.volume_days.values()) or any(f <= 0 for f in self.label_days.values()):
            raise ConfigError("volume_days and label_days factors must be > 0")

    @classmethod
    def bursty(cls, **changes: Any) -> Traffic:
        """Traffic like a real ratings or click log: quieter weekends, ±35 % from day to day, a
        spike day now and then, and 5-60 % of each day's events from three users."""
        base = cls(volume_sd=0.35, weekly=(1.0, 1.05, 1.05, 1.0, 0.95, 0.7, 0.65), spike_share=0.05,
                   burst_share=(0.05, 0.6), burst_users=3)
        return dataclasses.replace(base, **changes)

    def volume(self, day: date, base: int, seed: int) -> int:
        """Events of `day` for a base volume of `base` events a day."""
        level = self.weekly[day.weekday()]
        if day in self.volume_days:  # an outage: a share of what the weekday normally holds
            return max(1, int(round(base * level * self.volume_days[day])))
        rng = np.random.default_rng([seed, 21, day.toordinal()])
        x = level * float(np.exp(rng.normal(0.0, self.volume_sd) - self.volume_sd**2 / 2))
        if rng.random() < self.spike_share:
            x *= self.spike_factor
        return max(1, int(round(base * x)))


def burst_users(world: World, events: pa.Table, day: date, traffic: Traffic, seed: int) -> pa.Table:
    """`events` with a share of the rows given to the day's burst users."""
    lo, hi = traffic.burst_share
    user = world.spec.with_role("user")
    if hi == 0 or user is None or user.table is not None or user.column not in events.schema.names:
        return events
    plan = world.plans.get((world.spec.events.name, user.column))
    if plan is None or plan.vocab is None:
        return events
    rng = np.random.default_rng([seed, 22, day.toordinal()])
    n = events.num_rows
    share = rng.uniform(lo, hi)
    rows = np.flatnonzero(rng.random(n) < share)
    if len(rows) == 0:
        return events
    who = rng.choice(len(plan.vocab.values), min(traffic.burst_users, len(plan.vocab.values)), replace=False)
    mix = rng.dirichlet(np.ones(len(who)))
    i = events.schema.get_field_index(user.column)
    typ = events.schema.field(i).type
    picks = plan.vocab.values.take(pa.array(who[rng.choice(len(who), len(rows), p=mix)])).cast(typ)
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    column = pc.replace_with_mask(events.column(i).combine_chunks(), pa.array(mask), picks)
    return events.set_column(i, events.schema.field(i), column)


def world_on(world: World, day: date, drifts: tuple[Drift, ...], seed: int) -> World:
    """The world as it is on `day`: every drift that started by then applied to its field's plan."""
    plans = dict(world.plans)
    for d in sorted(drifts, key=lambda d: d.day):
        if d.day <= day:
            key, plan = _drifted(world, world.spec.feature(d.feature), d, seed)
            plans[key] = plan
    return dataclasses.replace(world, plans=plans)


def _rare_value(weights: np.ndarray, rng: np.random.Generator) -> int:
    """A value that was seldom drawn (rank 10-30 when there are that many)."""
    order = np.argsort(-weights, kind="stable")
    lo, hi = min(10, len(order) - 1), min(30, len(order))
    return int(order[rng.integers(lo, max(hi, lo + 1))])


def _drifted(world: World, f: FeatureSpec, d: Drift, seed: int) -> tuple[tuple[str, str], FieldPlan]:
    spec = world.spec
    if f.kind not in DRIFTABLE_KINDS:
        raise ConfigError(f"a drift moves a {', '.join(DRIFTABLE_KINDS)} feature; {f.name} is {f.kind}")
    rng = np.random.default_rng([seed, 23, sum(map(ord, f.name))])
    if f.table is None:
        key = (spec.events.name, f.column)
        plan = world.plans[key]
        if plan.kind == "dense":
            dist, a, b = plan.dense
            return key, dataclasses.replace(plan, dense=(dist, a + 2 * d.share * b, b))
        assert plan.vocab is not None
        return key, dataclasses.replace(plan, vocab=_moved(plan.vocab, d.share, _rare_value(plan.vocab.weights, rng)))
    return _drifted_entities(world, f, d, rng)


def _moved(vocab: Vocab, share: float, value: int) -> Vocab:
    w = vocab.weights * (1 - share)
    w[value] += share
    return Vocab(vocab.values, w / w.sum())


def _drifted_entities(world: World, f: FeatureSpec, d: Drift, rng: np.random.Generator) -> tuple[tuple[str, str], FieldPlan]:
    """A side-table feature drifts through its entities: those that carry a chosen value (or a
    value above the median, for a number) get events until they make `share` more of them."""
    spec = world.spec
    table = spec.source(f.table or "")
    key = (spec.events.name, table.key or "")
    plan = world.plans[key]
    assert plan.vocab is not None
    side = world.tables[table.name]
    attr = dict(zip(side.column(table.key or "").to_pylist(), side.column(f.column).to_pylist()))
    values = [attr.get(k) for k in plan.vocab.values.to_pylist()]
    if f.kind == "dense":
        nums = np.array([np.nan if v is None else float(v) for v in values])
        chosen = nums > np.nanmedian(nums)
    else:
        present = [v for v in values if v is not None]
        if not present:
            raise ConfigError(f"the side table {table.name} has no values of {f.column} to drift")
        kinds, counts = np.unique(np.array(present, dtype=object).astype(str), return_counts=True)
        order = np.argsort(-counts, kind="stable")
        target = kinds[order[min(len(order) - 1, int(rng.integers(1, 4)))]]
        chosen = np.array([v is not None and str(v) == target for v in values])
    w = plan.vocab.weights.copy()
    mass = w[chosen].sum()
    if 0 < mass < 1:
        # the chosen entities' share grows from `mass` to `mass + share * (1 - mass)`
        w[chosen] *= (mass + d.share * (1 - mass)) / mass
        w[~chosen] *= (1 - mass) * (1 - d.share) / (1 - mass)
    return key, dataclasses.replace(plan, vocab=Vocab(plan.vocab.values, w / w.sum()))


def driftable_features(spec: Spec) -> list[str]:
    """The spec's features a `Drift` can move, in spec order."""
    return [f.name for f in spec.features if f.kind in DRIFTABLE_KINDS]
