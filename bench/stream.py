"""`slipstream bench stream --json`: samples/s of the stream phase's reader vs raw consume, and
record→trained latency of the real stream loop at a fixed produce rate.

On a noida-db broker started on a free 127.0.0.1 port for this run (stopped by its PID after):

Throughput, for each value codec of `--codecs` (default binary, then JSON) on a topic of its own
holding the same N generated samples (P partitions, event times after T), in the same run, best of
`--repeat` alternating passes over the whole topic:
- `stream`: `trainers.data.kafka_source.KafkaSource`, the trainer's stream-phase source, from the
  handoff offsets (`slipstream.stream.handoff.find_handoff`, as the trainer computes them) to the end, with
  the trainer's default `consume_batch`/`consume_timeout_s`: consume, batch decode, T and
  holdout filter, `Rows`, then `Features.from_rows` (model-ready tensors; `--no-tensors` skips it);
- `raw`: a plain confluent-kafka `Consumer` (same client settings) assigned the same partitions and
  offsets, `consume(num_messages=..)` in a loop, taking each record's value bytes (the ceiling).
`vs_raw` = stream / raw samples/s (goal >= 0.7) of the first codec, `vs_raw_<codec>` of each. Both
read every record of the same topic (counts are reported), so smaller values speed up both sides.

Latency, on another topic: a producer thread produces (first codec) at `--rate` records/s for `--seconds`
(record timestamp = wall clock at `produce()`), while the real `trainers.trainer.Trainer.stream_phase`
tails it (default stream config: shuffle buffer, batch size, replay off, CPU or the default device).
A row's latency is the wall clock right after the optimizer step that trained it minus its record
timestamp: "trained" means the forward/backward/optimizer step of the real model on the batch that
contained the row. The stream shuffle buffer (`--shuffle-buffer`, trainer default 4096) holds rows
until it is full or the source is caught up (idle), so buffering, the consume timeout and the step
time all count; the buffer and batch size are reported next to the percentiles.
Ratios only, never absolute-seconds goals: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import threading
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import torch
from confluent_kafka import Consumer, Producer, TopicPartition

from slipstream.dev.datagen import GeneratorConfig, generate_world, samples_table, simulate
from slipstream.dev.stack import free_port, start_kafka
from slipstream.pipeline.runplan import RunPlan
from slipstream.processes import stop_process
from slipstream.samples.codec import encode_samples
from slipstream.samples.schema import DEFAULT_SPEC
from slipstream.settings import KAFKA_CODECS as CODECS
from slipstream.settings import Settings
from slipstream.stream.handoff import find_handoff
from slipstream.stream.kafka import client_config, consumer_config, create_topic, end_offsets, produce_samples
from trainers.checkpoint.store import atomic_torch_save
from trainers.config.schema import DataConfig, load_config
from trainers.data.holdout import holdout_mask
from trainers.data.kafka_source import KafkaSource
from trainers.data.rows import SOURCE_KAFKA, Features, Rows
from trainers.parallel.dist import Dist, select_device

log = logging.getLogger("bench.stream")

US_PER_S = 1_000_000


def _samples(gen: GeneratorConfig, n: int, salt: int) -> pa.Table:
    """n samples with event times in [T, T + 1 h) (all after the handoff), in time order."""
    world = generate_world(gen)
    t_us = int(gen.t_handoff.timestamp() * US_PER_S)
    imp = simulate(gen, world, t_us, t_us + 3600 * US_PER_S, n, salt=salt)
    return samples_table(world, imp, np.arange(len(imp.ts_us)))


def _read_raw(bootstrap: str, topic: str, start: dict[int, int], expected: int, consume_batch: int,
              timeout_s: float, deadline_s: float) -> tuple[int, int, float]:
    """(records, value bytes, seconds) reading every partition from `start` to the end."""
    c = Consumer(consumer_config(bootstrap, group="bench-stream-raw", **{"fetch.wait.max.ms": 50}))
    try:
        c.assign([TopicPartition(topic, p, o) for p, o in start.items()])
        t0 = time.perf_counter()
        n = nbytes = 0
        while n < expected:
            for m in c.consume(num_messages=consume_batch, timeout=timeout_s):
                if m.error() is None:
                    n += 1
                    nbytes += len(cast(bytes, m.value()))  # every record of the bench's topic has a value
            if time.perf_counter() - t0 > deadline_s:
                raise RuntimeError(f"raw consume read {n}/{expected} records in {deadline_s:.0f}s")
        return n, nbytes, time.perf_counter() - t0
    finally:
        c.close()


def _read_stream(bootstrap: str, topic: str, start: dict[int, int], expected: int, t_us: int, consume_batch: int,
                 timeout_s: float, tensors: bool, deadline_s: float) -> tuple[int, int, float]:
    """(records decoded, fresh rows handed to training, seconds) through the trainer's KafkaSource."""
    src = KafkaSource(bootstrap=bootstrap, topic=topic, dlq_topic=f"{topic}-dlq", partitions=sorted(start),
                      positions=start, t_handoff_us=t_us, consume_batch=consume_batch, consume_timeout_s=timeout_s,
                      lag_interval_s=1.0, group="bench-stream-source")
    try:
        t0 = time.perf_counter()
        fresh = 0
        while src.counters.records + src.counters.dead_letters < expected:
            rows = src.poll()
            if tensors and len(rows):
                fresh += len(Features.from_rows(rows))
            else:
                fresh += len(rows)
            if time.perf_counter() - t0 > deadline_s:
                raise RuntimeError(f"KafkaSource read {src.counters.records}/{expected} records in {deadline_s:.0f}s")
        return src.counters.records, fresh, time.perf_counter() - t0
    finally:
        src.close()


