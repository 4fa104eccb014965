"""Synthetic click logs with a known generating model.

`generate_world` draws users, items and the hidden logistic model from a seed. `simulate`
produces impressions over a time range with their click probability `p_true`, the sequence
feature and labels. The raw zone gets impressions and clicks per day and hour (what Spark
preprocesses); the stream after the last day gets finished samples (what an online joiner
would emit to Kafka). Because `p_true` is known, the best achievable AUC on any slice is known.

With `drift=True` the hidden model changes at T (the end of the last batch day): the dense
weights flip sign and the category effects are permuted, so a model that keeps learning from the
stream beats one trained on history only.
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slipstream.errors import ConfigError
from slipstream.samples.schema import (
    ARROW_SCHEMA,
    ATTRIBUTION_WINDOW_S,
    CATEGORICAL_FEATURES,
    DEFAULT_SPEC,
    DENSE_FEATURES,
    HIST_LEN,
    hash_category,
    is_holdout,
)
from slipstream.samples.spec import Spec
from slipstream.scoring import auc

log = logging.getLogger(__name__)


def generates(spec: Spec) -> bool:
    """Whether this module generates `spec`'s data: the shipped synthetic spec, unchanged (with
    drift and the raw events the joiner reads); every other spec goes to `slipstream.dev.specgen`."""
    return spec.digest == DEFAULT_SPEC.digest


DEVICES = ("ios", "android", "web", "tv")
COUNTRIES = ("us", "de", "fr", "br", "in", "jp", "gb", "mx")
CATEGORIES = tuple(f"cat{i:02d}" for i in range(12))
US_PER_S = 1_000_000
US_PER_DAY = 86_400 * US_PER_S
CLICK_DELAY_MEAN_S = 240.0


@dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
    start_day: date
    """First raw day (UTC)."""
    days: int = 3
    """Number of raw days; T is midnight after the last one."""
    impressions_per_day: int = 20_000
    users: int = 2_000
    items: int = 400
    seed: int = 7
    stream_minutes: float = 60.0
    """Length of the stream after T, in event time."""
    stream_overlap_s: float = 600.0
    """The stream also carries the samples of [T - overlap, T) (already in the batch), as a real
    online joiner would: the trainer must drop them at the handoff."""
    max_lateness_s: float = 120.0
    late_fraction: float = 0.02
    """Share of stream records produced up to max_lateness_s after later records (out of order)."""
    drift: bool = False
    duplicate_fraction: float = 0.002
    """Share of impressions logged twice with the same impression_id (the job dedupes)."""
    corrupt_fraction: float = 0.0
    """Share of raw impression lines made bad (junk, a missing id, a negative price as NaN...)."""
    fmt: str = "jsonl"
    """Raw file format: `jsonl` (gzip JSON lines) or `parquet`."""
    id_prefix: str = "imp"
    """Impression ids are `<id_prefix>-<day index>-<n>`: give generator runs that write days of one
    table different prefixes (sample ids must be unique across the table)."""

    def __post_init__(self) -> None:
        if self.days < 1:
            raise ConfigError(f"days must be >= 1, got {self.days}")
        if self.impressions_per_day < 1:
            raise ConfigError(f"impressions_per_day must be >= 1, got {self.impressions_per_day}")
        if self.fmt not in ("jsonl", "parquet"):
            raise ConfigError(f"fmt must be 'jsonl' or 'parquet', got {self.fmt!r}")
        if not 0 <= self.corrupt_fraction < 1:
            raise ConfigError(f"corrupt_fraction must be in [0, 1), got {self.corrupt_fraction}")

    @property
    def t_handoff(self) -> datetime:
        d = self.start_day + timedelta(days=self.days)
        return datetime(d.year, d.month, d.day, tzinfo=UTC)


@dataclass
class World:
    user_country: np.ndarray
    user_device: np.ndarray
    user_tenure: np.ndarray
    user_bias: np.ndarray
    user_weight: np.ndarray
    item_category: np.ndarray
    item_price: np.ndarray
    item_created_days: np.ndarray
    item_bias: np.ndarray
    item_weight: np.ndarray
    coef: dict[str, np.ndarray]
    coef_after: dict[str, np.ndarray]


def generate_world(cfg: GeneratorConfig) -> World:
    rng = np.random.default_rng(cfg.seed)
    pop_u = 1.0 / np.arange(1, cfg.users + 1) ** 0.7
    pop_i = 1.0 / np.arange(1, cfg.items + 1) ** 0.6
    coef = {
        "bias": np.array([-1.6]),
        "dense": np.array([-0.9, -1.4, -0.6, 0.5]),
        "device": rng.normal(0, 0.35, len(DEVICES)),
        "country": rng.normal(0, 0.3, len(COUNTRIES)),
        "category": rng.normal(0, 0.6, len(CATEGORIES)),
        "seq_match": np.array([1.2]),
    }
    after = dict(coef)
    if cfg.drift:
        after = {
            **coef,
            "dense": -coef["dense"],
            "category": rng.permutation(coef["category"]) * 1.5,
            "seq_match": np.array([-0.8]),
        }
    return World(
        user_country=rng.choice(len(COUNTRIES), cfg.users, p=[0.3, 0.1, 0.1, 0.1, 0.15, 0.1, 0.1, 0.05]),
        user_device=rng.integers(0, len(DEVICES), cfg.users),
        user_tenure=rng.exponential(400.0, cfg.users),
        user_bias=rng.normal(0, 0.3, cfg.users),
        user_weight=pop_u / pop_u.sum(),
        item_category=rng.integers(0, len(CATEGORIES), cfg.items),
        item_price=np.round(rng.lognormal(3.0, 1.2, cfg.items), 2),
        item_created_days=rng.uniform(0, 900, cfg.items),
        item_bias=rng.normal(0, 0.3, cfg.items),
        item_weight=pop_i / pop_i.sum(),
        coef=coef,
        coef_after=after,
    )


def _lagged_history(user: np.ndarray, day: np.ndarray, item: np.ndarray) -> np.ndarray:
    """(n, K) matrix of the user's previous K items the same day (col K-1 = most recent), -1 = none.

    Rows must be sorted by time. Computed with K vectorised shifts over a (user, day, time) order.
    """
    n = len(item)
    order = np.lexsort((np.arange(n), day, user))
    u, d, it = user[order], day[order], item[order]
    lags = np.full((n, HIST_LEN), -1, dtype=np.int64)
    for k in range(1, HIST_LEN + 1):
        same = np.zeros(n, dtype=bool)
        same[k:] = (u[k:] == u[:-k]) & (d[k:] == d[:-k])
        col = np.full(n, -1, dtype=np.int64)
        col[k:] = np.where(same[k:], it[:-k], -1)
        lags[:, HIST_LEN - k] = col
    out = np.empty_like(lags)
    out[order] = lags
    return out


@dataclass
class Impressions:
    """One simulated time range, sorted by time. All arrays have one entry per impression."""

    ts_us: np.ndarray
    impression_id: np.ndarray
    user: np.ndarray
    item: np.ndarray
    device: np.ndarray
    country: np.ndarray
    position: np.ndarray
    item_age_days: np.ndarray
    hist: np.ndarray
    p_true: np.ndarray
    clicked: np.ndarray
    click_delay_s: np.ndarray

    @property
    def label(self) -> np.ndarray:
        return (self.clicked & (self.click_delay_s <= ATTRIBUTION_WINDOW_S)).astype(np.int32)


def simulate(cfg: GeneratorConfig, world: World, start_us: int, end_us: int, n: int, salt: int) -> Impressions:
    """Simulate n impressions uniformly in [start_us, end_us)."""
    rng = np.random.default_rng([cfg.seed, salt])
    ts = np.sort(rng.integers(start_us, end_us, n))
    user = rng.choice(len(world.user_weight), n, p=world.user_weight)
    item = rng.choice(len(world.item_weight), n, p=world.item_weight)
    device = np.where(rng.random(n) < 0.9, world.user_device[user], rng.integers(0, len(DEVICES), n))
    country = world.user_country[user]
    position = np.minimum(rng.geometric(0.15, n), 60).astype(np.int32)
    item_age = np.maximum(world.item_created_days[item] + (ts - start_us) / US_PER_DAY, 0.0)
    day = ts // US_PER_DAY
    hist = _lagged_history(user, day, item)
    ids = np.char.add(f"{cfg.id_prefix}-{salt:04d}-", np.arange(n).astype(str)).astype(object)

    raw = {
        "price": world.item_price[item],
        "position": position,
        "item_age_days": item_age,
        "user_tenure_days": world.user_tenure[user],
    }
    dense = np.stack([f.apply(raw[f.raw]) for f in DENSE_FEATURES], axis=1).astype(np.float64)
    cat = world.item_category[item]
    valid = hist >= 0
    hist_cat = np.where(valid, world.item_category[np.maximum(hist, 0)], -1)
    match = ((hist_cat == cat[:, None]) & valid).sum(1) / np.maximum(valid.sum(1), 1)

    def logit(c: dict[str, np.ndarray]) -> np.ndarray:
        out: np.ndarray = (
            c["bias"][0]
            + dense @ c["dense"]
            + c["device"][device]
            + c["country"][country]
            + c["category"][cat]
            + c["seq_match"][0] * match
            + world.user_bias[user]
            + world.item_bias[item]
        )
        return out

    t_us = int(cfg.t_handoff.timestamp() * US_PER_S)
    z = np.where(ts < t_us, logit(world.coef), logit(world.coef_after))
    p = 1.0 / (1.0 + np.exp(-z))
    clicked = rng.random(n) < p
    delay = rng.exponential(CLICK_DELAY_MEAN_S, n)
    return Impressions(ts, ids, user, item, device, country, position, item_age, hist, p, clicked, delay)


def raw_impressions_table(world: World, imp: Impressions, idx: np.ndarray) -> pa.Table:
    return pa.table(
        {
            "impression_id": pa.array(imp.impression_id[idx], pa.string()),
            "ts": pa.array(imp.ts_us[idx], pa.timestamp("us", tz="UTC")),
            "user_id": pa.array(imp.user[idx], pa.int64()),
            "item_id": pa.array(imp.item[idx], pa.int64()),
            "device": pa.array(np.asarray(DEVICES, dtype=object)[imp.device[idx]], pa.string()),
            "country": pa.array(np.asarray(COUNTRIES, dtype=object)[imp.country[idx]], pa.string()),
            "item_category": pa.array(
                np.asarray(CATEGORIES, dtype=object)[world.item_category[imp.item[idx]]], pa.string()
            ),
            "price": pa.array(world.item_price[imp.item[idx]], pa.float64()),
            "position": pa.array(imp.position[idx], pa.int32()),
            "item_age_days": pa.array(imp.item_age_days[idx], pa.float64()),
            "user_tenure_days": pa.array(world.user_tenure[imp.user[idx]], pa.float64()),
        }
    )


def samples_table(world: World, imp: Impressions, idx: np.ndarray) -> pa.Table:
    """Finished samples (ARROW_SCHEMA) for the given impressions: what the online joiner emits."""
    raw = raw_impressions_table(world, imp, idx)
    cols: dict[str, pa.Array] = {
        "sample_id": raw.column("impression_id"),
        "event_time": raw.column("ts"),
        "user_id": raw.column("user_id"),
        "item_id": raw.column("item_id"),
    }
    for f in DENSE_FEATURES:
        cols[f.name] = pa.array(f.apply(raw.column(f.raw).to_numpy()), pa.float32())
    for raw_name, out in CATEGORICAL_FEATURES:
        names = raw.column(raw_name).to_numpy(zero_copy_only=False)
        lut = {s: hash_category(s) for s in set(names)}
        cols[out] = pa.array([lut[s] for s in names], pa.int64())
    h = imp.hist[idx]
    valid = h >= 0
    offsets = np.concatenate([[0], np.cumsum(valid.sum(1))]).astype(np.int32)
    cols["hist_items"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(h[valid], pa.int64()))
    cols["label"] = pa.array(imp.label[idx], pa.int32())
    return pa.table(cols).cast(ARROW_SCHEMA)


def _write_raw(table: pa.Table, path: Path, fmt: str, corrupt: list[bytes] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        pq.write_table(table, path.with_suffix(".parquet"))
        return
    rows = table.to_pylist()
    with gzip.open(path.with_suffix(".jsonl.gz"), "wb", compresslevel=1) as fh:
        for r in rows:
            r["ts"] = r["ts"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            fh.write(json.dumps(r).encode() + b"\n")
        for line in corrupt or []:
            fh.write(line + b"\n")


def _corrupt_lines(rng: np.random.Generator, table: pa.Table, k: int) -> list[bytes]:
    """k bad lines of the kinds real logs contain; each must end up in samples_rejects."""
    out: list[bytes] = []
    rows = table.slice(0, max(k, 1)).to_pylist()
    for j in range(k):
        r = dict(rows[j % len(rows)])
        r["ts"] = r["ts"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        r["impression_id"] = f"bad-{j}-{r['impression_id']}"
        kind = j % 5
        if kind == 0:
            out.append(b'{"impression_id": "truncated-' + str(j).encode() + b'", "ts": ')
            continue
        if kind == 1:
            r.pop("user_id")
        elif kind == 2:
            r["price"] = float("nan")
        elif kind == 3:
            r["ts"] = "1970-01-01T00:00:00.000000Z"
        else:
            r["position"] = "top"
        out.append(json.dumps(r).encode())
    return out


@dataclass
class GeneratedData:
    config: GeneratorConfig
    """The generator's config: this module's, or `slipstream.dev.specgen.SpecGenConfig` for another spec."""
    raw_rows_per_day: dict[str, int]
    stream: pa.Table
    """Samples for the stream (event_time in [T - overlap, T + stream_minutes)), in produce order."""
    truth: pa.Table
    """sample_id, event_time, p_true, label, in_stream for every sample (batch days + stream)."""
    best_auc: dict[str, float]
    extra: dict[str, object] = field(default_factory=dict)
    """More facts for the manifest (specgen: the spec, bad lines per kind, the label rate)."""
    batch: dict[str, pa.Table] = field(default_factory=dict)
    """specgen: each raw day's samples as preprocessing must yield them (the featurizer on the
    day's good events), for tests and benchmarks that fill `samples` without Spark."""
    stream_events: tuple[pa.Table, pa.Table] | None = None
    """The raw impressions and clicks `stream` is made of (same time range), in time order: what
    the joiner's input topics get (`slipstream.dev.raw_stream`)."""


