"""`slipstream bench insight`: do the quality gate's alarms mean something?

For each shipped spec (`specs/*.yaml`), generated worlds (`slipstream.dev.specgen` with
`slipstream.dev.traffic`) go day by day through the real gate (`run_gate` on a SQLite Iceberg
catalog, one commit per day, the profiles it stores becoming the next days' history):

- **stationary**: nothing changes, but the traffic is bursty: quieter weekends, ±35 % volume from
  day to day, a spike day now and then, and 5-60 % of each day's events from three users;
- **drift**: bursty volume, steady users, and on purpose: up to four features drift (from 13 days
  before the end, three days apart; a side table's features through its entities, one per
  table), then a day at 10 % of the normal volume and a day with twice the label rate;
- **drift, bursty users**: the drift world with the stationary world's bursty users (reported,
  not a goal: a drift smaller than the users' own day-to-day swings cannot be told from them).

Measured: `false_alarm_rate` (drift alarms / feature-days, stationary), `gate_false_block_rate`
(days a critical check blocked / days gated, stationary), `drift_detected` (injected drifts
alarmed on their first day or the day after), `outage_detected` (outage days blocked), and the
batch-vs-stream `skew_false_flag_rate` of the stationary world's stream hour against the
hour-matched batch. The baseline, measured on the same days: fixed thresholds (PSI 0.2 / JS 0.1
against the trailing days, the whole window against the stream) and bounds learned as the 5-95 %
quantiles of the history widened by 25 % (what the gate did before).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

START = date(2026, 1, 5)  # a Monday
GOALS = {"false_alarm_rate": 0.01, "drift_detected": 0.95, "outage_detected": 1.0, "gate_false_block_rate": 0.02}


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slipstream bench insight")
    p.add_argument("--days", type=int, default=35, help="days of each world (drifts start 13 days before the end)")
    p.add_argument("--events", type=int, default=4000, help="events of an average day")
    p.add_argument("--specs", nargs="*", default=None, help="spec names (default: every spec in specs/)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-bursty-drift", action="store_true", help="skip the drift world with bursty users")
    p.add_argument("--keep", action="store_true", help="keep the temporary SLIPSTREAM_HOME")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.days < 16:
        p.error(f"--days must be >= 16 (a week of history and five days of usual movement before the first drift), "
                f"got {args.days}")
    return args


@dataclass
class DayOutcome:
    day: date
    rows: int
    blocked: list[str]
    alarms: set[str]
    tested: set[str]
    baseline_alarms: set[str] = field(default_factory=set)
    baseline_blocked: bool = False
    worst: dict[str, float] = field(default_factory=dict)
    """feature -> score / limit (times the room), for the drift worlds' report."""
    seconds: float = 0.0
    history_s: float = 0.0
    """The gate's drift and learned-bounds stage (`timings["history"]`)."""


def _shipped_specs() -> list[str]:
    return sorted(p.stem for p in Path("specs").glob("*.yaml"))


def _drift_plan(spec: Any, seed: int, days: int) -> tuple[Any, ...]:
    """Up to four drifting features: events fields first (independent of each other), at most one
    per side table (its features share the entities that carry them)."""
    from slipstream.dev.traffic import Drift, driftable_features

    rng = np.random.default_rng([seed, 31])
    feats = list(driftable_features(spec))
    rng.shuffle(feats)
    chosen: list[str] = []
    tables: set[str] = set()
    for name in sorted(feats, key=lambda n: spec.feature(n).table is not None):
        t = spec.feature(name).table
        if t is not None and t in tables:
            continue
        chosen.append(name)
        tables |= {t} if t else set()
        if len(chosen) == 4:
            break
    first = days - 13  # three days apart, all before the two outage days at the end
    return tuple(Drift(name, START + timedelta(days=first + 3 * i)) for i, name in enumerate(chosen))


