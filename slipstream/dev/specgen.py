"""Synthetic data for any feature spec, with a hidden known model (`slipstream generate --spec S`).

`slipstream.dev.datagen` generates the default data set (`specs/synthetic.yaml`); this module does
the same for any other spec (criteo, ratings, a user's own): it draws a world from the seed
(`slipstream.dev.spec_world`: populations, vocabularies, dense distributions, side tables and a
logistic model, additive in the features plus a user-item affinity when the spec names both),
simulates events over the days, labels them the spec's way and writes the raw zone exactly as
real data would land there:

- events and labels sources: `<raw_dir>/<source>/day=D/hour=HH/part-<segment>.jsonl.gz | .parquet`
  (JSON lines leave a missing optional field out; a hashed-id spec's files carry no id);
- side tables: `<raw_dir>/<table>/part-0.parquet`, some keys left out of the table on purpose;
- `empty_days` get no folder at all; `bad_fraction` adds bad lines to the events' files
  (malformed, a required field missing, a wrong type, NaN, a time outside the day: the kinds real
  logs have; a typed Parquet file can only hold the last two).

The label: `column` labels are Bernoulli(p); a rule such as `rating >= 4` gets values drawn so that
P(rule holds) = p; `click_within` gets clicks after a delay, some beyond the window. The hidden
model is computed on the featurized samples (`Featurizer`), so the truth is a function of the
very numbers a model sees, and the best achievable AUC on the holdout slice (`is_holdout`) before
and after T is known. The stream after T (plus an overlap before it) is built with the same
`Featurizer` from the generated events, in produce order (a few records late).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.dev.datagen import GeneratedData
from slipstream.dev.spec_bad_lines import bad_json_lines, bad_typed_rows
from slipstream.dev.spec_world import AFFINITY_SD, World, build_world, draw_field, logit_terms
from slipstream.dev.traffic import Traffic, burst_users, world_on
from slipstream.errors import ConfigError
from slipstream.lake.raw_files import hour_groups, json_lines, write_jsonl_gz, write_parquet
from slipstream.lake.raw_zone import filesystem, hour_dir, source_dir
from slipstream.samples.schema import field_arrow_type, is_holdout, source_arrow_schema
from slipstream.samples.spec import LABEL, SAMPLE_ID, Spec
from slipstream.samples.transform import Featurizer, sample_ids
from slipstream.scoring import auc

log = logging.getLogger(__name__)

US_PER_S = 1_000_000
US_PER_DAY = 86_400 * US_PER_S
BASE_RATE = {"column": 0.25, "rule": 0.5, "click_within": 0.1}
"""Default share of positives per label kind (Criteo's click rate is about 0.25; a rating of 4+
about half the time; a click on an impression rarer)."""


@dataclass(frozen=True, kw_only=True)
class SpecGenConfig:
    start_day: date
    """First raw day (UTC)."""
    days: int = 3
    """Number of raw days; T is midnight after the last one."""
    events_per_day: int = 20_000
    users: int = 2_000
    """Size of the users' population (the id with `role: user`, else a sequence's key or the first id)."""
    items: int = 400
    """Size of every other id population."""
    max_vocab: int = 1_000
    """Most distinct values of a categorical (fewer when its buckets are few)."""
    seed: int = 7
    stream_minutes: float = 60.0
    """Length of the stream after T, in event time."""
    stream_overlap_s: float = 600.0
    """The stream also carries the samples of [T - overlap, T) (already in the batch), as an online
    joiner would: the trainer drops them at the handoff."""
    late_fraction: float = 0.02
    max_lateness_s: float = 120.0
    fmt: str = "jsonl"
    """Raw file format of events and labels: `jsonl` (gzip JSON lines) or `parquet`."""
    empty_days: tuple[date, ...] = ()
    """Days with no data at all (no folder), to exercise the path real logs with gaps take."""
    bad_fraction: float = 0.0
    """Share of bad lines added to each events file (they are extra lines; the truth leaves them out)."""
    base_rate: float | None = None
    """Share of positive labels (default by label kind, BASE_RATE)."""
    missing: bool = True
    """Leave some values of optional fields out (they take the spec's default)."""
    affinity: float = AFFINITY_SD
    """Spread of the user-item affinity term on the hidden logit (a spec naming a user and an item
    id; 0: the hidden model is additive, so a logistic regression is the best model there is)."""
    traffic: Traffic | None = None
    """Day-to-day volume, bursty users, drifts and outage days (`slipstream.dev.traffic`); None:
    `events_per_day` every day from the whole population, nothing changes."""

    def __post_init__(self) -> None:
        if self.days < 1:
            raise ConfigError(f"days must be >= 1, got {self.days}")
        if self.events_per_day < 1:
            raise ConfigError(f"events_per_day must be >= 1, got {self.events_per_day}")
        if self.users < 1 or self.items < 1:
            raise ConfigError(f"users and items must be >= 1, got {self.users} and {self.items}")
        if self.fmt not in ("jsonl", "parquet"):
            raise ConfigError(f"fmt must be 'jsonl' or 'parquet', got {self.fmt!r}")
        if not 0 <= self.bad_fraction < 1:
            raise ConfigError(f"bad_fraction must be in [0, 1), got {self.bad_fraction}")
        if self.affinity < 0:
            raise ConfigError(f"affinity must be >= 0, got {self.affinity}")
        if self.base_rate is not None and not 0 < self.base_rate < 1:
            raise ConfigError(f"base_rate must be in (0, 1), got {self.base_rate}")
        last = self.start_day + timedelta(days=self.days - 1)
        outside = [str(d) for d in self.empty_days if not self.start_day <= d <= last]
        if outside:
            raise ConfigError(f"empty days {', '.join(outside)} are outside the generated days {self.start_day}..{last}")

    @property
    def t_handoff(self) -> datetime:
        d = self.start_day + timedelta(days=self.days)
        return datetime(d.year, d.month, d.day, tzinfo=UTC)


@dataclass
class Segment:
    """One simulated time range: a raw day, or the stream after T."""

    day: date | None
    start_us: int
    events: pa.Table
    z: np.ndarray
    dense: np.ndarray


def featurize(spec: Spec, tables: dict[str, pa.Table], events: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """(samples, order): the samples of `events.take(order)`. The Featurizer wants rows sorted by
    each sequence's (key, time, sample id); `events` must carry `sample_id`. A spec whose
    sequences have different keys is featurized once per key (each key's sequences taken from its
    own pass, put in the first pass's order)."""
    pers = list(dict.fromkeys(f.per or "" for f in spec.features if f.kind == "sequence"))
    if not pers:
        return Featurizer(spec, tables).samples(events), np.arange(events.num_rows)
    out, first = None, np.zeros(0, dtype=np.int64)
    for per in pers:
        keys = pa.table({"k": events.column(per), "t": events.column(spec.events.time or ""), "i": events.column(SAMPLE_ID)})
        order = pc.sort_indices(keys, sort_keys=[("k", "ascending"), ("t", "ascending"), ("i", "ascending")]).to_numpy()
        part = Featurizer(spec, tables).samples(events.take(pa.array(order)))
        if out is None:
            out, first = part, order
            continue
        back = np.empty(len(order), dtype=np.int64)
        back[order] = np.arange(len(order))  # row of part holding each event
        for f in spec.features:
            if f.kind == "sequence" and f.per == per:
                col = part.column(f.name).take(pa.array(back[first]))
                out = out.set_column(out.schema.get_field_index(f.name), f.name, col)
    assert out is not None
    return out, first


def draw_events(world: World, start_us: int, end_us: int, n: int, rng: np.random.Generator, salt: int) -> pa.Table:
    """n events in [start_us, end_us), sorted by time; the label field (if any) is still 0."""
    spec = world.spec
    ev = spec.events
    ts = np.sort(rng.integers(start_us, max(end_us - n, start_us + 1), n)) + np.arange(n)  # distinct times
    label_field = spec.label.field if spec.label.kind != "click_within" else None
    cols: dict[str, pa.Array] = {}
    for fs in ev.fields:
        typ = field_arrow_type(fs.type)
        if fs.name == ev.time:
            cols[fs.name] = pa.array(ts, pa.int64()).cast(typ)
        elif fs.name == ev.id:
            ids = np.char.add(f"{spec.name}-{salt}-", np.arange(n).astype(str)).astype(object)
            cols[fs.name] = pa.array(ids, pa.string()) if fs.type == "string" else pa.array(salt * 10**9 + np.arange(n)).cast(typ)
        elif fs.name == label_field:
            cols[fs.name] = pa.array(np.zeros(n, dtype=np.int64)).cast(typ)
        else:
            cols[fs.name] = draw_field(rng, world.plans[(ev.name, fs.name)], n)
    return pa.table(cols, schema=source_arrow_schema(ev))


def _with_label_column(spec: Spec, events: pa.Table, label: np.ndarray) -> pa.Table:
    if spec.label.kind == "click_within":
        return events.append_column(LABEL, pa.array(label, pa.int32()))
    return events


def _simulate(world: World, cfg: SpecGenConfig, start_us: int, end_us: int, n: int, salt: int, day: date | None) -> Segment:
    spec = world.spec
    events = draw_events(world, start_us, end_us, n, np.random.default_rng([cfg.seed, 2, salt]), salt)
    if cfg.traffic is not None:
        when = day or datetime.fromtimestamp(start_us / US_PER_S, tz=UTC).date()
        events = burst_users(world, events, when, cfg.traffic, cfg.seed)
    dummy_ids = pc.cast(pa.array(np.arange(n)), pa.string())  # the label, part of a hashed id, is not drawn yet
    placeholder = _with_label_column(spec, events, np.zeros(n, dtype=np.int32)).append_column(SAMPLE_ID, dummy_ids)
    samples, order = featurize(spec, world.tables, placeholder)
    z, dense = np.zeros(n), np.zeros((n, len(spec.dense)))
    z[order] = logit_terms(world, samples)
    for j, f in enumerate(spec.dense):
        dense[order, j] = samples.column(f.name).to_numpy()
    return Segment(day, start_us, events, z, dense)


def _solve_bias(z: np.ndarray, rate: float) -> float:
    """The intercept that makes the mean probability equal `rate` (bisection: monotone in b)."""
    sub = z[:: max(1, len(z) // 200_000)]
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.mean(1 / (1 + np.exp(-(sub + mid)))) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _rule_values(spec: Spec, positive: np.ndarray, rng: np.random.Generator) -> pa.Array:
    """Values of the rule's field such that the rule holds exactly where `positive`."""
    lab = spec.label
    fs = spec.events.field(lab.field or "")
    step, v = (0.5 if fs.type == "double" else 1.0), float(lab.value or 0)
    up, down = np.arange(0, 3), np.arange(1, 7)
    pos, neg = {
        ">=": (v + step * up, v - step * down), ">": (v + step * (up + 1), v - step * (down - 1)),
        "<=": (v - step * up, v + step * down), "<": (v - step * (up + 1), v + step * (down - 1)),
        "==": (np.array([v]), v + step * np.array([-2, -1, 1, 2])), "!=": (v + step * np.array([-2, -1, 1, 2]), np.array([v])),
    }[lab.op or ">="]
    x = np.where(positive, rng.choice(pos, len(positive)), rng.choice(neg, len(positive)))
    return pa.array(x).cast(field_arrow_type(fs.type))


@dataclass
class _Labelled:
    events: pa.Table
    label: np.ndarray
    p_true: np.ndarray
    clicks: pa.Table | None


def _label(world: World, cfg: SpecGenConfig, seg: Segment, p: np.ndarray, salt: int) -> _Labelled:
    spec, lab = world.spec, world.spec.label
    rng = np.random.default_rng([cfg.seed, 3, salt])
    n = seg.events.num_rows
    hit = rng.random(n) < p
    if lab.kind == "column":
        fs = spec.events.field(lab.field or "")
        i = seg.events.schema.get_field_index(fs.name)
        return _Labelled(seg.events.set_column(i, fs.name, pa.array(hit.astype(np.int64)).cast(field_arrow_type(fs.type))),
                         hit.astype(np.int32), p, None)
    if lab.kind == "rule":
        i = seg.events.schema.get_field_index(lab.field or "")
        return _Labelled(seg.events.set_column(i, lab.field or "", _rule_values(spec, hit, rng)), hit.astype(np.int32), p, None)
    # click_within: a click after a delay; most within the window, some beyond it
    window_us = lab.window_s * US_PER_S
    late = rng.random(n) < 0.1
    delay = np.where(late, rng.uniform(0, 3 * window_us, n), rng.exponential(window_us / 8, n)).astype(np.int64)
    ts = pc.cast(seg.events.column(spec.events.time or ""), pa.int64()).to_numpy()
    click_us = ts + delay
    empty = {(d - date(1970, 1, 1)).days for d in cfg.empty_days}
    logged = hit & ~np.isin(click_us // US_PER_DAY, list(empty))  # no data at all on an empty day
    label = (logged & (delay <= window_us)).astype(np.int32)
    p_window = 0.9 * (1 - np.exp(-8.0)) + 0.1 / 3
    clicks = _clicks_table(world, seg.events, click_us, logged, rng)
    return _Labelled(seg.events, label, p * p_window, clicks)


def _clicks_table(world: World, events: pa.Table, click_us: np.ndarray, logged: np.ndarray,
                  rng: np.random.Generator) -> pa.Table:
    spec = world.spec
    src = spec.label_source
    assert src is not None
    sel = np.flatnonzero(logged)
    ids = sample_ids(spec, events).take(pa.array(sel))
    cols: dict[str, pa.Array] = {}
    for fs in src.fields:
        if fs.name == src.key:
            cols[fs.name] = ids.cast(field_arrow_type(fs.type))
        elif fs.name == src.time:
            cols[fs.name] = pa.array(click_us[sel], pa.int64()).cast(field_arrow_type(fs.type))
        else:
            cols[fs.name] = draw_field(rng, world.plans[(src.name, fs.name)], len(sel))
    return pa.table(cols, schema=source_arrow_schema(src))


def _write_source(fs: object, root: str, source: str, table: pa.Table, time_field: str, cfg: SpecGenConfig,
                  part: str, bad: tuple[Spec, np.random.Generator, dict[str, int]] | None = None) -> None:
    """Records into the folder of their UTC hour; bad lines (events only) go with each hour's file."""
    lines = json_lines(table) if cfg.fmt == "jsonl" else None
    for day, hour, rows in hour_groups(table.column(time_field)):
        base = f"{hour_dir(root, source, day, hour)}/{part}"
        k = int(round(len(rows) * cfg.bad_fraction)) if bad else 0
        if lines is None:
            chunk = table.take(pa.array(rows))
            if k and bad:
                chunk = pa.concat_tables([chunk, bad_typed_rows(bad[0], chunk, k, bad[1], bad[2])])
            write_parquet(fs, base + ".parquet", chunk)
        else:
            good = lines.take(pa.array(rows))
            more = bad_json_lines(bad[0], good, k, bad[1], bad[2]) if k and bad else []
            write_jsonl_gz(fs, base + ".jsonl.gz", good, more)


def generate_spec(spec: Spec, cfg: SpecGenConfig, raw_dir: Path | str) -> GeneratedData:
    """Write the raw zone of `spec` for cfg's days and return the stream samples and the truth."""
    if spec.name == "synthetic":
        log.info("the synthetic spec has its own generator (slipstream.dev.datagen); generating it the generic way")
    world = build_world(spec, seed=cfg.seed, users=cfg.users, items=cfg.items, max_vocab=cfg.max_vocab, missing=cfg.missing,
                        affinity=cfg.affinity)
    t_us = int(cfg.t_handoff.timestamp() * US_PER_S)
    traffic = cfg.traffic
    segments = []
    for d in range(cfg.days):
        day = cfg.start_day + timedelta(days=d)
        if day in cfg.empty_days:
            continue
        d0 = t_us - (cfg.days - d) * US_PER_DAY
        n = traffic.volume(day, cfg.events_per_day, cfg.seed) if traffic else cfg.events_per_day
        seen = world_on(world, day, traffic.drifts, cfg.seed) if traffic else world
        segments.append(_simulate(seen, cfg, d0, d0 + US_PER_DAY, n, d, day))
    n_tail = max(1, int(cfg.events_per_day * cfg.stream_minutes / 1440))
    seen = world_on(world, cfg.t_handoff.date(), traffic.drifts, cfg.seed) if traffic else world
    segments.append(_simulate(seen, cfg, t_us, t_us + int(cfg.stream_minutes * 60 * US_PER_S), n_tail, 10_000, None))
    z = _add_dense_terms(world, segments)
    rate = _base_rate(spec, cfg)
    bias = _solve_bias(np.concatenate(z), rate)
    factors = [traffic.label_days.get(s.day, 1.0) if traffic and s.day else 1.0 for s in segments]
    # a day with another label rate (a labelling fault) gets its own intercept
    biases = [bias if f == 1.0 else _solve_bias(zs, min(rate * f, 0.95)) for f, zs in zip(factors, z)]
    return _finish(world, cfg, segments, z, biases, raw_dir, t_us)


def _base_rate(spec: Spec, cfg: SpecGenConfig) -> float:
    rate = cfg.base_rate if cfg.base_rate is not None else BASE_RATE[spec.label.kind]
    if spec.label.kind == "click_within":
        rate = min(rate / 0.93, 0.95)  # a few clicks fall outside the window
    return rate


def _add_dense_terms(world: World, segments: list[Segment]) -> list[np.ndarray]:
    """Each segment's logit without the bias: the dense terms are standardised with the spread
    of the dense columns over all the generated samples, so each adds its importance."""
    dense = np.concatenate([s.dense for s in segments])
    names = [f.name for f in world.spec.dense]
    mean, sd = dense.mean(0), np.maximum(dense.std(0), 1e-6)
    w = np.array([world.dense_importance[n] for n in names]) / sd if names else np.zeros(0)
    return [s.z + (s.dense - mean) @ w for s in segments]


def _finish(world: World, cfg: SpecGenConfig, segments: list[Segment], z: list[np.ndarray], biases: list[float],
            raw_dir: Path | str, t_us: int) -> GeneratedData:
    spec = world.spec
    fs, root = filesystem(str(raw_dir))
    for name, table in world.tables.items():
        write_parquet(fs, f"{source_dir(root, name)}/part-0.parquet", table)
    rows_per_day = {str(cfg.start_day + timedelta(days=d)): 0 for d in range(cfg.days)}
    bad_counts: dict[str, int] = {}
    truth, stream = [], []
    batch: dict[str, pa.Table] = {}
    last_day = max((s.day for s in segments if s.day is not None), default=None)
    for salt, (seg, zs, bias) in enumerate(zip(segments, z, biases)):
        out = _label(world, cfg, seg, 1 / (1 + np.exp(-(zs + bias))), salt)
        ids = sample_ids(spec, out.events)
        part = f"part-{seg.start_us // US_PER_S}"
        if seg.day is not None:
            rows_per_day[str(seg.day)] = seg.events.num_rows
            bad = (spec, np.random.default_rng([cfg.seed, 4, salt]), bad_counts) if cfg.bad_fraction else None
            _write_source(fs, root, spec.events.name, out.events, spec.events.time or "", cfg, part, bad)
        if out.clicks is not None and out.clicks.num_rows:
            src = spec.label_source
            assert src is not None
            _write_source(fs, root, src.name, out.clicks, src.time or "", cfg, part)
        ts = pc.cast(out.events.column(spec.events.time or ""), pa.int64()).to_numpy()
        truth.append(pa.table({
            "sample_id": ids, "event_time": out.events.column(spec.events.time or ""),
            "p_true": pa.array(out.p_true, pa.float64()), "label": pa.array(out.label, pa.int32()),
            "after_t": pa.array(ts >= t_us),
        }))
        if seg.day is not None:
            batch[str(seg.day)] = _stream_samples(world, out, ids, np.ones(len(ts), dtype=bool))
        if seg.day is None or seg.day == last_day:
            stream.append(_stream_samples(world, out, ids, ts >= t_us - int(cfg.stream_overlap_s * US_PER_S)))
    stream_table = pa.concat_tables(stream)
    stream_table = stream_table.take(pa.array(_produce_order(cfg, stream_table)))
    truth_table = pa.concat_tables(truth)
    best = best_auc(truth_table)
    extra = {"spec": {"name": spec.name, "version": spec.version, "digest": spec.digest},
             "bad_lines": bad_counts, "label_rate": float(truth_table.column("label").to_numpy().mean()),
             "empty_days": [str(d) for d in cfg.empty_days]}
    log.info("generated %s: %d raw days (%d empty), %d stream samples; best AUC %s",
             spec.name, cfg.days, len(cfg.empty_days), stream_table.num_rows, best)
    return GeneratedData(cfg, rows_per_day, stream_table, truth_table, best, extra, batch)  # type: ignore[arg-type]


def _stream_samples(world: World, out: _Labelled, ids: pa.Array, keep: np.ndarray) -> pa.Table:
    """The samples of the kept events, built by the Featurizer from the labelled events (the
    whole segment when a sequence needs the earlier events of the day)."""
    spec = world.spec
    events = _with_label_column(spec, out.events, out.label).append_column(SAMPLE_ID, ids)
    if not any(f.kind == "sequence" for f in spec.features):
        return featurize(spec, world.tables, events.filter(pa.array(keep)))[0]
    samples, order = featurize(spec, world.tables, events)
    return samples.filter(pa.array(keep[order]))


def _produce_order(cfg: SpecGenConfig, stream: pa.Table) -> np.ndarray:
    """Event-time order, with `late_fraction` of the records produced up to max_lateness_s late."""
    rng = np.random.default_rng([cfg.seed, 5])
    ts = pc.cast(stream.column("event_time"), pa.int64()).to_numpy()
    delay = np.where(rng.random(len(ts)) < cfg.late_fraction, rng.uniform(0, cfg.max_lateness_s, len(ts)), 0)
    return np.argsort(ts + (delay * US_PER_S).astype(np.int64), kind="stable")


def best_auc(truth: pa.Table) -> dict[str, float]:
    """AUC of p_true on the holdout slice (the one the trainer evaluates) before and after T."""
    hold = is_holdout(truth.column("sample_id"))
    after = truth.column("after_t").to_numpy(zero_copy_only=False)
    lab = truth.column("label").to_numpy()
    p = truth.column("p_true").to_numpy()
    return {"holdout_before_t": auc(lab[hold & ~after], p[hold & ~after]),
            "holdout_after_t": auc(lab[hold & after], p[hold & after])}