def _produce_order(cfg: GeneratorConfig, ts_us: np.ndarray, salt: int) -> np.ndarray:
    rng = np.random.default_rng([cfg.seed, salt, 99])
    delay = np.where(rng.random(len(ts_us)) < cfg.late_fraction, rng.uniform(0, cfg.max_lateness_s, len(ts_us)), 0)
    return np.argsort(ts_us + (delay * US_PER_S).astype(np.int64), kind="stable")




def generate(cfg: GeneratorConfig, raw_dir: Path | str) -> GeneratedData:
    """Write the raw zone for cfg's days and return the stream samples and the truth."""
    raw_dir = Path(raw_dir)
    world = generate_world(cfg)
    t_us = int(cfg.t_handoff.timestamp() * US_PER_S)
    rows_per_day: dict[str, int] = {}
    truth_parts: list[pa.Table] = []
    stream_parts: list[pa.Table] = []
    raw_parts: list[tuple[pa.Table, pa.Table]] = []
    rng = np.random.default_rng([cfg.seed, 1234])
    for d in range(cfg.days):
        day = cfg.start_day + timedelta(days=d)
        d0 = t_us - (cfg.days - d) * US_PER_DAY
        imp = simulate(cfg, world, d0, d0 + US_PER_DAY, cfg.impressions_per_day, salt=d)
        n = len(imp.ts_us)
        dup = np.flatnonzero(rng.random(n) < cfg.duplicate_fraction)
        hours = (imp.ts_us - d0) // (3600 * US_PER_S)
        for h in range(24):
            sel = np.flatnonzero(hours == h)
            sel = np.sort(np.concatenate([sel, dup[(hours[dup] == h)]]))
            table = raw_impressions_table(world, imp, sel)
            k = int(round(len(sel) * cfg.corrupt_fraction))
            bad = _corrupt_lines(rng, table, k) if k else None
            _write_raw(table, raw_dir / "impressions" / f"day={day}" / f"hour={h:02d}" / "part-0", cfg.fmt, bad)
        rows_per_day[str(day)] = n
        _write_clicks(raw_dir, imp, d0, cfg.fmt)
        truth_parts.append(_truth(imp, np.arange(n), t_us))
        overlap = np.flatnonzero(imp.ts_us >= t_us - int(cfg.stream_overlap_s * US_PER_S))
        if len(overlap):
            stream_parts.append(samples_table(world, imp, overlap))
            raw_parts.append((raw_impressions_table(world, imp, overlap), clicks_table(imp, overlap)))
    n_stream = max(1, int(cfg.impressions_per_day * cfg.stream_minutes / 1440))
    tail = simulate(cfg, world, t_us, t_us + int(cfg.stream_minutes * 60 * US_PER_S), n_stream, salt=10_000)
    # The tail's sequence feature continues the last day only after midnight (same UTC day rule).
    _write_clicks(raw_dir, tail, t_us, cfg.fmt)
    stream_parts.append(samples_table(world, tail, np.arange(len(tail.ts_us))))
    raw_parts.append((raw_impressions_table(world, tail, np.arange(len(tail.ts_us))),
                      clicks_table(tail, np.arange(len(tail.ts_us)))))
    truth_parts.append(_truth(tail, np.arange(len(tail.ts_us)), t_us))
    stream = pa.concat_tables(stream_parts)
    stream = stream.take(pa.array(_produce_order(cfg, pc.cast(stream["event_time"], pa.int64()).to_numpy(), 7)))
    truth = pa.concat_tables(truth_parts)
    best = _best_auc(truth, t_us)
    log.info("generated %d raw days, %d stream samples; best AUC %s", cfg.days, stream.num_rows, best)
    clicks = pa.concat_tables([c for _, c in raw_parts])
    events = (pa.concat_tables([i for i, _ in raw_parts]),
              clicks.take(pc.sort_indices(clicks, [("ts", "ascending")])))
    return GeneratedData(cfg, rows_per_day, stream, truth, best, stream_events=events)