def _old_bounds_block(counts: dict[date, int], ctrs: dict[date, float], day: date, rows: int, ctr: float) -> bool:
    """The former learned bounds: 5-95 % quantiles of 28 days' rows / trailing-7-day mean and label
    rates, widened by 25 %, from 7 days on (the baseline)."""
    hist = [d for d in counts if day - timedelta(days=28) <= d < day]
    if len(hist) < 7:
        return False
    ratios = []
    for d in hist:
        before = [counts[d - timedelta(days=k)] for k in range(1, 8) if d - timedelta(days=k) in counts]
        if before:
            ratios.append(counts[d] / np.mean(before))
    trailing = [counts[day - timedelta(days=k)] for k in range(1, 8) if day - timedelta(days=k) in counts]
    ratio = rows / np.mean(trailing)
    lo, hi = np.quantile(ratios, (0.05, 0.95))
    clo, chi = np.nanquantile([ctrs[d] for d in hist], (0.05, 0.95))
    return not (lo * 0.75 <= ratio <= hi * 1.25) or not (clo * 0.75 <= ctr <= chi * 1.25)


def run_world(spec: Any, traffic: Any, args: argparse.Namespace, home: Path, label: str) -> tuple[list[DayOutcome], Any]:
    """Generate a world and gate it day by day; returns each day's outcome and the generated data."""
    from slipstream.dev.specgen import SpecGenConfig, generate_spec
    from slipstream.errors import QualityGateFailed
    from slipstream.lake.iceberg import get_catalog, samples_table
    from slipstream.quality.config import GateConfig
    from slipstream.quality.drift import compare_profiles
    from slipstream.quality.gate import run_gate
    from slipstream.quality.gate_result import GateResult
    from slipstream.quality.profiles import merge_profiles, profile_table
    from slipstream.samples.schema import sample_arrow_schema
    from slipstream.settings import Settings

    world_home = home / f"{spec.name}-{label}"
    cfg = SpecGenConfig(start_day=START, days=args.days, events_per_day=args.events, seed=args.seed, traffic=traffic)
    data = generate_spec(spec, cfg, world_home / "raw")
    shutil.rmtree(world_home / "raw", ignore_errors=True)
    settings = Settings(home=world_home)
    catalog = get_catalog(settings)
    table = samples_table(catalog, settings.namespace, spec)
    schema = sample_arrow_schema(spec)
    config = GateConfig(data_docs=False)
    out: list[DayOutcome] = []
    profiles: dict[date, Any] = {}
    counts: dict[date, int] = {}
    ctrs: dict[date, float] = {}
    t0 = time.monotonic()
    for i, (key, samples) in enumerate(sorted(data.batch.items())):
        day = date.fromisoformat(key)
        table.append(samples.cast(schema))
        current = table.current_snapshot()
        assert current is not None, "a day was just appended"
        snap = current.snapshot_id
        try:
            res = run_gate(settings, spec=spec, day=day, window=None, snapshot_id=snap, run_id=f"bench-{day}", config=config)
        except QualityGateFailed as e:
            assert isinstance(e.result, GateResult), "run_gate raises with its result"
            res = e.result
        prof = res.profile or profile_table(samples, spec)
        o = DayOutcome(day, res.rows, [r.name for r in res.critical_failures],
                       {s.feature for s in res.drift if s.drifted}, {s.feature for s in res.drift if s.score == s.score},
                       worst={s.feature: s.times_limit for s in res.drift}, seconds=res.seconds,
                       history_s=res.timings.get("history", 0.0))
        trailing = [profiles[d] for d in profiles if day - timedelta(days=spec.quality.history_days) <= d < day]
        if trailing:
            o.baseline_alarms = {s.feature for s in compare_profiles(merge_profiles(trailing), prof, spec) if s.drifted}
        o.baseline_blocked = _old_bounds_block(counts, ctrs, day, res.rows, prof.ctr) if counts else False
        profiles[day], counts[day], ctrs[day] = prof, res.rows, prof.ctr
        out.append(o)
        done = time.monotonic() - t0
        log.info("%s %s: day %d/%d %s (%d rows%s), %.1f days/s, ETA %.0fs", spec.name, label, i + 1, len(data.batch), day,
                 res.rows, ", blocked: " + ", ".join(o.blocked) if o.blocked else "", (i + 1) / done,
                 done / (i + 1) * (len(data.batch) - i - 1))
    return out, data


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _stationary(days: list[DayOutcome]) -> dict[str, Any]:
    tested = [d for d in days if d.tested]
    fd = sum(len(d.tested) for d in tested)
    base_fd = sum(len(d.tested) for d in tested)
    gated = days[1:]  # the first day has no history to be compared with
    return {
        "feature_days": fd, "alarms": sum(len(d.alarms) for d in tested),
        "false_alarm_rate": _rate(sum(len(d.alarms) for d in tested), fd),
        "baseline_false_alarm_rate": _rate(sum(len(d.baseline_alarms & d.tested) for d in tested), base_fd),
        "days_gated": len(gated), "days_blocked": sum(bool(d.blocked) for d in gated),
        "gate_false_block_rate": _rate(sum(bool(d.blocked) for d in gated), len(gated)),
        "baseline_gate_false_block_rate": _rate(sum(d.baseline_blocked for d in gated), len(gated)),
        "gate_s_median": round(float(np.median([d.seconds for d in days])), 3),
        "gate_history_s_median": round(float(np.median([d.history_s for d in days[28:]] or [0.0])), 3),
        "blocked": {str(d.day): d.blocked for d in gated if d.blocked},
        "alarmed": {str(d.day): sorted(d.alarms) for d in tested if d.alarms},
    }


