"""`slipstream bench elastic --json`: what growing and shrinking a running job costs.

A batch-phase run on this machine (a generated samples table, gloo on CPU, `slipstream elastic`)
trains on one launcher; a second one, loaded in standby, joins after `--phase-steps` steps; after as
many steps on two, it leaves (SIGTERM: a graceful stop), and the run finishes on one. Measured:

- `rescale_s`: from the second launcher joining (entering the rendezvous) to the first optimizer
  step of the world of 2 — the pause the running job sees: its stop at a step boundary and
  checkpoint, the rendezvous round, the forked workers' setup and resume;
- `join_load_s`: the joining launcher loading its workers' code before it joins (the world of 1
  trains on meanwhile);
- `shrink_s`: from the SIGTERM to the first step of the world of 1 (torch drops the leaving node
  once its keep-alive lapses: slipstream.pipeline.elastic.RDZV_CONF);
- `stop_s`: from each membership change to the old world's committed checkpoint;
- `lost_steps_graceful`: steps the old worlds trained past where the new ones resumed (0);
- `samples_per_s_1` / `_2` / `_1_again`: throughput of each world (the progress log's median,
  a world's first interval left out), and `throughput_2_vs_1`, the world of 2 against the world
  of 1 measured in the same run;
- `samples_lost` / `samples_duplicated`: the committed audit against the window read again from
  the table (pyiceberg scan of the snapshot): 0 / 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from collections import Counter
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bench.support.elastic_run import ElasticRun
from bench.train import fill_samples
from slipstream.dev.datagen import GeneratorConfig
from slipstream.lake.iceberg import get_catalog
from slipstream.pipeline import elastic
from slipstream.samples.schema import is_holdout
from trainers.observe.sample_audit import read_audit

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]


def window_ids(settings: Any, snapshot: int, start: Any, end: Any) -> list[str]:
    """The window's trainable sample ids, read from the table at the snapshot (not the trainer's reader)."""
    table = get_catalog(settings).load_table(settings.table)
    rows = table.scan(snapshot_id=snapshot, selected_fields=("sample_id", "event_time")).to_arrow()
    t = rows.column("event_time")
    keep = pc.and_(pc.greater_equal(t, pa.scalar(start, t.type)), pc.less(t, pa.scalar(end, t.type)))
    ids = rows.filter(keep).column("sample_id")
    return pa.array(ids).filter(pa.array(~is_holdout(ids))).to_pylist()  # type: ignore[no-any-return]


def _segments(progress: list[dict[str, Any]]) -> list[tuple[int, list[int], list[float]]]:
    """(world, steps, samples/s after its first interval) of each run of consecutive progress lines
    of one world: the progress log has one line per step, in order, so one run per world."""
    out: list[tuple[int, list[int], list[float]]] = []
    for p in progress:
        if not out or out[-1][0] != p.get("world"):
            out.append((int(p.get("world", 0)), [int(p["step"])], []))
            continue
        out[-1][1].append(int(p["step"]))
        out[-1][2].append(float(p["samples_per_s"]))
    return out


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="slipstream bench elastic")
    p.add_argument("--days", type=int, default=2)
    p.add_argument("--per-day", type=int, default=20_000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--phase-steps", type=int, default=200, help="steps each world trains before the next change")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--home", default="", help="work folder (default: a temp folder)")
    args = p.parse_args([a for a in (argv or []) if a not in ("--json", "--")])
    logging.basicConfig(level=logging.WARNING)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-elastic-") as tmp:
        home = Path(args.home or tmp)
        gen = GeneratorConfig(start_day=date(2026, 11, 1), days=args.days, impressions_per_day=args.per_day, seed=13,
                              fmt="parquet", stream_minutes=10.0)
        settings, snapshot, _ = fill_samples(home, gen, max(200, args.per_day // 10))
        window = (gen.t_handoff - timedelta(days=args.days), gen.t_handoff)
        expected = window_ids(settings, snapshot, *window)
        steps = len(expected) // (args.batch_size * args.nproc_per_node)
        if steps < 4 * args.phase_steps:
            raise SystemExit(f"bench elastic: {len(expected)} rows make {steps} steps, fewer than 4 x --phase-steps "
                             f"({args.phase_steps}): raise --per-day or lower --phase-steps")
        cfg = {
            "data": {"snapshot_id": snapshot, "t_handoff": gen.t_handoff.isoformat(), "window_days": args.days,
                     "epochs": 1, "validation_days": 0, "stream": False, "batch_size": args.batch_size,
                     "shuffle_buffer": 2000, "bootstrap": "127.0.0.1:9", "topic": "unused"},
            "model": {"buckets": {"user_id": 4001, "item_id": 1009, "device_hash": 1031, "country_hash": 1031,
                                  "category_hash": 1031}},
            "run": {"run_id": "elastic", "checkpoint_every_steps": 100_000, "checkpoint_every_s": 0,
                    "log_every_steps": 1, "tensorboard": False},
        }
        (home / "train.json").write_text(json.dumps(cfg))
        env = {**os.environ, "SLIPSTREAM_HOME": str(home), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins"), os.environ.get("PYTHONPATH", "")])}
        run_path = home / "runs" / "elastic"
        run = ElasticRun(run_path, env, REPO, home / "launchers")
        try:
            result = _schedule(run, home, args)
            rc = run.wait(3600)
        finally:
            run.close()
        if rc != 0:
            raise SystemExit(f"bench elastic: the job exited {rc}; see {home / 'launchers'} (use --home to keep it)")
        result.update(_after(run_path))
        audit = read_audit(run_path)
        trained = Counter(audit.filter(pc.equal(audit.column("source"), "iceberg")).column("sample_id").to_pylist())
    want = set(expected)
    result.update({
        "samples_expected": len(want),
        "samples_lost": len(want - set(trained)),
        "samples_duplicated": sum(n - 1 for n in trained.values() if n > 1),
        "samples_unexpected": len(set(trained) - want),
        "load_avg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
    })
    return result


def _schedule(run: ElasticRun, home: Path, args: argparse.Namespace) -> dict[str, Any]:
    """1 -> 2 (a standby joins) -> 1 (it leaves); the times and the progress they leave."""
    run.start(["--config", str(home / "train.json")], max_nodes=2, nproc_per_node=args.nproc_per_node)
    joined = run.join_standby(1)[0]
    run.wait_loaded(2)
    first = run.wait_world(1, run.activate(0))

    def progressed(world: int, since: int) -> bool:
        meta = [p for p in _progress(run.run_path) if p.get("world") == world and p["step"] >= since + args.phase_steps]
        return bool(meta)

    run.wait_for(lambda: progressed(1, first["step"]), f"{args.phase_steps} steps on 1", 3600)
    joined_at = run.activate(joined)
    two = run.wait_world(2, joined_at)
    run.wait_for(lambda: progressed(2, two["step"]), f"{args.phase_steps} steps on 2", 3600)
    left_at = run.leave(joined)
    one = run.wait_world(1, left_at)
    launcher = next(la for la in elastic.launchers(run.run_path) if la.index == joined)
    stops = [e for e in run.worlds() if e["event"] == "stop"]
    return {
        "benchmark": "elastic", "nproc_per_node": args.nproc_per_node, "batch_size": args.batch_size,
        "phase_steps": args.phase_steps,
        "rescale_s": round(two["time"] - joined_at, 2),
        "join_load_s": round(launcher.ready - launcher.started, 2),
        "shrink_s": round(one["time"] - left_at, 2),
        "stop_s": [round(s["time"] - t, 2) for s, t in zip(stops, (joined_at, left_at))],
    }


def _after(run_path: Path) -> dict[str, Any]:
    """From the finished run: steps lost at the graceful changes, and each world's throughput."""
    events = elastic.read_worlds(run_path)
    stops = [e for e in events if e["event"] == "stop"]
    starts = [e for e in events if e["event"] == "start"]
    segs = _segments(_progress(run_path))
    # a world's last step: the stop's, or a later one its progress log shows (then lost on resume)
    lost = [max(stop["step"], max(segs[k][1])) - starts[k + 1]["step"] for k, stop in enumerate(stops) if k + 1 < len(starts)]
    s1, s2, s1b = (_median(segs[i][2]) if len(segs) > i else None for i in range(3))
    return {
        "lost_steps_graceful": max(lost) if lost else None, "graceful_stops": len(stops),
        "worlds": [s["world"] for s in starts],
        "samples_per_s_1": s1, "samples_per_s_2": s2, "samples_per_s_1_again": s1b,
        "throughput_2_vs_1": round(s2 / s1, 3) if s1 and s2 else None,
    }


def _progress(run_path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in (run_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
