"""The training job: batch phase over the planned window, handoff at T, stream phase.

Every rank runs the same loop; one small all-reduce per step tells all ranks how many rows the
step has globally, whether rank 0 wants a checkpoint or a stop, and whether any rank was signalled
to stop (a graceful stop, `trainers.parallel.graceful_stop`: all ranks commit a checkpoint after that
step and exit), so all ranks take the same number of optimizer steps (a rank without rows steps on
an empty batch) and decide together.

The job is assembled from pieces that each save and restore their own state, registered once in
a `CheckpointPieces` registry with where each is stored (`trainers.checkpoint.pieces`): the run's
lineage, counters and positions, the stream profile, the drift gauge and early stopping (meta);
the model, optimizer and baselines (`Stepper`, model); the batch cursor, the stream shuffle, the
replay reservoir and the prequential scores (data, per rank, re-dealt on another world size).
Checkpoint and resume loop over the registry. What the run reads comes from its plan
(`slipstream.pipeline.runplan`).

Score before you learn: the validation days are never trained, replayed or used for the dense
features' scaling; every stream row is scored by the model as it is before the step that trains
on it (`trainers.eval.online`); the last part of the stream by event time, the forward tail, is
never trained and decides promotion (`trainers.data.forward_tail`). The ids every evaluation
scored go to `evaluated/` next to the audit of what was trained.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import torch

from slipstream.errors import ResumeError
from slipstream.lake.iceberg import get_catalog
from slipstream.pipeline.runplan import RunPlan, check_plan_files
from slipstream.samples.spec import Spec
from slipstream.settings import Settings
from slipstream.stream.handoff import find_handoff
from slipstream.stream.kafka import KafkaAccess, create_topic
from trainers.checkpoint.pieces import CheckpointPieces
from trainers.checkpoint.store import Checkpointer, atomic_torch_save
from trainers.config.plan import RunLineage, plan_for_config
from trainers.config.schema import TrainConfig
from trainers.data import stream_profile
from trainers.data.dedupe import SampleIdDedupe
from trainers.data.dense_stats import window_dense_stats
from trainers.data.forward_tail import plan_forward_tail
from trainers.data.iceberg_source import IcebergSource
from trainers.data.kafka_source import KafkaSource, assigned_partitions
from trainers.data.mixer import ReplayReservoir, StreamShuffle, exchange, replay_count
from trainers.data.progress import BatchCursor, RunProgress, Throughput, TrainState
from trainers.data.rows import SOURCE_KAFKA, RowLayout, Rows
from trainers.data.units import Opener, WorkUnit, file_opener, plan_units
from trainers.eval.best_epoch import BestEpoch
from trainers.eval.online import StreamEvaluator, live_set
from trainers.eval.sets import validation_rows
from trainers.eval.validation import EarlyStopping
from trainers.finish import RunOutcome
from trainers.models.export import export_model
from trainers.observe.freshness import FreshnessTracker
from trainers.observe.run_metrics import MetricsLogger, ProgressLog
from trainers.observe.sample_audit import AuditWriter, drop_uncommitted
from trainers.observe.world_log import WorldLog
from trainers.parallel.dist import Dist
from trainers.parallel.graceful_stop import REQUEST as STOP_REQUEST
from trainers.parallel.graceful_stop import GracefulStop
from trainers.step import Stepper

log = logging.getLogger(__name__)

CHECKPOINT_LAYOUT = 2
"""meta.json holds `{layout, step, world, time, <meta piece>: state ...}`; layout 1 spread the run's
counters over the top level and routed every piece by hand."""


def _us(t: Any) -> int:
    return int(t.timestamp() * 1_000_000)


class Trainer:
    def __init__(self, cfg: TrainConfig, d: Dist, settings: Settings, spec: Spec, open_file: Opener | None = None) -> None:
        self.cfg, self.d, self.settings, self.spec = cfg, d, settings, spec
        self.layout = RowLayout.from_spec(spec)
        self.broker = KafkaAccess.from_settings(settings, cfg.data.bootstrap)  # address + security of every client
        self.run_dir = cfg.run.run_dir
        if cfg.run.num_threads:
            torch.set_num_threads(cfg.run.num_threads)
        self.stepper = Stepper(cfg, d, spec)
        self.ckpt = Checkpointer(self.run_dir / "checkpoint", d.rank, d.barrier, cfg.run.keep_checkpoints)
        self.metrics = MetricsLogger(self.run_dir, d.is_main, cfg.run.tensorboard)
        self.progress = ProgressLog(self.metrics, cfg.run.log_every_steps)
        self.audit = AuditWriter(self.run_dir / "audit", d.rank)
        self.evaluated = AuditWriter(self.run_dir / "evaluated", d.rank)
        """The ids each evaluation scored (and the replayed ones), with the step of the scoring model."""
        self.worlds = WorldLog(self.run_dir, d.is_main, d.world)
        self.state = TrainState()
        self.tp = Throughput()
        self.profile_piece = stream_profile.StreamProfilePiece(spec, d.gather, d.rank)
        self.progress_piece = RunProgress(self.state, d)
        self.batch_cursor = BatchCursor(self.state, d.rank, d.world)
        self.plan: RunPlan | None = None
        self._open_file = open_file
        self.open_file: Opener = open_file  # type: ignore[assignment]  # set by setup()
        self.cache_reader: Any = None
        self.iceberg: IcebergSource | None = None
        self.kafka: KafkaSource | None = None
        self.shuffle = StreamShuffle(cfg.data.stream_shuffle_buffer, cfg.data.seed, d.rank, self.layout, d.world)
        self.t_us = _us(cfg.data.t_handoff)
        # its window ends where the batch phase's training rows end, once the plan is known (`setup`)
        self.replay = ReplayReservoir(cfg.data.replay_reservoir, self.t_us, cfg.data.seed, d.rank, self.layout,
                                      d.world, end_us=self.t_us)
        self.online = StreamEvaluator(spec, d.device, cfg.data.prequential_max_rows, d.rank, d.world, cfg.data.seed,
                                      self.layout)
        self.freshness = FreshnessTracker(self.run_dir, d.is_main, cfg.data.seed)
        self.early = EarlyStopping(cfg.data.patience)
        self.best = BestEpoch(self.early, d, self.run_dir / "checkpoint")
        self.dedupe = SampleIdDedupe(cfg.data.dedupe_horizon_s or cfg.data.max_lateness_s + 3 * spec.label.window_s,
                                     cfg.data.dedupe_max_ids)
        self.val_rows: Rows = Rows.empty(self.layout)
        self.units: list[WorkUnit] = []
        """The planned window's work units (set by `setup`)."""
        self._last_ckpt_t = time.monotonic()
        self.pieces = CheckpointPieces()
        """Every piece a checkpoint holds; `lineage` joins them first once `setup` knows the plan."""

    @property
    def profile(self) -> Any:
        """The stream's feature profile this rank has seen (rank 0: with a resumed run's earlier part)."""
        return self.profile_piece.profile

    def _register_pieces(self, plan: RunPlan) -> None:
        """The registry, in the order every rank saves it (meta pieces may run collectives). The
        id -> row maps of managed tables are buffers of the model, alike on every rank (merged every
        step): they travel in `model`, with the rows they index, and load on any world size."""
        add = self.pieces.add
        add("lineage", RunLineage(plan, self.cfg.model.sharding), "meta")
        add("run", self.progress_piece, "meta")
        add("profile", self.profile_piece, "meta")
        add("drift", self.stepper.drift, "meta", optional=True)
        add("early_stopping", self.early, "meta", optional=True)
        add("model", self.stepper, "model")
        add("iceberg", self.batch_cursor, "data")
        add("replay", self.replay, "data")
        add("shuffle", self.shuffle, "data")
        add("prequential", self.online.scores, "data")
        add("dedupe", self.dedupe, "data")

    # --- setup ------------------------------------------------------------------------------
    def setup(self, plan: RunPlan | None) -> list[WorkUnit]:
        """Collective: rank 0 checks that the plan lists exactly the window's files at its snapshot
        (without a plan it plans the run from the config); every rank gets the plan and its units."""
        dc = self.cfg.data
        settings = dataclasses.replace(self.settings, catalog=dc.catalog, namespace=dc.namespace)
        table = get_catalog(settings).load_table(f"{dc.namespace}.{dc.table}")
        opener, self.cache_reader = file_opener(table.io, dc.cache_dir or None)
        self.open_file = self._open_file or opener
        planned: tuple[RunPlan, list[WorkUnit], Any] | None = None
        if self.d.is_main:
            if plan is None:
                plan = plan_for_config(self.cfg, table, self.spec)
            else:
                check_plan_files(table, plan)
            units = plan_units(plan.window_plan, self.open_file)
            # scaled by the rows the batch phase trains: never the validation days or the hold-out
            stats = (window_dense_stats(units, self.open_file, self.layout, start_us=_us(plan.window_start),
                                        end_us=_us(self._train_end(plan)))
                     if any(f.standardize for f in self.spec.dense) else None)
            planned = (plan, units, stats)
        received: tuple[RunPlan, list[WorkUnit], Any] = self.d.broadcast(planned)
        self.plan, units, stats = received
        train_end_us = _us(self.train_end())
        self.replay.start_us = train_end_us - int(dc.replay_window_hours * 3600 * 1e6)
        self.replay.end_us = train_end_us  # a row of the validation days never enters
        self.units = units
        self._register_pieces(self._plan())
        if stats is not None:  # a resumed run's checkpoint restores the same numbers with the weights
            self.stepper.set_dense_stats(*(torch.as_tensor(s, dtype=torch.float32) for s in stats))
        return units

    def resume(self) -> bool:
        """Collective: every piece back from the latest committed checkpoint; False when there is none."""
        latest = self.ckpt.latest()
        if latest is None:
            return False
        if not self.cfg.run.resume:
            raise ResumeError(f"{self.run_dir} already holds checkpoint {latest.name} and run.resume is false: "
                              "use a new run.run_id")
        meta = self.ckpt.load_meta(latest)
        if meta.get("layout") != CHECKPOINT_LAYOUT:
            raise ResumeError(f"checkpoint {latest} was written in layout {meta.get('layout', 1)!r}; this Slipstream reads "
                              f"layout {CHECKPOINT_LAYOUT}: finish the run with the Slipstream that wrote it, "
                              "or use a new run.run_id")
        self.pieces.load("meta", meta, str(latest))  # the lineage first: a checkpoint of other data is refused
        self.pieces.load("model", self.ckpt.load_model(latest, into=self._live_model()), str(latest))
        st = self.state
        if st.phase != "batch":  # buffered stream rows go to the rank that now reads their partition
            self.shuffle.partitions = self.dedupe.partitions = assigned_partitions(sorted(st.positions), self.d.rank,
                                                                                  self.d.world)
        self.pieces.load_data([self.ckpt.load_data(latest, r) for r in range(int(meta["world"]))])
        if self.d.is_main:
            drop_uncommitted(self.run_dir / "audit", st.step)
            drop_uncommitted(self.run_dir / "evaluated", st.step)
        self.d.barrier()
        self.stepper.set_lr(st.phase)
        log.info("rank %d resumes %s at step %d (phase %s, epoch %d)", self.d.rank, latest.name, st.step, st.phase, st.epoch)
        return True

    def _live_model(self) -> dict[str, Any] | None:
        """A sharded run loads its tables in place, each rank its own shards (`Stepper.live_state`)."""
        live = self.stepper.live_state()
        return None if live is None else {"model": live}

    def _plan(self) -> RunPlan:
        if self.plan is None:
            raise RuntimeError("Trainer.setup() must run first: it fixes the run's plan")
        return self.plan

    # --- one optimizer step -----------------------------------------------------------------
    def train_step_if_any(self, rows: Rows, batch_size: int, control: list[float]) -> list[float] | None:
        """Collective: one optimizer step when any rank has rows; `control` (this rank's row count
        first) summed over ranks, or None when no rank had a row (no step taken)."""
        taken = self.stepper.step_if_any(rows, batch_size, control)
        if taken is None:
            return None
        self.state.step += 1
        self.worlds.stepped(self.state.step)
        return taken[1]

    def _flags(self) -> float:
        """Rank 0's wish to checkpoint now, as a number summed over ranks with the step."""
        if not self.d.is_main:
            return 0.0
        r, step = self.cfg.run, self.state.step
        due = step > 0 and ((step + 1) % r.checkpoint_every_steps == 0 or
                            (r.checkpoint_every_s > 0 and time.monotonic() - self._last_ckpt_t >= r.checkpoint_every_s))
        return float(due)

    # --- graceful stop (trainers.parallel.graceful_stop) ------------------------------------------
    def stop_agreed(self) -> bool:
        """Collective: whether any rank has been asked to stop (before the first step of a world)."""
        return self.d.sum([STOP_REQUEST.wish()])[0] > 0

    def _stop_if_asked(self, g_stop: float) -> None:
        """After a step every rank took: when any rank was signalled (`g_stop`, summed with the
        step's control values), commit a checkpoint that holds the step and raise GracefulStop."""
        if not g_stop:
            return
        self.checkpoint()
        self.worlds.stopped(self.state.step, self.state.last_checkpoint, int(g_stop))
        raise GracefulStop(self.state.step, self.state.last_checkpoint, int(g_stop))

    # --- batch phase ------------------------------------------------------------------------
    def train_end(self) -> datetime:
        """Where the batch phase's training rows end: T minus the validation days (T itself when
        the window is too short to give any up: then no validation, see `epoch_cap`)."""
        return self._train_end(self._plan())

    def _train_end(self, plan: RunPlan) -> datetime:
        days = self.cfg.data.validation_days
        if days and days >= plan.window_days:
            if not getattr(self, "_warned_short", False):
                log.warning("a %d-day window leaves no training day with data.validation_days=%g: no time validation, "
                            "so one pass over the window (data.validation_days=0 trains data.epochs passes unchecked)",
                            plan.window_days, days)
                self._warned_short = True
            return plan.t_handoff
        return plan.t_handoff - timedelta(days=days)

    def epoch_cap(self) -> int:
        """Passes over the window: `data.epochs` with validation to stop earlier, or when the user
        turned validation off (`validation_days` 0); one pass when the window is too short to
        validate on (more passes with nothing to tell when to stop would only memorise it)."""
        dc = self.cfg.data
        if dc.validation_days and self.train_end() >= self._plan().t_handoff:
            return 1
        return dc.epochs

    def batch_phase(self, units: list[WorkUnit]) -> None:
        dc, st, tp, plan = self.cfg.data, self.state, self.tp, self._plan()
        train_end_us = _us(self.train_end())
        src = IcebergSource(units, self.open_file, rank=self.d.rank, world=self.d.world, seed=dc.seed,
                            batch_size=dc.batch_size, shuffle_rows=dc.shuffle_buffer,
                            window_us=(_us(plan.window_start), train_end_us), prefetch_chunks=dc.prefetch_chunks,
                            layout=self.layout)
        self.iceberg = self.batch_cursor.source = src
        if self.batch_cursor.resumed is not None:
            src.load_state_dict(self.batch_cursor.resumed)
            self.batch_cursor.resumed = None
        validating = train_end_us < self.t_us
        if validating:
            self.val_rows = validation_rows(units, self.open_file, self.layout, train_end_us, self.t_us,
                                            self.d.rank, self.d.world, max(1, dc.eval_max_rows // self.d.world))
        try:
            while st.epoch < self.epoch_cap() and not self.early.stopped:
                src.start_epoch(st.epoch)
                # the reservoir samples trained rows, each once (the first epoch trains them all)
                replay = dc.replay_share > 0 and st.epoch == 0
                self.stepper.baselines.count_popularity = st.epoch == 0
                while True:
                    t0 = time.perf_counter()
                    w0 = src.wait_s
                    rows = src.next_batch()
                    tp.wait_s += src.wait_s - w0
                    n = len(rows) if rows is not None else 0
                    rows = rows if rows is not None else Rows.empty(self.layout)
                    # every rank's row count and rank 0's wish to checkpoint travel with the step's
                    # own collectives: no step is taken once no rank has rows left
                    totals = self.train_step_if_any(rows, dc.batch_size, [n, self._flags(), STOP_REQUEST.wish()])
                    if totals is None:
                        break
                    g_n, g_ckpt, g_stop = totals
                    if replay:
                        self.replay.offer(rows)
                    self.stepper.known_users.mark(rows.sparse)
                    self.audit.add(rows, st.step)
                    st.counters["samples_iceberg"] += n
                    tp.trained_global += int(g_n)
                    tp.train_s += time.perf_counter() - t0
                    self._maybe_log()
                    self._stop_if_asked(g_stop)
                    if g_ckpt:
                        self.checkpoint()
                src.close()
                if validating:
                    if st.epoch == 0:  # the same rows every epoch: their ids once
                        self.evaluated.add_scored(self.val_rows, st.step, "validation")
                    self.best.validate(st.epoch, self.stepper, self.val_rows)
                st.epoch += 1
                self.checkpoint()  # an epoch boundary: resumable on any world size
            self._maybe_log(last=True)
        finally:
            src.close()
        if validating:
            self.best.restore(st.epoch - 1, self.stepper)

    # --- handoff ----------------------------------------------------------------------------
    def handoff(self) -> None:
        dc, plan = self.cfg.data, self._plan()
        found: Any = None
        whole = self.stepper.whole_model()
        if self.d.is_main:
            assert whole is not None
            h = find_handoff(self.broker, dc.topic, plan.t_handoff, dc.max_lateness_s)
            create_topic(self.broker, dc.dlq_topic, 1)
            atomic_torch_save({"model": whole.state_dict()}, self.batch_only_path())
            tail = plan_forward_tail(self.broker, dc.topic, self.spec, self.t_us,
                                     dc.forward_tail_share if dc.stop.mode != "continuous" else 0.0)
            found = (h.offsets, {p: ph.method for p, ph in h.partitions.items()}, tail)
        offsets, methods, tail = self.d.broadcast(found)
        st = self.state
        st.handoff_offsets, st.handoff_methods = offsets, methods
        st.forward_tail_start_us = tail
        st.positions = dict(offsets)
        st.phase = "stream"
        self.stepper.baselines.count_popularity = True  # fresh stream rows count once each
        self.stepper.set_lr(st.phase)
        self.checkpoint()

    def _prepare_stream_evaluation(self) -> None:
        """The batch-only model (a sharded model's tables are not copied to every rank: its
        batch-only scores come at the end), the drift gauge's reference rows (the validation
        days) and the generator's truth, also after a resume in the stream phase."""
        dc, plan = self.cfg.data, self._plan()
        if self.train_end() < plan.t_handoff and not len(self.val_rows):
            self.val_rows = validation_rows(self.units, self.open_file, self.layout, _us(self.train_end()), self.t_us,
                                            self.d.rank, self.d.world, max(1, dc.eval_max_rows // self.d.world))
        self.online.prepare(None if self.stepper.sharded else self.batch_only_path(), self.cfg.model, self.val_rows,
                            dc.generator_manifest, self.t_us)

    def batch_only_path(self) -> Path:
        """Where the handoff saves the model as the batch phase left it (the stream's comparison)."""
        p = self.run_dir / "checkpoint" / "batch_only"
        p.mkdir(parents=True, exist_ok=True)
        return p / "model.pt"

    # --- stream phase -----------------------------------------------------------------------
    def stream_phase(self) -> None:
        dc, stop, st, tp = self.cfg.data, self.cfg.data.stop, self.state, self.tp
        st.my_partitions = parts = assigned_partitions(sorted(st.positions), self.d.rank, self.d.world)
        self.shuffle.partitions = parts
        src = KafkaSource(bootstrap=self.broker, topic=dc.topic, dlq_topic=dc.dlq_topic, partitions=parts,
                          positions=st.positions, t_handoff_us=self.t_us, consume_batch=dc.consume_batch,
                          consume_timeout_s=dc.consume_timeout_s, lag_interval_s=dc.lag_interval_s,
                          group=f"slipstream-train-{self.cfg.run.run_id}", spec=self.spec,
                          max_future_skew_s=dc.max_future_skew_s, forward_tail_start_us=st.forward_tail_start_us,
                          max_age_s=dc.max_age_s, dedupe=self.dedupe)
        self.kafka = src
        self._prepare_stream_evaluation()
        n_replay_per_fresh = dc.replay_share / (1 - dc.replay_share)
        fresh_target = max(1, dc.stream_batch_size - replay_count(dc.stream_batch_size, dc.replay_share))
        passes = self.online.passes(dc.stream_batch_size, dc.stream_batch_size)
        # the drift gauge's reference: the validation days (never trained), else the replayed rows
        val_reference = self.train_end() < self._plan().t_handoff
        started = time.monotonic() - st.stream_elapsed_s
        last_export = time.monotonic()
        kafka_global = self.d.sum([float(st.counters["samples_kafka"])])[0]  # counts a resumed run's earlier part
        try:
            while True:
                t0 = time.perf_counter()
                w0 = src.wait_s
                buffered = len(self.shuffle)
                # wait for the broker only when there is too little to train; stop reading ahead
                # when the buffer is far past its size (back-pressure bounds memory)
                if buffered < 4 * dc.stream_shuffle_buffer + fresh_target:
                    fresh = src.poll(block=buffered < fresh_target)
                else:
                    fresh = Rows.empty(self.layout)
                self._absorb(src)
                stream_profile.add_rows(self.profile, fresh, self.layout)
                if dc.exchange:
                    fresh = self._exchange(fresh)
                self.shuffle.add(fresh)
                batch = self.shuffle.take(fresh_target, idle=src.idle)
                lag = src.lag(refresh=src.idle)
                # waiting on the broker is data wait; so is a whole iteration with nothing to train
                tp.wait_s += (time.perf_counter() - t0) if not len(batch) else (src.wait_s - w0)
                elapsed = time.monotonic() - started
                st.stream_elapsed_s = elapsed
                export_due = float(self.d.is_main and stop.mode == "continuous"
                                   and time.monotonic() - last_export >= stop.export_every_min * 60)
                timeout = float(self.d.is_main and stop.timeout_s > 0 and elapsed >= stop.timeout_s)
                over = float(self.d.is_main and stop.mode == "duration" and elapsed >= stop.duration_s)
                g = self.d.sum([len(batch), lag, len(self.shuffle), self._flags(), export_due, timeout, over, float(not src.idle),
                                STOP_REQUEST.wish()])
                g_n, g_lag, g_buf, g_ckpt, g_export, g_timeout, g_over, g_busy, g_stop = g
                if g_n > 0:
                    n_replay = int(round(len(batch) * n_replay_per_fresh))
                    ref = self.online.draw_reference(n_replay if val_reference and self.stepper.adaptive else 0, st.step)
                    replay = self.replay.draw(n_replay)
                    self.evaluated.add_scored(batch, st.step, "prequential")  # scored by the model of this step
                    self.evaluated.add_scored(replay, st.step, "replay")
                    self.stepper.test_then_train(batch, replay, ref if val_reference else None, self.online, passes, st.step)
                    st.step += 1
                    self.worlds.stepped(st.step)
                    self.freshness.trained(batch.event_us)
                    self.audit.add(batch, st.step)
                    self._record_latency(batch)
                    st.counters["samples_kafka"] += len(batch)
                    st.counters["samples_replay"] += len(replay)
                    kafka_global += g_n
                    tp.trained_global += int(g_n)
                    tp.train_s += time.perf_counter() - t0
                    self._maybe_log(lag=g_lag)
                else:
                    tp.train_s += time.perf_counter() - t0
                st.lag_at_stop = int(g_lag)
                if g_export:
                    self.export()
                    last_export = time.monotonic()
                    g_ckpt = 1
                # idle ranks refreshed their watermarks this step, so the lag is current, not cached
                if stop.mode == "caught_up" and g_lag <= stop.max_lag and g_buf == 0 and g_busy == 0:
                    st.stop_reason = f"caught up (lag {int(g_lag)} <= {stop.max_lag})"
                elif stop.mode == "samples" and kafka_global >= stop.samples:
                    st.stop_reason = f"trained {int(kafka_global)} stream samples"
                elif g_over:
                    st.stop_reason = f"stream phase ran {stop.duration_s:.0f}s"
                elif g_timeout:
                    st.stop_reason = f"stream timeout {stop.timeout_s:.0f}s"
                    log.warning("stream phase stopped by data.stop.timeout_s with lag %d", int(g_lag))
                if st.stop_reason:
                    st.stop_offsets = self._stop_offsets(src)
                    self._maybe_log(lag=g_lag, last=True)
                    break
                self._stop_if_asked(g_stop)
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
        buffered rows back to the rank owning their partition (trainers.data.progress.resume_point)."""
        if self.d.world <= 1:
            return fresh
        t0 = time.perf_counter()
        rows, sent = exchange(fresh, self.d.all_to_all_object, self.d.world, self.d.rank, self.cfg.data.seed,
                              self.state.step)
        self.tp.exchanged_rows += sent
        self.tp.exchange_s += time.perf_counter() - t0
        return rows

    def _stop_offsets(self, src: KafkaSource) -> dict[int, int]:
        """Collective: every partition's committed end at the stop (what the audit counts up to)."""
        merged: dict[int, int] = {}
        for ends in self.d.gather(src.stop_offsets()):
            merged.update(ends)
        return merged

    def global_positions(self) -> dict[int, int]:
        """Collective: every partition's next offset (each rank reports the partitions it reads)."""
        return self.progress_piece.global_positions()

    def _absorb(self, src: KafkaSource) -> None:
        s, c = src.counters, self.state.counters
        c["dropped_before_t"] += s.dropped_before_t
        c["dead_letters"] += s.dead_letters
        c["duplicates"] += s.duplicates
        c["holdout_stream"] += s.holdout
        c["forward_tail_stream"] += s.forward_tail
        c["records_kafka"] += s.records
        newest = s.newest_event_us
        reasons = dict(s.dead_reasons)
        s.__init__()  # type: ignore[misc]
        s.newest_event_us = newest
        s.dead_reasons = reasons
        self.state.positions.update(src.positions)
        self.audit.add_dead_letters(src.take_dead_letters(), self.state.step)
        self.audit.add_dead_letters(src.take_duplicates(), self.state.step, source="duplicate")

    def _record_latency(self, batch: Rows) -> None:
        lat = self.tp.latencies_ms
        if len(batch) and self.d.is_main and sum(len(x) for x in lat) < 200_000:
            lat.append(time.time() * 1000 - batch.consumed_ms[batch.source == SOURCE_KAFKA])

    # --- checkpoint, logs, export, finish ------------------------------------------------------
    def checkpoint(self) -> None:
        """Collective: every registered piece's state, committed together (trainers.checkpoint.store)."""
        st = self.state
        if self.kafka is not None:
            self.kafka.flush_dead_letters()
        meta = {"layout": CHECKPOINT_LAYOUT, "step": st.step, "world": self.d.world, "time": time.time(),
                **self.pieces.state_dicts("meta")}
        data = self.pieces.state_dicts("data")
        self.audit.write_part(st.step)
        self.evaluated.write_part(st.step)
        if st.phase == "batch":  # the users every rank trained, for rank 0 to save; fixed from the handoff on
            self.stepper.known_users.merge(self.d)
        model = {**self.pieces.state_dicts("model"), "step": st.step}  # every rank: they write its tensors together
        st.last_checkpoint = str(self.ckpt.save(st.step, model, data, meta))
        self._last_ckpt_t = time.monotonic()

    def _maybe_log(self, lag: float | None = None, *, last: bool = False) -> None:
        """A metrics.jsonl line every `run.log_every_steps` steps; `last`: the phase's last step too,
        unless it was just logged (a run shorter than the interval still has its curve)."""
        st, tp = self.state, self.tp
        if not (self.progress.due(st.step) or (last and self.progress.logged_step != st.step and st.step > 0)):
            return
        values: dict[str, Any] = {"phase": st.phase, "epoch": st.epoch, "world": self.d.world,
                                  "samples_iceberg_rank0": st.counters["samples_iceberg"],
                                  "samples_kafka_rank0": st.counters["samples_kafka"]}
        if lag is not None:
            values["kafka_lag"] = lag
        if st.phase == "stream" and self.stepper.adaptive:
            values["drift_excess"], values["drift_level"] = self.stepper.drift.excess, self.stepper.drift.level
        self.progress.log(st.step, self.stepper.take_loss(), tp.trained_global, tp.train_s, tp.wait_s, values)

    def export(self) -> None:
        """Collective (a sharded model is gathered): rank 0 exports the model and records its
        freshness (event-to-export latency, the live model's prequential AUC since the last export)."""
        whole = self.stepper.whole_model()
        live = live_set(self.online.scores, self.d.gather, self.d.is_main)
        events = self.freshness.collect(self.d.gather)
        if self.d.is_main:
            assert whole is not None and events is not None
            export_model(whole, self.cfg, self.spec, self.run_dir, step=self.state.step, phase=self.state.phase,
                         positions=self.state.positions)
            self.freshness.exported(events, live=live, step=self.state.step)

    def outcome(self, units: list[WorkUnit]) -> RunOutcome:
        """Collective (it gathers the final positions): what `finish` evaluates and reports."""
        self.global_positions()
        return RunOutcome(
            cfg=self.cfg, plan=self._plan(), run_dir=self.run_dir, broker=self.broker, model=self.stepper.model,
            whole=self.stepper.whole_model(), units=units,
            open_file=self.open_file, state=self.state, throughput=self.tp, profile=self.profile,
            drift=self.stepper.drift, newest_event_us=self.kafka.counters.newest_event_us if self.kafka else -1,
            cache=self.cache_reader.stats() if self.cache_reader is not None else None, amp=self.stepper.amp,
            settings=self.settings, baselines=self.stepper.baselines, early=self.early, train_end=self.train_end(),
            online=self.online, sharded=self.stepper.sharded, freshness=self.freshness,
        )