def _drifted(days: list[DayOutcome], drifts: tuple[Any, ...], outage: date, labels: date) -> dict[str, Any]:
    by_day = {d.day: d for d in days}
    found, base_found, detail = 0, 0, {}
    for dr in drifts:
        window = [by_day[d] for d in (dr.day, dr.day + timedelta(days=1)) if d in by_day]
        hit = any(dr.feature in d.alarms for d in window)
        found += hit
        base_found += any(dr.feature in d.baseline_alarms for d in window)
        first = by_day.get(dr.day)
        detail[f"{dr.feature}@{dr.day}"] = {"detected": hit, "times_limit": round(first.worst.get(dr.feature, float("nan")), 2)
                                             if first else None}
    outages = [by_day[outage], by_day[labels]]
    return {
        "drifts": len(drifts), "drift_detected": _rate(found, len(drifts)),
        "baseline_drift_detected": _rate(base_found, len(drifts)),
        "drift_detail": detail,
        "outage_rows_blocked": by_day[outage].blocked, "outage_label_blocked": by_day[labels].blocked,
        "outage_detected": _rate(sum(bool(o.blocked) for o in outages), 2),
        "baseline_outage_detected": _rate(sum(o.baseline_blocked for o in outages), 2),
    }


def _skew(spec: Any, data: Any, history_days: int, streams: int = 7) -> dict[str, Any]:
    """Batch-vs-stream skew on the stationary world: its real stream (the hour after T) and, as
    more streams, the first hour of each of the last `streams` - 1 days, each against the
    `history_days` days before it; hour-matched with a null, and the whole days against fixed
    thresholds (the baseline)."""
    from slipstream.quality.drift import compare_profiles, drift_features
    from slipstream.quality.profiles import merge_profiles, profile_table
    from slipstream.quality.skew import batch_vs_stream, stream_hours

    keys = sorted(data.batch)
    columns = ["event_time", *drift_features(spec)]
    slices, whole = {}, {}
    for key in keys[-(history_days + streams - 1):]:
        tbl = data.batch[key].select(columns)
        hours = pc.cast(tbl.column("event_time"), pa.int64()).to_numpy() // 3_600_000_000 % 24
        for h in range(24):
            slices[(date.fromisoformat(key), h)] = profile_table(tbl.filter(pa.array(hours == h)), spec)
        whole[key] = merge_profiles(slices[(date.fromisoformat(key), h)] for h in range(24))
    t = data.config.t_handoff
    after_t = data.stream.filter(pc.greater_equal(data.stream.column("event_time"), pa.scalar(t, pa.timestamp("us", tz="UTC"))))
    cases = [(len(keys), profile_table(after_t.select(columns), spec))]
    cases += [(i, slices[(date.fromisoformat(keys[i]), 0)]) for i in range(len(keys) - streams + 1, len(keys))]
    flagged, old, features = [], [], 0
    for end, stream in cases:
        before = keys[end - history_days:end]
        res = batch_vs_stream({k: v for k, v in slices.items() if str(k[0]) in before}, stream, spec, stream_hours(stream))
        features += len(res.shifts)
        label = "after T" if end == len(keys) else f"{keys[end]} 00:00"
        flagged += [f"{label}: {s.feature}" for s in res.skewed]
        old += [f"{label}: {s.feature}" for s in compare_profiles(merge_profiles(whole[k] for k in before), stream, spec)
                if s.drifted]
    return {"streams": len(cases), "features": features, "flagged": flagged, "baseline_flagged": old}


