"""Benchmarks: each one is a module with `main(argv) -> dict` that measures a baseline in the same run
and reports ratios. Run one with `slipstream bench NAME --json`; `slipstream bench` lists them.

`BENCHMARKS` is the list (modules elsewhere in `bench/`, such as `bench/support/`, are not
benchmarks). Each entry carries the arguments of a tiny run that `tests/integration/test_bench_smoke.py`
runs, so that no benchmark can rot unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str
    """Module `bench.<name>` and `slipstream bench <name>`."""
    summary: str
    """One line: what it measures against what."""
    smoke: tuple[str, ...]
    """Arguments of a tiny run (seconds, not minutes) that still goes through every measured path."""


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("committed_reader", "the committed reader's records/s against a plain read_committed consumer, and a "
              "tail's cost after an aborted transaction", ("--records", "4000", "--repeat", "1", "--commits", "2")),
    Benchmark("dag_parse", "what our DAG files cost the dag-processor, against a minimal TaskFlow DAG",
              ("--repeats", "1")),
    Benchmark("elastic", "what a running job growing from 1 to 2 launchers and back costs (rescale pause, lost "
              "steps, samples lost or repeated), against its own throughput on one",
              ("--days", "2", "--per-day", "1500", "--batch-size", "8", "--phase-steps", "15")),
    Benchmark("embeddings", "the embedding tables between two processes (sparse data parallel, TorchRec sharded) "
              "against dense data parallelism; managed against hashed id tables on a long-tailed stream",
              ("--rows", "20000", "--batch", "64", "--steps", "2", "--lt-rows", "200", "--lt-before", "6000",
               "--lt-after", "2000", "--map-rows", "2000", "--map-ids", "256", "--map-steps", "6")),
    Benchmark("freshness", "a model refreshed every minute, hour and day on the same drifting stream rows (prequential "
              "AUC with intervals), and event-to-exported-model latency of a continuous trainer on a live topic",
              ("--days", "2", "--per-day", "2000", "--stream-minutes", "60", "--epochs", "1", "--live-seconds", "15",
               "--rate", "50", "--export-every-s", "3")),
    Benchmark("history", "a 206-day ratings file from `slipstream import` to a promoted model, against the 3-minute "
              "goal; with --compare-day-by-day, the per-day job over the same days, row for row",
              ("--days", "4", "--rows", "2000", "--stream-days", "1", "--epochs", "1", "--compare-day-by-day")),
    Benchmark("insight", "drift alarms, outage blocks and skew flags of the quality gate on generated bursty, drifting "
              "and outage worlds, against fixed thresholds and quantile bounds",
              ("--days", "16", "--events", "300", "--specs", "synthetic", "--no-bursty-drift")),
    Benchmark("joiner", "the sample joiner's samples/s against raw consumption, and its close-to-commit latency",
              ("--impressions", "2000", "--rate", "500", "--seconds", "2")),
    Benchmark("loader", "the batch-phase loader's samples/s against a raw read and a naive loader",
              ("--days", "2", "--per-day", "4000", "--row-group-rows", "2000", "--repeat", "1", "--naive-rows", "1000")),
    Benchmark("model_quality", "the trainer's prequential and forward-tail AUC (rows, intervals) next to its baselines, "
              "the batch-only model and the generator's best",
              ("--scenario", "stationary", "--days", "2", "--per-day", "3000", "--epochs", "1")),
    Benchmark("preprocess", "the Spark preprocessing job's rows/s against an I/O floor in the same session",
              ("--impressions", "3000", "--scale", "2", "--days", "4", "--day-rows", "100")),
    Benchmark("quality", "the quality gate and profile of a day against reading its columns",
              ("--rows", "20000", "--repeat", "1")),
    Benchmark("scale", "how cost grows with the data and with Spark workers and training processes",
              ("--impressions", "2000", "--speedup-impressions", "20000")),
    Benchmark("stream", "the stream reader's samples/s against raw consume, and record-to-trained latency",
              ("--samples", "4000", "--repeat", "1", "--rate", "500", "--seconds", "2")),
    Benchmark("train", "the trainer's batch phase samples/s against two baselines",
              ("--days", "2", "--per-day", "3000", "--epochs", "1", "--row-group-rows", "1000")),
    Benchmark("warmup", "the cache warmup against raw GETs from a store with real latency, and cached reads "
              "against local files", ("--rtt-ms", "2", "--files", "60", "--file-kb", "4", "--large-files", "2",
                                      "--large-mb", "1", "--rounds", "1", "--no-baseline")),
)
BY_NAME = {b.name: b for b in BENCHMARKS}
