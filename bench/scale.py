"""`slipstream bench scale --json [--impressions N] [--workdir D]`: how cost grows with the data
and with the workers, all measured in one run on this machine.

- `cluster_equals_local`: the 1x day preprocessed on a 2-worker Spark standalone cluster (on
  127.0.0.1, code shipped as a zip) equals the same day preprocessed in local mode (content checksum);
- `preprocess_speedup_2_workers`: a day of `--speedup-impressions` (default 6M) preprocessed with
  1 executor core vs 2 (one worker vs two, `spark.cores.max` on the same cluster), Spark's
  start-up excluded (the job's own clock); 1 and 2 in turn, twice, the ratio of the medians.
  Each worker, its executor and the executor's Python workers are confined to a CPU of their own
  (`WorkerShape.own_cpu`), as if each worker were a machine: unconfined, one executor of one
  Spark core already keeps both CPUs of this machine busy (its JVM task thread and the Python
  worker it feeds), and "two workers" would add no CPU.
  The day is large enough that the per-row work outweighs what every executor pays again for
  every stage (its JVM warming up its code: 2-4 s a stage on one CPU here);
  `preprocess_5x_s_1_vs_2_workers` shows the 5x day on the same cluster;
- `train_speedup_2_procs`: the trainer's samples/s with 2 torchrun processes vs 1 on the 25x day
  (an epoch of the 5x day at the default size is ~100 steps a process: too few to measure a rate;
  `train_speedup_2_procs_5x`: the same on the 5x day, two runs each),
  one CPU per process (`run.cpu_affinity=per_rank`, the launcher confined to 1 or 2 CPUs; one
  thread each); 1 and 2 processes run in turn (three 1-process runs, two 2-process runs) and the
  speedup is the ratio of the medians.
  `train_speedup_2_procs_shared_cpus`: the same without confinement (two processes and their
  loader threads sharing both CPUs against one process that already has both);
- `time_ratio_5x` / `time_ratio_25x`: preprocess time (local mode, after a warm-up day) and a
  training epoch (1 process, after a warm-up run) at 5x and 25x the rows vs 1x.
`cpu_count` and the load average before and after are reported: on 2 cores two workers or two
processes can at best double, and anything else running on the machine takes from both sides.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from slipstream.dev.datagen import GeneratorConfig, generate
from slipstream.dev.spark_cluster import WorkerShape, start_cluster
from slipstream.dev.stack import free_port
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.pipeline.preprocess_launch import run_preprocess_days
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.processes import confine_to, stop_process, usable_cpus
from slipstream.settings import Settings

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
WARM, DAY_1X, DAY_5X, DAY_25X, DAY_SPEEDUP = (date(2026, 9, 1) + timedelta(days=2 * i) for i in range(5))
"""One day apart at least (a click may land the next day): a warm-up day, 1x, 5x, 25x, then the
day the workers' speedup is measured on."""


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slipstream bench scale")
    p.add_argument("--impressions", type=int, default=20_000, help="impressions of the 1x day (25x: 25 times this)")
    p.add_argument("--speedup-impressions", type=int, default=6_000_000,
                   help="impressions of the day the 1-vs-2-worker preprocess speedup is measured on")
    p.add_argument("--workdir", default="", help="keep data here (default: a temporary folder, removed)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args([a for a in argv if a != "--"])


def _generate(raw: Path, n: int, speedup_n: int) -> None:
    sizes = ((WARM, n), (DAY_1X, n), (DAY_5X, 5 * n), (DAY_25X, 25 * n), (DAY_SPEEDUP, speedup_n))
    for i, (day, k) in enumerate(sizes):
        generate(GeneratorConfig(start_day=day, days=1, impressions_per_day=k, users=max(2_000, k // 50),
                                 items=400, seed=31 + i, fmt="parquet", stream_minutes=1.0, id_prefix=f"imp{i}"), raw)


def _checksum(settings: Settings, day: date) -> tuple[int, str]:
    import hashlib

    from slipstream.lake.iceberg import day_predicate

    table = samples_table(get_catalog(settings), settings.namespace)
    rows = table.scan(row_filter=day_predicate(table, day)).to_arrow().sort_by("sample_id")
    h = hashlib.sha256()
    for batch in rows.to_batches(10_000):
        for r in batch.to_pylist():
            h.update(json.dumps(r, default=str, sort_keys=True).encode())
    return rows.num_rows, h.hexdigest()


def _job_seconds(results: list[Any]) -> dict[date, float]:
    return {r.day: r.seconds for r in results}


def _on_cluster(settings: Settings, master: str, day: date, cores: int, attempt: int = 0) -> Any:
    """The day preprocessed on the cluster with `cores` executor cores (one per worker)."""
    spark = SparkSettings(master=master, executor_memory="512m", driver_memory="1g", conf={"spark.cores.max": str(cores)})
    [res] = run_preprocess_days(settings, [day], f"scale-{cores}-worker-{day}-{attempt}", max_reject_rate=0.05, spark=spark,
                                timeout_s=3600)
    return res


def _preprocess(root: Path, raw: Path, n: int) -> dict[str, Any]:
    local = Settings(home=root / "local", raw_dir=str(raw))
    res = run_preprocess_days(local, [WARM, DAY_1X, DAY_5X, DAY_25X], "scale-local", max_reject_rate=0.05,
                              spark=SparkSettings(driver_memory="2g"), timeout_s=3600)
    t = _job_seconds(res)
    out: dict[str, Any] = {"preprocess_s": {"1x": t[DAY_1X], "5x": t[DAY_5X], "25x": t[DAY_25X]},
                           "rows": {"1x": res[1].rows, "5x": res[2].rows, "25x": res[3].rows}}
    cluster_home = root / "cluster"
    cluster = start_cluster(cluster_home, 2, WorkerShape(own_cpu=True))
    try:
        on = Settings(home=cluster_home, raw_dir=str(raw))
        spark = SparkSettings(master=cluster.master_url, executor_memory="512m", driver_memory="1g")
        run_preprocess_days(on, [DAY_1X], "scale-cluster-1x", max_reject_rate=0.05, spark=spark, timeout_s=3600)
        out["cluster_equals_local"] = _checksum(on, DAY_1X) == _checksum(local, DAY_1X)
        small = [_on_cluster(on, cluster.master_url, DAY_5X, cores).seconds for cores in (1, 2)]
        # 1 and 2 workers in turn, twice: a change of the machine's load hits both sides
        runs = [(cores, _on_cluster(on, cluster.master_url, DAY_SPEEDUP, cores, i)) for i in range(2) for cores in (1, 2)]
        big = {k: [r.seconds for cores, r in runs if cores == k] for k in (1, 2)}
        out["rows"]["speedup"] = runs[0][1].rows
        out["preprocess_5x_s_1_vs_2_workers"] = small
        out["preprocess_speedup_s_1_vs_2_workers"] = [big[1], big[2]]
        out["preprocess_speedup_2_workers"] = round(statistics.median(big[1]) / statistics.median(big[2]), 3)
        out["preprocess_speedup_2_workers_5x"] = round(small[0] / small[1], 3)
    finally:
        for pid in [*cluster.worker_pids, cluster.master_pid]:
            stop_process(pid)
    return out


def _train(home: Path, day: date, nproc: int, run_id: str, own_cpus: bool = True) -> dict[str, Any]:
    """One batch epoch over `day` with `nproc` torchrun processes; the run's metrics.json.
    `own_cpus`: the launcher confined to `nproc` CPUs and each process to one of them."""
    settings = Settings(home=home)
    snapshot = samples_table(get_catalog(settings), settings.namespace).current_snapshot()
    if snapshot is None:
        raise RuntimeError(f"{settings.namespace}.samples under {home} has no snapshot: the preprocessing wrote nothing")
    t = day + timedelta(days=1)
    sets = [f"data.snapshot_id={snapshot.snapshot_id}", f"data.t_handoff={t.isoformat()}T00:00:00+00:00",
            "data.window_days=1", "data.validation_days=0", "data.stream=false", "data.epochs=1",
            "data.batch_size=512", f"run.run_id={run_id}", "run.checkpoint_every_steps=1000000",
            "run.checkpoint_every_s=0", "run.num_threads=1", "model.buckets.user_id=20011", "model.buckets.item_id=1009",
            f"run.cpu_affinity={'per_rank' if own_cpus else 'none'}"]
    # torchrun whose stores listen on 127.0.0.1 only, met at a loopback c10d endpoint (never --standalone)
    cmd = [sys.executable, "-m", "trainers.parallel.torchrun_loopback", "--nnodes", "1", f"--nproc-per-node={nproc}",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", run_id,
           "--local-addr", "127.0.0.1", "-m", "trainers.train"] + [x for s in sets for x in ("--set", s)]
    # one thread per process: "2 processes vs 1" compares processes, not thread pools that fight
    # over the cores of a busy machine
    env = {**os.environ, "SLIPSTREAM_HOME": str(home), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cpus = usable_cpus()[:nproc]
    if own_cpus and len(cpus) < nproc:
        raise RuntimeError(f"{nproc} processes with a CPU each need {nproc} CPUs; this process may use {len(cpus)}")
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600,
                          preexec_fn=confine_to(cpus if own_cpus else None))
    if done.returncode != 0:
        raise RuntimeError(f"training {run_id} failed:\n{done.stderr[-3000:]}")
    metrics: dict[str, Any] = json.loads((home / "runs" / run_id / "metrics.json").read_text())
    return metrics


def _training(home: Path) -> dict[str, Any]:
    _train(home, WARM, 1, "scale-warm-up")  # the first run builds the native kernels and warms the caches
    epoch_s, rate = {}, {}
    for name, day in (("1x", DAY_1X), ("5x", DAY_5X), ("25x", DAY_25X)):
        m = _train(home, day, 1, f"scale-{name}")
        rate[name] = float(m["samples_per_s"])
        epoch_s[name] = round(float(m["samples_iceberg"]) / rate[name], 3)
    # 1 and 2 processes in turn (the first 1-process sample is the 25x run above), so a change of
    # the machine's load hits both sides; the speedup is the ratio of the medians
    one, two = [rate["25x"]], []
    for i in range(2):
        two.append(float(_train(home, DAY_25X, 2, f"scale-25x-2procs-{i}")["samples_per_s"]))
        one.append(float(_train(home, DAY_25X, 1, f"scale-25x-1proc-{i}")["samples_per_s"]))
    shared = {k: [float(_train(home, DAY_25X, k, f"scale-25x-shared-{k}-{i}", own_cpus=False)["samples_per_s"])
                  for i in range(2)] for k in (1, 2)}
    small = {k: [float(_train(home, DAY_5X, k, f"scale-5x-{k}procs-{i}")["samples_per_s"]) for i in range(2)]
             for k in (1, 2)}
    return {"train_epoch_s": epoch_s, "train_samples_per_s_25x_1_vs_2_procs": [[round(x) for x in one], [round(x) for x in two]],
            "train_speedup_2_procs": round(statistics.median(two) / statistics.median(one), 3),
            "train_samples_per_s_25x_shared_cpus_1_vs_2_procs": [[round(x) for x in shared[1]], [round(x) for x in shared[2]]],
            "train_speedup_2_procs_shared_cpus": round(statistics.median(shared[2]) / statistics.median(shared[1]), 3),
            "train_samples_per_s_5x_1_vs_2_procs": [[round(x) for x in small[1]], [round(x) for x in small[2]]],
            "train_speedup_2_procs_5x": round(statistics.median(small[2]) / statistics.median(small[1]), 3)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parse(argv or [])
    logging.basicConfig(level=logging.WARNING)
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = Path(args.workdir or tmp)
        raw = root / "raw"
        _generate(raw, args.impressions, args.speedup_impressions)
        pre = _preprocess(root, raw, args.impressions)
        train = _training(root / "local")
    p, e = pre["preprocess_s"], train["train_epoch_s"]
    return {
        "benchmark": "scale",
        "cpu_count": os.cpu_count(),
        "load_avg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "impressions_1x": args.impressions,
        "cluster_equals_local": pre["cluster_equals_local"],
        "preprocess_speedup_2_workers": pre["preprocess_speedup_2_workers"],
        "train_speedup_2_procs": train["train_speedup_2_procs"],
        "preprocess_speedup_2_workers_5x": pre["preprocess_speedup_2_workers_5x"],
        "train_speedup_2_procs_shared_cpus": train["train_speedup_2_procs_shared_cpus"],
        "train_speedup_2_procs_5x": train["train_speedup_2_procs_5x"],
        "speedup_rows": pre["rows"]["speedup"],
        "time_ratio_5x": {"preprocess": round(p["5x"] / p["1x"], 3), "train_epoch": round(e["5x"] / e["1x"], 3)},
        "time_ratio_25x": {"preprocess": round(p["25x"] / p["1x"], 3), "train_epoch": round(e["25x"] / e["1x"], 3)},
        "rows": pre["rows"],
        "preprocess_s": p,
        "preprocess_5x_s_1_vs_2_workers": pre["preprocess_5x_s_1_vs_2_workers"],
        "preprocess_speedup_s_1_vs_2_workers": pre["preprocess_speedup_s_1_vs_2_workers"],
        "train_epoch_s": e,
        "train_samples_per_s_25x_1_vs_2_procs": train["train_samples_per_s_25x_1_vs_2_procs"],
        "train_samples_per_s_25x_shared_cpus_1_vs_2_procs": train["train_samples_per_s_25x_shared_cpus_1_vs_2_procs"],
        "train_samples_per_s_5x_1_vs_2_procs": train["train_samples_per_s_5x_1_vs_2_procs"],
        "seconds": round(time.monotonic() - started, 1),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
