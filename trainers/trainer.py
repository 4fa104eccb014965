"""The training job: batch phase over the pinned window, handoff at T, stream phase, finish.

Every rank runs the same loop; one small all-reduce per step tells all ranks how many rows the
step has globally and whether rank 0 wants a checkpoint or a stop, so all ranks take the same
number of optimizer steps (a rank without rows steps on an empty batch) and decide together.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from slipstream.errors import ResumeError
from slipstream.stream.handoff import find_handoff
from slipstream.lake.iceberg import get_catalog
from slipstream.stream.kafka import KafkaAccess, create_topic
from slipstream.lake.planning import pin_snapshot, plan_window_files
from slipstream.settings import Settings
from trainers.audit import AuditWriter, drop_uncommitted
from trainers.checkpoint import Checkpointer, atomic_torch_save
from trainers.config import TrainConfig
from trainers.data.iceberg_source import IcebergSource
from trainers.data.kafka_source import KafkaSource, assigned_partitions
from trainers.data.mixer import ReplayReservoir, StreamShuffle, exchange_split, replay_count
from trainers.data.units import Opener, WorkUnit, file_opener, plan_units
from trainers.distributed import Dist
from trainers.drift import DriftGauge
from trainers.export import export_model
from trainers.metrics import MetricsLogger
from trainers.model import build_model, build_optimizer, phase_lrs, set_lrs
from trainers.rows import SOURCE_KAFKA, SOURCE_REPLAY, Features, Rows
from trainers.state import ResumePoint, resume_point
from trainers import stream_profile

log = logging.getLogger(__name__)

COUNTERS = ("samples_iceberg", "samples_kafka", "samples_replay", "dropped_before_t", "dead_letters",
            "holdout_stream", "records_kafka")


def _us(t: Any) -> int:
    return int(t.timestamp() * 1_000_000)


class Trainer:
    def __init__(self, cfg: TrainConfig, d: Dist, settings: Settings, open_file: Opener | None = None) -> None:
        self.cfg, self.d, self.settings = cfg, d, settings
        self.run_dir = cfg.run.run_dir
        self.broker = KafkaAccess.from_settings(settings, cfg.data.bootstrap)  # address + security of every client
        self.t_us = _us(cfg.data.handoff_time)
        self.start_us = _us(cfg.data.window_start)
        if cfg.run.num_threads:
            torch.set_num_threads(cfg.run.num_threads)
        self.model = build_model(cfg.model, cfg.data.seed).to(d.device)
        self.net: torch.nn.Module = DDP(self.model, device_ids=[d.device] if d.device.type == "cuda" else None) if d.active else self.model
        o = cfg.optim
        self.opt = build_optimizer(self.model, o.name, o.lr, o.weight_decay,
                                   o.id_weight_decay if o.id_weight_decay >= 0 else None)
        self.drift = DriftGauge(window_rows=o.drift_window_rows, low=o.drift_low, high=o.drift_high)
        self.amp = d.device.type == "cuda" and cfg.run.amp
        self.amp_dtype = torch.bfloat16 if cfg.run.amp_dtype == "bfloat16" else torch.float16
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp and self.amp_dtype == torch.float16)
        self.ckpt = Checkpointer(self.run_dir / "checkpoint", d.rank, d.barrier, cfg.run.keep_checkpoints)
        self.metrics = MetricsLogger(self.run_dir, d.is_main, cfg.run.tensorboard)
        self.audit = AuditWriter(self.run_dir / "audit", d.rank)
        self.c: dict[str, float] = {k: 0 for k in COUNTERS}
        self.profile = stream_profile.new_profile()
        self.step = 0
        self.phase = "batch"
        self.epoch = 0
        self.positions: dict[int, int] = {}
        self.handoff_offsets: dict[int, int] | None = None
        self.my_partitions: list[int] = []
        self.handoff_methods: dict[int, str] = {}
        self.stream_elapsed_s = 0.0
        self.train_s = 0.0
        self.wait_s = 0.0
        self.trained_global = 0
        self.exchange_s = 0.0
        self.exchanged_rows = 0
        self.latencies_ms: list[np.ndarray] = []
        self.stop_reason = ""
        self._last_ckpt_t = time.monotonic()
        self._last_log = (time.monotonic(), 0, 0.0, 0.0)
        self._loss_sum = 0.0
        self._loss_n = 0
        self.last_checkpoint: str = ""
        self._open_file = open_file
        self.cache_reader: Any = None
        self.iceberg: IcebergSource | None = None
        self.kafka: KafkaSource | None = None
        self.shuffle = StreamShuffle(cfg.data.stream_shuffle_buffer, cfg.data.seed, d.rank)
        replay_start = self.t_us - int(cfg.data.replay_window_hours * 3600 * 1e6)
        self.replay = ReplayReservoir(cfg.data.replay_reservoir, replay_start, cfg.data.seed, d.rank)

    # --- setup ------------------------------------------------------------------------------
    def plan(self) -> list[WorkUnit]:
        dc = self.cfg.data
        settings = dataclasses.replace(self.settings, catalog=dc.catalog, namespace=dc.namespace)
        table = get_catalog(settings).load_table(f"{dc.namespace}.{dc.table}")
        opener, self.cache_reader = file_opener(table.io, dc.cache_dir or None)
        self.open_file = self._open_file or opener
        units: list[WorkUnit] | None = None
        if self.d.is_main:
            snap = pin_snapshot(table, dc.snapshot_id)
            plan = plan_window_files(table, snap, dc.window_start, dc.handoff_time)
            units = plan_units(plan, self.open_file)
        units = self.d.broadcast(units)
        assert units is not None
        return units

    def resume(self) -> ResumePoint | None:
        latest = self.ckpt.latest()
        if latest is None:
            return None
        if not self.cfg.run.resume:
            raise ResumeError(f"{self.run_dir} already holds checkpoint {latest.name} and run.resume is false: use a new run.run_id")
        meta = self.ckpt.load_meta(latest)
        dc = self.cfg.data
        for key, mine in (("snapshot_id", dc.snapshot_id), ("t_handoff", dc.handoff_time.isoformat()),
                          ("window_days", dc.window_days), ("topic", dc.topic)):
            if meta.get(key) != mine:
                raise ResumeError(f"checkpoint {latest} has {key}={meta.get(key)!r} but the config says {mine!r}: "
                                  "a run resumes only with the data it started with; use a new run.run_id")
        model_state = self.ckpt.load_model(latest)
        self.model.load_state_dict(model_state["model"])
        self.opt.load_state_dict(model_state["optimizer"])
        self.scaler.load_state_dict(model_state["scaler"])
        states = [self.ckpt.load_data(latest, r) for r in range(int(meta["world"]))]
        parts = None
        if meta["phase"] != "batch":
            parts = assigned_partitions(sorted(int(p) for p in meta["positions"]), self.d.rank, self.d.world)
        rp = resume_point(meta, states, self.d.rank, self.d.world, parts)
        if self.d.is_main:
            drop_uncommitted(self.run_dir / "audit", rp.step)
        self.d.barrier()
        self.step, self.phase, self.epoch = rp.step, rp.phase, rp.epoch
        self.drift.load(meta.get("drift"))
        self._set_lr()
        self.positions, self.handoff_offsets, self.handoff_methods = rp.positions, rp.handoff_offsets, rp.handoff_methods
        self.stream_elapsed_s = rp.stream_elapsed_s
        for k, v in rp.counters.items():
            self.c[k] = v
        if rp.profile:
            self.profile = stream_profile.as_profile(rp.profile)
        if rp.replay_rows is not None and rp.replay_keys is not None:
            self.replay.load(rp.replay_rows, rp.replay_keys, rp.replay_rng)
        if rp.stream_rows is not None:
            self.shuffle.load(rp.stream_rows, rp.stream_rng)
        log.info("rank %d resumes %s at step %d (phase %s, epoch %d)", self.d.rank, latest.name, rp.step, rp.phase, rp.epoch)
        return rp

    def _adaptive_lr(self) -> bool:
        # the gauge compares fresh rows with replayed ones: without replay there is nothing to compare
        return self.cfg.optim.adaptive_stream_lr and self.cfg.data.replay_share > 0

    def _set_lr(self) -> None:
        o, dc = self.cfg.optim, self.cfg.data
        drift = self.drift.level if self._adaptive_lr() else 1.0
        set_lrs(self.opt, phase_lrs(o.lr, o.stream_lr, dc.batch_size, dc.stream_batch_size, self.phase, drift))

    def _gauge_drift(self, rows: Rows, losses: torch.Tensor) -> None:
        """Collective (every rank, every stream step): feed the step's fresh and replayed loss sums,
        all ranks together, to the drift gauge and set the next step's rates from it."""
        replay = torch.from_numpy(rows.source == SOURCE_REPLAY).to(losses.device)
        # sums over an empty batch are 0: a rank without rows still joins the all-reduce
        replay_sum = float(losses[replay].sum())
        fresh_sum = float(losses.sum()) - replay_sum
        n_replay = float(replay.sum())
        g = self.d.sum([fresh_sum, len(rows) - n_replay, replay_sum, n_replay])
        self.drift.update(*g)
        self._set_lr()

    # --- one optimizer step -----------------------------------------------------------------
    def train_step(self, rows: Rows, batch_size: int) -> torch.Tensor:
        """One optimizer step; returns the rows' losses (detached, on the device)."""
        feats = Features.from_rows(rows, pin=self.d.device.type == "cuda").to(self.d.device)
        with torch.autocast(device_type=self.d.device.type, dtype=self.amp_dtype, enabled=self.amp):
            logits = self.net(feats)
        # sum / configured batch size: DDP averages over ranks, so every sample weighs the same
        # whatever each rank's row count, and an empty batch contributes zero gradients.
        losses = F.binary_cross_entropy_with_logits(logits.float(), feats.label, reduction="none")
        loss_sum = losses.sum()
        loss = loss_sum / batch_size
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.cfg.optim.grad_clip:
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.scaler.step(self.opt)
        self.scaler.update()
        self.step += 1
        if len(rows):
            self._loss_sum += float(loss_sum.detach())
            self._loss_n += len(rows)
        return losses.detach()

    def _flags(self) -> tuple[float, float]:
        """Rank 0's wishes (checkpoint now, export now) as numbers for the per-step all-reduce."""
        if not self.d.is_main:
            return 0.0, 0.0
        r = self.cfg.run
        due = self.step > 0 and ((self.step + 1) % r.checkpoint_every_steps == 0 or
                                 (r.checkpoint_every_s > 0 and time.monotonic() - self._last_ckpt_t >= r.checkpoint_every_s))
        return float(due), 0.0

    # --- batch phase ------------------------------------------------------------------------
    def batch_phase(self, units: list[WorkUnit], rp: ResumePoint | None) -> None:
        dc = self.cfg.data
        src = IcebergSource(units, self.open_file, rank=self.d.rank, world=self.d.world, seed=dc.seed,
                            batch_size=dc.batch_size, shuffle_rows=dc.shuffle_buffer,
                            window_us=(self.start_us, self.t_us), prefetch_chunks=dc.prefetch_chunks)
        self.iceberg = src
        chunk, offset = 0, 0
        if rp is not None and rp.iceberg_state is not None and "units_digest" in rp.iceberg_state:
            src.check_resumable(rp.iceberg_state)
            chunk, offset = rp.chunk, rp.offset
        try:
            while self.epoch < dc.epochs:
                src.start_epoch(self.epoch, chunk, offset)
                chunk = offset = 0
                replay = dc.replay_share > 0 and self.epoch == dc.epochs - 1
                while True:
                    t0 = time.perf_counter()
                    w0 = src.wait_s
                    rows = src.next_batch()
                    self.wait_s += src.wait_s - w0
                    n = len(rows) if rows is not None else 0
                    want_ckpt, _ = self._flags()
                    g_n, g_ckpt = self.d.sum([n, want_ckpt])
                    if g_n == 0:
                        break
                    rows = rows if rows is not None else Rows.empty()
                    if replay:
                        self.replay.offer(rows)
                    self.train_step(rows, dc.batch_size)
                    self.audit.add(rows, self.step)
                    self.c["samples_iceberg"] += n
                    self.trained_global += int(g_n)
                    self.train_s += time.perf_counter() - t0
                    self._maybe_log()
                    if g_ckpt:
                        self.checkpoint()
                src.close()
                self.epoch += 1
                self.checkpoint()  # an epoch boundary: resumable on any world size
        finally:
            src.close()

    # --- handoff ----------------------------------------------------------------------------
    def handoff(self) -> None:
        dc = self.cfg.data
        plan: Any = None
        if self.d.is_main:
            plan = find_handoff(self.broker, dc.topic, dc.handoff_time, dc.max_lateness_s)
            create_topic(self.broker, dc.dlq_topic, 1)
            atomic_torch_save({"model": self.model.state_dict()}, self._batch_only_path())
            plan = (plan.offsets, {p: h.method for p, h in plan.partitions.items()})
        offsets, methods = self.d.broadcast(plan)
        self.handoff_offsets, self.handoff_methods = offsets, methods
        self.positions = dict(offsets)
        self.phase = "stream"
        self._set_lr()
        self.checkpoint()

    def _batch_only_path(self) -> Any:
        p = self.run_dir / "checkpoint" / "batch_only"
        p.mkdir(parents=True, exist_ok=True)
        return p / "model.pt"

    # --- stream phase -----------------------------------------------------------------------
    def stream_phase(self) -> None:
        dc, stop = self.cfg.data, self.cfg.data.stop
        parts = assigned_partitions(sorted(self.positions), self.d.rank, self.d.world)
        self.my_partitions = parts
        src = KafkaSource(bootstrap=self.broker, topic=dc.topic, dlq_topic=dc.dlq_topic, partitions=parts,
                          positions=self.positions, t_handoff_us=self.t_us, consume_batch=dc.consume_batch,
                          consume_timeout_s=dc.consume_timeout_s, lag_interval_s=dc.lag_interval_s,
                          group=f"slipstream-train-{self.cfg.run.run_id}", max_future_skew_s=dc.max_future_skew_s)
        self.kafka = src
        n_replay_per_fresh = dc.replay_share / (1 - dc.replay_share)
        fresh_target = max(1, dc.stream_batch_size - replay_count(dc.stream_batch_size, dc.replay_share))
        started = time.monotonic() - self.stream_elapsed_s
        last_export = time.monotonic()
        kafka_global = self.d.sum([float(self.c["samples_kafka"])])[0]  # counts a resumed run's earlier part
        try:
            while True:
                t0 = time.perf_counter()
                w0 = src.wait_s
                buffered = len(self.shuffle)
                # wait for the broker only when there is too little to train; stop reading ahead
                # when the buffer is far past its size (back-pressure bounds memory)
                fresh = src.poll(block=buffered < fresh_target) if buffered < 4 * dc.stream_shuffle_buffer + fresh_target else Rows.empty()
                self._absorb(src)
                stream_profile.add_rows(self.profile, fresh)
                if dc.exchange:
                    fresh = self._exchange(fresh)
                self.shuffle.add(fresh)
                batch = self.shuffle.take(fresh_target, idle=src.idle)
                lag = src.lag(refresh=src.idle)
                # waiting on the broker is data wait; so is a whole iteration with nothing to train
                self.wait_s += (time.perf_counter() - t0) if not len(batch) else (src.wait_s - w0)
                elapsed = time.monotonic() - started
                self.stream_elapsed_s = elapsed
                want_ckpt, _ = self._flags()
                export_due = float(self.d.is_main and stop.mode == "continuous"
                                   and time.monotonic() - last_export >= stop.export_every_min * 60)
                timeout = float(self.d.is_main and stop.timeout_s > 0 and elapsed >= stop.timeout_s)
                over = float(self.d.is_main and stop.mode == "duration" and elapsed >= stop.duration_s)
                g = self.d.sum([len(batch), lag, len(self.shuffle), want_ckpt, export_due, timeout, over, float(not src.idle)])
                g_n, g_lag, g_buf, g_ckpt, g_export, g_timeout, g_over, g_busy = g
                if g_n > 0:
                    replay = self.replay.draw(int(round(len(batch) * n_replay_per_fresh)))
                    rows = Rows.concat([batch, replay]) if len(replay) else batch
                    losses = self.train_step(rows, dc.stream_batch_size)
                    if self._adaptive_lr():
                        self._gauge_drift(rows, losses)
                    self.audit.add(batch, self.step)
                    self._record_latency(batch)
                    self.c["samples_kafka"] += len(batch)
                    self.c["samples_replay"] += len(replay)
                    kafka_global += g_n
                    self.trained_global += int(g_n)
                    self.train_s += time.perf_counter() - t0
                    self._maybe_log(lag=g_lag)
                else:
                    self.train_s += time.perf_counter() - t0
                self.lag_at_stop = int(g_lag)
                if g_export:
                    self.export()
                    last_export = time.monotonic()
                    g_ckpt = 1
                # idle ranks refreshed their watermarks this step, so the lag is current, not cached
                if stop.mode == "caught_up" and g_lag <= stop.max_lag and g_buf == 0 and g_busy == 0:
                    self.stop_reason = f"caught up (lag {int(g_lag)} <= {stop.max_lag})"
                elif stop.mode == "samples" and kafka_global >= stop.samples:
                    self.stop_reason = f"trained {int(kafka_global)} stream samples"
                elif g_over:
                    self.stop_reason = f"stream phase ran {stop.duration_s:.0f}s"
                elif g_timeout:
                    self.stop_reason = f"stream timeout {stop.timeout_s:.0f}s"
                    log.warning("stream phase stopped by data.stop.timeout_s with lag %d", int(g_lag))
                if self.stop_reason:
                    break
                if g_ckpt:
                    self.checkpoint()
        finally:
            src.close()

    def _exchange(self, fresh: Rows) -> Rows:
        """data.exchange: deal this rank's fresh rows to every rank and return the rows dealt to it.

        Collective, called exactly once per stream-loop iteration on every rank (with no rows
        too): all ranks run the same iterations, since every loop exit and checkpoint is decided
        from the same all-reduced values. It runs between the poll and the shuffle buffer, never
        across a checkpoint: the rows a rank's advanced offsets cover are, by the next
        checkpoint, in the buffer of exactly one rank (or trained and audited), and every rank's
        buffer is saved at that same step, so the checkpoint stays exactly-once. A resume gives
        buffered rows back to the rank owning their partition (trainers.state.resume_point)."""
        if self.d.world <= 1:
            return fresh
        t0 = time.perf_counter()
        pieces = exchange_split(fresh, self.d.world, self.cfg.data.seed, self.d.rank, self.step)
        mine = pieces[self.d.rank]
        send: list[Rows | None] = [p if len(p) else None for p in pieces]
        send[self.d.rank] = None  # keep our own piece; pickling it to ourselves would be waste
        got = self.d.all_to_all_object(send)
        got[self.d.rank] = mine
        self.exchanged_rows += len(fresh) - len(mine)
        self.exchange_s += time.perf_counter() - t0
        parts = [g for g in got if g is not None and len(g)]
        return Rows.concat(parts) if len(parts) > 1 else (parts[0] if parts else Rows.empty())

    def global_positions(self) -> dict[int, int]:
        """Every partition's next offset: each rank reports the partitions it reads."""
        if self.phase == "batch" or self.handoff_offsets is None:
            return {}
        merged = dict(self.positions)
        for own in self.d.gather({p: self.positions[p] for p in self.my_partitions}):
            merged.update(own)
        self.positions.update(merged)
        return merged

    def _absorb(self, src: KafkaSource) -> None:
        s = src.counters
        self.c["dropped_before_t"] += s.dropped_before_t
        self.c["dead_letters"] += s.dead_letters
        self.c["holdout_stream"] += s.holdout
        self.c["records_kafka"] += s.records
        newest = s.newest_event_us
        reasons = dict(s.dead_reasons)
        s.__init__()  # type: ignore[misc]
        s.newest_event_us = newest
        s.dead_reasons = reasons
        self.positions.update(src.positions)
        self.audit.add_dead_letters(src.take_dead_letters(), self.step)

    def _record_latency(self, batch: Rows) -> None:
        if len(batch) and self.d.is_main and sum(len(x) for x in self.latencies_ms) < 200_000:
            self.latencies_ms.append(time.time() * 1000 - batch.consumed_ms[batch.source == SOURCE_KAFKA])

    # --- checkpoint & logs --------------------------------------------------------------------
    def checkpoint(self) -> None:
        if self.kafka is not None:
            self.kafka.flush_dead_letters()
        totals = self.d.sum([float(self.c[k]) for k in COUNTERS])
        profiles = self.d.gather(self.profile)
        positions = self.global_positions()
        cursor: dict[str, Any] = self.iceberg.state() if self.iceberg is not None else {}
        if self.phase != "batch" or not cursor or cursor["epoch"] < self.epoch:
            cursor = {**cursor, "epoch": self.epoch, "chunk": 0, "offset": 0}  # an epoch boundary
        data_state = {
            "rank": self.d.rank, "world": self.d.world, "phase": self.phase, "iceberg": cursor,
            "replay": self.replay.state() if len(self.replay) else None,
            "shuffle": self.shuffle.state() if self.phase != "batch" else None,
            "positions": dict(self.positions),
        }
        dc = self.cfg.data
        meta = {
            "step": self.step, "phase": self.phase, "epoch": self.epoch, "world": self.d.world,
            "snapshot_id": dc.snapshot_id, "t_handoff": dc.handoff_time.isoformat(), "window_days": dc.window_days,
            "topic": dc.topic, "positions": positions or self.handoff_offsets or {},
            "handoff_offsets": self.handoff_offsets, "handoff_methods": self.handoff_methods,
            "counters": dict(zip(COUNTERS, totals)), "profile": stream_profile.merge(profiles).to_dict(),
            "stream_elapsed_s": self.stream_elapsed_s, "drift": self.drift.state(), "time": time.time(),
        }
        self.audit.write_part(self.step)
        model_state = None
        if self.d.is_main:
            model_state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                           "scaler": self.scaler.state_dict(), "step": self.step}
        path = self.ckpt.save(self.step, model_state, data_state, meta)
        self.last_checkpoint = str(path)
        self._last_ckpt_t = time.monotonic()

    def _maybe_log(self, lag: float | None = None) -> None:
        if self.step % self.cfg.run.log_every_steps:
            return
        now = time.monotonic()
        t_prev, n_prev, train_prev, wait_prev = self._last_log
        dt = max(now - t_prev, 1e-9)
        values: dict[str, Any] = {
            "phase": self.phase, "epoch": self.epoch,
            "loss": self._loss_sum / max(self._loss_n, 1),
            "samples_per_s": (self.trained_global - n_prev) / dt,
            "data_wait_share": (self.wait_s - wait_prev) / max(self.train_s - train_prev, 1e-9),
            "samples_iceberg_rank0": self.c["samples_iceberg"], "samples_kafka_rank0": self.c["samples_kafka"],
        }
        if lag is not None:
            values["kafka_lag"] = lag
        if self.phase == "stream" and self._adaptive_lr():
            values["drift_excess"], values["drift_level"] = self.drift.excess, self.drift.level
        self.metrics.log(self.step, values)
        self._last_log = (now, self.trained_global, self.train_s, self.wait_s)
        self._loss_sum, self._loss_n = 0.0, 0

    def export(self) -> None:
        if self.d.is_main:
            export_model(self.model, self.cfg, self.run_dir, step=self.step, phase=self.phase, positions=self.positions)