def _produce_at_rate(bootstrap: str, topic: str, table: pa.Table, rate: float, linger_ms: int, codec: str,
                     out: dict[str, Any]) -> None:
    """Produce `table`'s rows at `rate`/s in `codec`, record timestamp = wall clock at produce()."""
    values = encode_samples(table, codec)
    keys = [str(u).encode() for u in table.column("user_id").to_pylist()]
    producer = Producer(client_config(bootstrap, **{"enable.idempotence": True, "linger.ms": linger_ms,
                                                    "compression.type": "lz4"}))
    started = time.monotonic()
    i = 0
    try:
        while i < len(values):
            due = min(len(values), int((time.monotonic() - started) * rate) + 1)
            while i < due:
                try:
                    producer.produce(topic, value=values[i], key=keys[i], timestamp=int(time.time() * 1000))
                    i += 1
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
            time.sleep(max(0.0, started + i / rate - time.monotonic()))
        out["produce_s"] = time.monotonic() - started
        out["undelivered"] = producer.flush(30)
    except Exception as e:  # reported by the main thread
        out["error"] = repr(e)
    out["produced"] = i


def _latency(settings: Settings, bootstrap: str, topic: str, table: pa.Table, gen: GeneratorConfig,
             args: argparse.Namespace, codec: str) -> dict[str, Any]:
    """Run the real Trainer.stream_phase on `topic` while `table` is produced at args.rate."""
    from trainers.trainer import Trainer

    fresh = int((~holdout_mask(table.column("sample_id"))).sum())
    cfg = load_config(None, [
        "data.snapshot_id=1", f"data.t_handoff={gen.t_handoff.isoformat()}", f"data.bootstrap={bootstrap}",
        f"data.topic={topic}", f"data.dlq_topic={topic}-dlq", f"data.stream_batch_size={args.batch_size}",
        f"data.stream_shuffle_buffer={args.shuffle_buffer}", "data.stop.mode=samples",
        f"data.stop.samples={fresh}", f"data.stop.timeout_s={args.seconds + 60}",
        "data.validation_days=0", "run.run_id=bench-stream", f"run.runs_dir={settings.home / 'runs'}", "run.tensorboard=false",
        "run.checkpoint_every_steps=1000000", "run.checkpoint_every_s=0", f"run.num_threads={args.threads}",
        f"run.device={args.device}",
        # tables sized to the generator's id space (2,000 users, 400 items), as bench train does
        "model.buckets.user_id=4001", "model.buckets.item_id=1009", "model.buckets.device_hash=1031",
        "model.buckets.country_hash=1031", "model.buckets.category_hash=1031",
    ], settings)
    d = Dist(rank=0, world=1, local_rank=0, device=select_device(cfg.run.device, 0), backend="gloo")
    tr = Trainer(cfg, d, settings, DEFAULT_SPEC)
    # the stream phase alone: a plan with no batch files (what `Trainer.setup` fixes for a whole run)
    dc = cfg.data
    tr.plan = RunPlan(run_id=cfg.run.run_id, table=f"{settings.namespace}.samples", snapshot_id=dc.snapshot_id,
                      window_start=gen.t_handoff - timedelta(days=1), t_handoff=gen.t_handoff, topic=dc.topic,
                      bootstrap=dc.bootstrap, max_lateness_s=dc.max_lateness_s, cache_dir="", run_dir=str(tr.run_dir),
                      files=(), spec=DEFAULT_SPEC, dlq_topic=dc.dlq_topic)
    # the batch-only model the stream's scores are compared with (what the handoff saves): here the untrained model
    whole = tr.stepper.whole_model()
    assert whole is not None
    atomic_torch_save({"model": whole.state_dict()}, tr.batch_only_path())
    start = {p: 0 for p in end_offsets(bootstrap, topic)}
    tr.state.positions, tr.state.handoff_offsets, tr.state.phase = dict(start), dict(start), "stream"
    lat: list[np.ndarray] = []
    step = tr.stepper.step  # every stream step (`Stepper.test_then_train`) goes through it

    def timed_step(rows: Rows, batch_size: int, fresh: np.ndarray | None = None) -> torch.Tensor:
        losses = step(rows, batch_size, fresh)
        if d.device.type == "cuda":
            torch.cuda.synchronize()
        now_ms = time.time() * 1000
        lat.append(now_ms - rows.record_ms[rows.source == SOURCE_KAFKA])
        return losses

    tr.stepper.step = timed_step  # type: ignore[method-assign]  # the bench times each step by wrapping the stepper's
    produced: dict[str, Any] = {}
    prod = threading.Thread(target=_produce_at_rate, daemon=True,
                            args=(bootstrap, topic, table, args.rate, args.linger_ms, codec, produced))
    prod.start()
    t0 = time.perf_counter()
    try:
        tr.stream_phase()
    finally:
        prod.join(60)
        tr.metrics.close()
    wall = time.perf_counter() - t0
    if "error" in produced:
        raise RuntimeError(f"the rate producer failed: {produced['error']}")
    ms = np.concatenate(lat) if lat else np.zeros(0)
    return {
        "latency_rate_per_s": args.rate, "latency_records": int(produced.get("produced", 0)),
        "latency_achieved_rate_per_s": round(produced.get("produced", 0) / max(produced.get("produce_s", 1e-9), 1e-9), 1),
        "latency_rows_trained": int(len(ms)), "latency_rows_expected": fresh,
        "latency_ms_p50": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
        "latency_ms_p99": round(float(np.percentile(ms, 99)), 1) if len(ms) else None,
        "latency_ms_max": round(float(ms.max()), 1) if len(ms) else None,
        "latency_steps": tr.state.step, "latency_stop_reason": tr.state.stop_reason, "latency_wall_s": round(wall, 2),
        "latency_device": str(d.device), "latency_shuffle_buffer": args.shuffle_buffer,
        "latency_batch_size": args.batch_size, "latency_producer_linger_ms": args.linger_ms,
    }