def _truth(imp: Impressions, idx: np.ndarray, t_us: int) -> pa.Table:
    return pa.table(
        {
            "sample_id": pa.array(imp.impression_id[idx], pa.string()),
            "event_time": pa.array(imp.ts_us[idx], pa.timestamp("us", tz="UTC")),
            "p_true": pa.array(imp.p_true[idx], pa.float64()),
            "label": pa.array(imp.label[idx], pa.int32()),
            "after_t": pa.array(imp.ts_us[idx] >= t_us),
        }
    )


def _best_auc(truth: pa.Table, t_us: int) -> dict[str, float]:
    hold = is_holdout(truth.column("sample_id"))
    after = truth.column("after_t").to_numpy(zero_copy_only=False)
    lab = truth.column("label").to_numpy()
    p = truth.column("p_true").to_numpy()
    return {
        "holdout_before_t": auc(lab[hold & ~after], p[hold & ~after]),
        "holdout_after_t": auc(lab[hold & after], p[hold & after]),
    }


def clicks_table(imp: Impressions, idx: np.ndarray) -> pa.Table:
    """The clicks on impressions `idx` (impression_id, ts), with `user_id`: the key a producer
    gives a click (the joiner needs an impression and its clicks on one partition)."""
    sel = idx[imp.clicked[idx]]
    return pa.table({
        "impression_id": pa.array(imp.impression_id[sel], pa.string()),
        "ts": pa.array(imp.ts_us[sel] + (imp.click_delay_s[sel] * US_PER_S).astype(np.int64), pa.timestamp("us", tz="UTC")),
        "user_id": pa.array(imp.user[sel], pa.int64()),
    })