def main(argv: list[str]) -> dict[str, Any]:
    args = _parse(argv)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    from slipstream.dev.traffic import Traffic
    from slipstream.samples.spec import load_spec

    home = Path(tempfile.mkdtemp(prefix="slipstream-bench-insight-"))
    t0 = time.monotonic()
    per_spec: dict[str, Any] = {}
    try:
        for name in args.specs or _shipped_specs():
            spec = load_spec(name)
            outage, labels = START + timedelta(days=args.days - 2), START + timedelta(days=args.days - 1)
            drifts = _drift_plan(spec, args.seed, args.days)
            stationary, data = run_world(spec, Traffic.bursty(), args, home, "stationary")
            steady = Traffic.bursty(burst_share=(0.0, 0.0), drifts=drifts, volume_days={outage: 0.1}, label_days={labels: 2.0})
            drifted, _ = run_world(spec, steady, args, home, "drift")
            entry = {"stationary": _stationary(stationary), "drift": _drifted(drifted, drifts, outage, labels),
                     "skew": _skew(spec, data, spec.quality.history_days)}
            if not args.no_bursty_drift:
                bursty = Traffic.bursty(drifts=drifts, volume_days={outage: 0.1}, label_days={labels: 2.0})
                days, _ = run_world(spec, bursty, args, home, "drift-bursty")
                entry["drift_bursty_users"] = _drifted(days, drifts, outage, labels)
            per_spec[name] = entry
        return _totals(per_spec, args, time.monotonic() - t0)
    finally:
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)


def _totals(per_spec: dict[str, Any], args: argparse.Namespace, wall_s: float) -> dict[str, Any]:
    def pooled(world: str, key: str, den: str) -> float | None:
        vals = [(v[world][key], v[world][den]) for v in per_spec.values() if world in v and v[world][key] is not None]
        total = sum(d for _, d in vals)
        return round(sum(r * d for r, d in vals) / total, 4) if total else None

    out: dict[str, Any] = {
        "specs": sorted(per_spec), "days_per_world": args.days, "events_per_day": args.events,
        "false_alarm_rate": pooled("stationary", "false_alarm_rate", "feature_days"),
        "drift_detected": pooled("drift", "drift_detected", "drifts"),
        "outage_detected": min((v["drift"]["outage_detected"] for v in per_spec.values()), default=None),
        "gate_false_block_rate": pooled("stationary", "gate_false_block_rate", "days_gated"),
        "skew_false_flag_rate": _rate(sum(len(v["skew"]["flagged"]) for v in per_spec.values()),
                                      sum(v["skew"]["features"] for v in per_spec.values())),
        "baseline": {
            "false_alarm_rate": pooled("stationary", "baseline_false_alarm_rate", "feature_days"),
            "drift_detected": pooled("drift", "baseline_drift_detected", "drifts"),
            "outage_detected": min((v["drift"]["baseline_outage_detected"] for v in per_spec.values()), default=None),
            "gate_false_block_rate": pooled("stationary", "baseline_gate_false_block_rate", "days_gated"),
            "skew_false_flag_rate": _rate(sum(len(v["skew"]["baseline_flagged"]) for v in per_spec.values()),
                                          sum(v["skew"]["features"] for v in per_spec.values())),
        },
        "drift_detected_bursty_users": pooled("drift_bursty_users", "drift_detected", "drifts"),
        "goals": GOALS,
        "per_spec": per_spec,
        "wall_s": round(wall_s, 1),
        "cpu_count": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    out["goals_met"] = bool(
        out["false_alarm_rate"] is not None and out["false_alarm_rate"] <= GOALS["false_alarm_rate"]
        and out["drift_detected"] is not None and out["drift_detected"] >= GOALS["drift_detected"]
        and out["outage_detected"] == GOALS["outage_detected"]
        and out["gate_false_block_rate"] is not None and out["gate_false_block_rate"] <= GOALS["gate_false_block_rate"]
    )
    return out