def _throughput(bootstrap: str, topic: str, table: pa.Table, codec: str, gen: GeneratorConfig, t_us: int,
                consume_batch: int, consume_timeout_s: float, args: argparse.Namespace) -> dict[str, Any]:
    """KafkaSource vs raw consume over one topic holding `table` in `codec`, best of args.repeat."""
    create_topic(bootstrap, topic, args.partitions)
    t0 = time.perf_counter()
    produce_samples(bootstrap, topic, table, progress_every=0, codec=codec)
    log.info("produced %d %s samples to %s in %.1fs", table.num_rows, codec, topic, time.perf_counter() - t0)
    handoff = find_handoff(bootstrap, topic, gen.t_handoff, gen.max_lateness_s).offsets
    ends = end_offsets(bootstrap, topic)
    expected = sum(ends[p] - handoff[p] for p in ends)
    stream_runs, raw_runs = [], []
    for r in range(args.repeat):
        stream_runs.append(_read_stream(bootstrap, topic, handoff, expected, t_us, consume_batch,
                                        consume_timeout_s, not args.no_tensors, args.deadline_s))
        raw_runs.append(_read_raw(bootstrap, topic, handoff, expected, consume_batch, consume_timeout_s,
                                  args.deadline_s))
        log.info("%s pass %d: stream %.0f/s, raw %.0f/s", codec, r, stream_runs[-1][0] / stream_runs[-1][2],
                 raw_runs[-1][0] / raw_runs[-1][2])
    n_stream, n_fresh, stream_s = min(stream_runs, key=lambda x: x[2])
    n_raw, raw_bytes, raw_s = min(raw_runs, key=lambda x: x[2])
    stream_rate, raw_rate = n_stream / stream_s, n_raw / raw_s
    return {
        "records_from_handoff": expected, "records_stream": n_stream, "records_raw": n_raw, "fresh_rows_stream": n_fresh,
        "value_bytes_per_record": round(raw_bytes / max(n_raw, 1), 1),
        "stream_samples_per_s": round(stream_rate, 1), "raw_samples_per_s": round(raw_rate, 1),
        "vs_raw": round(stream_rate / raw_rate, 3),
        "stream_runs_per_s": [round(n / s, 1) for n, _, s in stream_runs],
        "raw_runs_per_s": [round(n / s, 1) for n, _, s in raw_runs],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="slipstream bench stream")
    p.add_argument("--samples", type=int, default=200_000, help="records on the throughput topic")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3, help="best of this many stream/raw passes")
    p.add_argument("--consume-batch", type=int, default=0, help="records per consume call (0: data.consume_batch default)")
    p.add_argument("--no-tensors", action="store_true", help="stop the stream reader at Rows (no Features.from_rows)")
    p.add_argument("--rate", type=float, default=2_000.0, help="latency: records/s produced")
    p.add_argument("--seconds", type=float, default=5.0, help="latency: seconds of producing")
    p.add_argument("--batch-size", type=int, default=DataConfig.stream_batch_size, help="latency: trainer data.stream_batch_size")
    p.add_argument("--shuffle-buffer", type=int, default=DataConfig.stream_shuffle_buffer,
                   help="latency: trainer data.stream_shuffle_buffer")
    p.add_argument("--linger-ms", type=int, default=5, help="latency: producer linger.ms")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
    p.add_argument("--device", default="cpu", help="latency: run.device (cpu, cuda, auto)")
    p.add_argument("--codecs", default="binary,json",
                   help="value codecs to measure, each on its own topic; the first is the headline and the latency codec")
    p.add_argument("--bootstrap", default="", help="use this broker instead of starting one")
    p.add_argument("--deadline-s", type=float, default=300.0, help="fail a read pass that takes longer")
    # the bench runner passes everything after the name through, its own --json included
    args = p.parse_args([a for a in (argv or []) if a not in ("--json", "--")])
    logging.basicConfig(level=logging.WARNING)
    log.setLevel(logging.INFO)
    # the trainer's own defaults, so the bench measures what a run does unless told otherwise
    consume_batch = args.consume_batch or DataConfig.consume_batch
    consume_timeout_s = DataConfig.consume_timeout_s
    codecs = [c for c in args.codecs.split(",") if c]
    if not codecs or set(codecs) - set(CODECS):
        p.error(f"--codecs takes a comma-separated list of {', '.join(CODECS)}, got {args.codecs!r}")
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as tmp:
        home = Path(tmp)
        settings = Settings(home=home)
        pid = None
        bootstrap = args.bootstrap
        try:
            if not bootstrap:
                svc = start_kafka(home, free_port())
                pid, bootstrap = svc.pid, svc.address
                log.info("broker pid %d on %s", pid, bootstrap)
            gen = GeneratorConfig(start_day=date(2026, 11, 1), days=1, seed=13)
            t_us = int(gen.t_handoff.timestamp() * US_PER_S)
            table = _samples(gen, args.samples, salt=10_000)
            stamp = int(time.time())
            by_codec = {codec: _throughput(bootstrap, f"bench-stream-{codec}-{stamp}", table, codec, gen, t_us,
                                           consume_batch, consume_timeout_s, args) for codec in codecs}
            first = by_codec[codecs[0]]
            lat_topic = f"bench-stream-{stamp}-latency"
            create_topic(bootstrap, lat_topic, args.partitions)
            lat_table = _samples(gen, max(1, int(args.rate * args.seconds)), salt=20_000)
            log.info("latency: producing %d records at %.0f/s while the trainer tails %s",
                     lat_table.num_rows, args.rate, lat_topic)
            lat = _latency(settings, bootstrap, lat_topic, lat_table, gen, args, codecs[0])
        finally:
            if pid is not None:
                stop_process(pid)
    return {
        "bench": "stream", "samples": args.samples, "partitions": args.partitions, "repeat": args.repeat,
        "consume_batch": consume_batch, "codec": codecs[0], **first,
        "stream_to": "Rows" if args.no_tensors else "Features (model-ready tensors)", "goal_vs_raw": 0.7,
        **{f"vs_raw_{c}": r["vs_raw"] for c, r in by_codec.items()},
        "by_codec": by_codec,
        **lat,
        "latency_note": "record timestamp (set at produce) to the end of the optimizer step that trained the row",
    }


if __name__ == "__main__":
    print(json.dumps(main()))