def _write_clicks(raw_dir: Path, imp: Impressions, start_us: int, fmt: str) -> None:
    """Clicks land in the folder of the hour they happen, so day D's late clicks sit in D+1."""
    sel = np.flatnonzero(imp.clicked)
    click_ts = imp.ts_us[sel] + (imp.click_delay_s[sel] * US_PER_S).astype(np.int64)
    hour_idx = click_ts // (3600 * US_PER_S)
    for h in np.unique(hour_idx):
        m = hour_idx == h
        when = datetime.fromtimestamp(int(h) * 3600, tz=UTC)
        table = pa.table(
            {
                "impression_id": pa.array(imp.impression_id[sel[m]], pa.string()),
                "ts": pa.array(click_ts[m], pa.timestamp("us", tz="UTC")),
            }
        )
        path = raw_dir / "clicks" / f"day={when.date()}" / f"hour={when.hour:02d}" / f"part-{start_us // US_PER_S}"
        _write_raw(table, path, fmt)


def write_manifest(data: GeneratedData, path: Path) -> dict[str, object]:
    cfg = asdict(data.config)
    cfg["start_day"] = str(data.config.start_day)
    manifest = {
        "config": cfg,
        "t_handoff": data.config.t_handoff.isoformat(),
        "raw_rows_per_day": data.raw_rows_per_day,
        "stream_samples": data.stream.num_rows,
        "best_auc": data.best_auc,
        **data.extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2, default=str))
    pq.write_table(data.truth, path.with_name("truth.parquet"))
    return manifest


def reference_samples(cfg: GeneratorConfig) -> dict[str, pa.Table]:
    """The batch days' samples computed in Python, exactly what preprocessing the raw zone must
    yield (labels, features, sequence). Tests and benchmarks use it to fill a `samples` table
    without Spark, and to check Spark's output against an independent implementation."""
    world = generate_world(cfg)
    t_us = int(cfg.t_handoff.timestamp() * US_PER_S)
    out: dict[str, pa.Table] = {}
    for d in range(cfg.days):
        d0 = t_us - (cfg.days - d) * US_PER_DAY
        imp = simulate(cfg, world, d0, d0 + US_PER_DAY, cfg.impressions_per_day, salt=d)
        out[str(cfg.start_day + timedelta(days=d))] = samples_table(world, imp, np.arange(len(imp.ts_us)))
    return out
