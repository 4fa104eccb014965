"""One optimizer step, and the learning rates it runs at.

`Stepper` owns the model (with several ranks: its gradients averaged by the sparse exchange, or its
dense part under DDP when large or on GPUs, or its tables sharded), the optimizer, the AMP grad
scaler and the drift gauge that sets the stream phase's shared learning rate. The loss is the sum
over a rank's rows divided by the configured batch size: gradients are averaged over ranks, so
every sample weighs the same whatever each rank's row count, and a rank without rows steps on an
empty batch (zero gradients) to keep the collective in step. `step_if_any` also sums the step's
control numbers (row counts, a wish to checkpoint) over ranks, in the exchange's collective.

Before the forward, the ids of the step's rows go to the id -> row maps of the managed tables
(`trainers.models.managed`): all ranks' ids of the step, merged (`IdGather`: one all-gather of
int64s), so every rank admits and evicts the same ids at the same step and a new id gets the same
row everywhere; the rows given to new ids start afresh (`trainers.models.fresh_rows`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from slipstream.samples.spec import Spec
from trainers.config.schema import TrainConfig
from trainers.data.rows import SOURCE_REPLAY, Features, Rows
from trainers.eval.baselines import Baselines
from trainers.eval.online import StreamEvaluator, row_logloss
from trainers.models import build_model
from trainers.models.fresh_rows import restart_sharded, restart_whole
from trainers.optim.drift_gauge import KINDS, DriftGauge
from trainers.optim.groups import build_optimizer, densify_grads, phase_lrs, set_lrs, sharded_optimizer
from trainers.optim.known_users import KnownUsers
from trainers.parallel.dist import Dist
from trainers.parallel.grad_exchange import SparseGradExchange, data_parallel
from trainers.parallel.sharding import gather_state, local_tensors, shard_model


class Stepper:
    def __init__(self, cfg: TrainConfig, d: Dist, spec: Spec) -> None:
        self.cfg, self.d, self.spec = cfg, d, spec
        self.model = build_model(spec, cfg.model, cfg.data.seed).to(d.device)
        o = cfg.optim
        self.sharded = cfg.model.sharding != "none"
        self.exchange: SparseGradExchange | None = None
        self.opt: Any
        if self.sharded:  # the tables split over ranks (TorchRec), the dense part under DDP
            self.net: torch.nn.Module = shard_model(self.model, cfg.model, o.table_optimizer, o.table_lr or o.lr, d)
            self.opt = sharded_optimizer(self.net, o.name, o.lr, o.weight_decay)
        else:  # every rank holds every table; their sparse gradients travel outside DDP
            self.net, self.exchange = data_parallel(self.model, d.world, d.device)
            self.opt = build_optimizer(self.model, o.name, o.lr, o.weight_decay,
                                       o.id_weight_decay if o.id_weight_decay >= 0 else None, o.table_optimizer)
        self.drift = DriftGauge(window_rows=o.drift_window_rows, low=o.drift_low, high=o.drift_high)
        self.known_users = KnownUsers(spec, cfg.model.buckets)
        """Users the batch phase trained: the gauge compares new users' rows with new users' rows."""
        self.baselines = Baselines(spec, d, cfg.model.buckets, o.baseline_lr)
        if self.exchange is not None:  # the baseline's gradients travel with the model's: one exchange a step
            own = self.baselines.take_exchange()
            self.exchange = self.exchange.merged(own) if own is not None else self.exchange
        self.amp = d.device.type == "cuda" and cfg.run.amp
        self.amp_dtype = torch.bfloat16 if cfg.run.amp_dtype == "bfloat16" else torch.float16
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp and self.amp_dtype == torch.float16)
        self.id_gather = IdGather(d)
        self.loss_sum = 0.0
        self.loss_rows = 0
        """Loss summed over the rows trained since `take_loss` (for the progress log)."""

    def step(self, rows: Rows, batch_size: int, fresh: np.ndarray | None = None) -> torch.Tensor:
        """One optimizer step of the model and one of its logistic baseline on the same rows;
        returns the rows' losses (detached, on the device). `fresh`: the rows not replayed."""
        taken = self.step_if_any(rows, batch_size, [1], fresh, agreed=True)  # [1]: taken, whatever the rows
        assert taken is not None
        return taken[0]

    def step_if_any(self, rows: Rows, batch_size: int, control: list[float], fresh: np.ndarray | None = None,
                    *, agreed: bool = False) -> tuple[torch.Tensor, list[float]] | None:
        """Collective: `control` (this rank's row count first, then other small whole numbers)
        summed over ranks, and the step on `rows` when any rank has a row (None when none has: no
        step is taken). Returns the rows' losses and the sums. With the sparse exchange the sums
        travel in its first collective, after this rank's backward pass (an empty batch's costs
        nothing); otherwise in an all-reduce of their own before the step. `agreed`: the caller
        knows some rank has rows (no collective for the sums when nothing else needs one)."""
        if self.exchange is None and not agreed:
            totals = self.d.sum(control)
            if totals[0] == 0:
                return None
        feats = Features.from_rows(rows, pin=self.d.device.type == "cuda").to(self.d.device)
        self.observe_ids(rows)
        with torch.autocast(device_type=self.d.device.type, dtype=self.amp_dtype, enabled=self.amp):
            logits = self.net(feats)
        losses = F.binary_cross_entropy_with_logits(logits.float(), feats.label, reduction="none")
        loss_sum = losses.sum()
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss_sum / batch_size).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        self.baselines.backward(feats, batch_size)
        if self.exchange is not None:  # the model's tables and the baseline, averaged over ranks
            totals = [float(x) for x in self.exchange([int(c) for c in control])]
            if totals[0] == 0:
                return None
        elif agreed:
            totals = list(control)
        if self.baselines.exchange is not None:  # a sharded model: the baseline's own
            self.baselines.exchange()
        if self.cfg.optim.grad_clip:
            densify_grads(list(self.model.parameters()))  # the tables' arrive sparse
            self.scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.scaler.step(self.opt)
        self.scaler.update()
        if len(rows):
            self.loss_sum += float(loss_sum.detach())
            self.loss_rows += len(rows)
        self.baselines.apply(rows, fresh)
        return losses.detach(), totals

    def test_then_train(self, fresh: Rows, replay: Rows, reference: Rows | None, online: StreamEvaluator,
                        passes: int, step: int = 0) -> None:
        """Collective, one stream step: the fresh rows scored by the model as it is (and by the
        baselines, `trainers.eval.online`), then one step on the fresh and replayed rows. The drift
        gauge compares the fresh rows' losses (scored before the step) with the `reference` rows'
        (rows before T no model trains on, scored in the same forward pass); without a reference,
        with the replayed rows' losses in the step."""
        p_fresh, p_ref = online.score_step(self.model, self.baselines, fresh, reference if reference is not None
                                           else fresh.slice(0, 0), passes, step)
        rows = Rows.concat([fresh, replay]) if len(replay) else fresh
        losses = self.step(rows, self.cfg.data.stream_batch_size, fresh=rows.source != SOURCE_REPLAY)
        if not self.adaptive:
            return
        fresh_loss = row_logloss(fresh.label, p_fresh)
        if reference is not None:
            self.gauge_drift(fresh, fresh_loss, reference, row_logloss(reference.label, p_ref))
        else:
            self.gauge_drift(fresh, fresh_loss, replay, losses[len(fresh):].float().cpu().numpy())

    def observe_ids(self, rows: Rows) -> None:
        """Collective when a table is managed (every rank, every step, rows or none): the step's ids
        of every rank into the maps, before the forward; the rows new ids took start afresh."""
        tables = self.model.tables
        if not tables.managed:
            return
        mine = {t: np.unique(v, return_counts=True) for t, v in tables.table_ids(rows.sparse).items()}
        newest = int(rows.event_us.max()) if len(rows) else -1
        if self.d.active:
            mine, newest = self.id_gather(mine, newest)
        for table, (ids, counts) in mine.items():
            seen = tables.managed.map(table).observe(ids, counts, newest)
            if seen.admitted:
                self._restart_rows(table, torch.from_numpy(seen.admitted_rows))

    def _restart_rows(self, table: str, rows: torch.Tensor) -> None:
        if self.sharded:
            restart_sharded(self.net.state_dict(), self.opt.state_dict().get("state", {}), table, rows)
        else:
            restart_whole(self.model.tables.bags(), self.opt.state, table, rows.to(self.d.device))

    def set_dense_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.model.set_dense_stats(mean, std)
        self.baselines.set_dense_stats(mean, std, self.model.dense_standardized)

    def take_loss(self) -> float:
        """Mean loss since the last call."""
        mean = self.loss_sum / max(self.loss_rows, 1)
        self.loss_sum, self.loss_rows = 0.0, 0
        return mean

    # --- learning rates -----------------------------------------------------------------------
    @property
    def adaptive(self) -> bool:
        # the gauge compares fresh rows with replayed ones: without replay there is nothing to compare
        return self.cfg.optim.adaptive_stream_lr and self.cfg.data.replay_share > 0

    def set_lr(self, phase: str) -> None:
        o, dc = self.cfg.optim, self.cfg.data
        drift = self.drift.level if self.adaptive else 1.0
        set_lrs(self.opt, phase_lrs(o.lr, o.stream_lr, dc.batch_size, dc.stream_batch_size, phase, drift),
                o.table_lr / o.lr if o.table_lr else 1.0)

    def gauge_drift(self, fresh: Rows, fresh_loss: np.ndarray, reference: Rows, reference_loss: np.ndarray) -> None:
        """Collective (every rank, every stream step): feed the step's fresh rows' losses (scored
        before the step) and the reference rows' (rows before T the model never trained on, or
        replayed ones) per kind of row (known users, new users), all ranks together, to the drift
        gauge and set the next step's rates from it."""
        kf, kr = self.known_users.kinds(fresh.sparse), self.known_users.kinds(reference.sparse)
        sums: list[float] = []
        for k in range(KINDS):
            f, r = kf == k, kr == k
            # sums over an empty batch are 0: a rank without rows still joins the all-reduce
            sums += [float(fresh_loss[f].sum()), float(f.sum()), float(reference_loss[r].sum()), float(r.sum())]
        total = self.d.sum(sums)
        self.drift.update_kinds([tuple(total[4 * k:4 * k + 4]) for k in range(KINDS)])  # type: ignore[misc]
        self.set_lr("stream")

    # --- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and grad scaler (the drift gauge travels in the meta: it is a few floats).
        A sharded run's model and optimizer state hold its tables as ShardedTensors (this rank's shards)."""
        return {"model": (self.net if self.sharded else self.model).state_dict(), "optimizer": self.opt.state_dict(),
                "scaler": self.scaler.state_dict(), "baselines": self.baselines.state_dict(),
                "known_users": self.known_users.state_dict()}

    def whole_model(self) -> torch.nn.Module | None:
        """Collective for a sharded run: the model with every table whole, on rank 0 (None on the
        others), to export or to keep; the model itself when every rank holds every table."""
        if not self.sharded:
            return self.model
        state = gather_state(self.net, self.d.rank)
        if state is None:
            return None
        whole = build_model(self.spec, self.cfg.model, self.cfg.data.seed)
        whole.load_state_dict(state)
        return whole

    def local_tensors(self) -> list[torch.Tensor]:
        """This rank's tensors of the model and optimizer state (its shards of sharded tables)."""
        return local_tensors({"model": self.net.state_dict(), "optimizer": self.opt.state_dict()})

    def live_state(self) -> dict[str, Any] | None:
        """A sharded run's model and optimizer state, every lazy optimizer state created, for a
        checkpoint to be loaded into in place (each rank its own shards); None when not sharded."""
        if not self.sharded:
            return None
        self.opt.init_state()
        return {"model": self.net.state_dict(), "optimizer": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        (self.net if self.sharded else self.model).load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        if "baselines" in state:
            self.baselines.load_state_dict(state["baselines"])
        if "known_users" in state:  # (a best-epoch state leaves out the users: all epochs trained the same)
            self.known_users.load_state_dict(state["known_users"])


class IdGather:
    """Every rank's (unique ids, occurrences) of each managed table and its newest event time, on
    every rank, merged: one all-gather of int64s, padded to a room every rank agrees on (the largest
    need of the step before plus a quarter); a step that outgrows it takes a second all-gather at
    the exact size. Each rank's block: [need, newest, per table: n], then each table's ids and counts."""

    def __init__(self, d: Dist) -> None:
        self.d = d
        self.room = 256

    def __call__(self, mine: dict[str, tuple[np.ndarray, np.ndarray]], newest: int
                 ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
        import torch.distributed as dist

        tables = sorted(mine)
        head = [0, newest, *(len(mine[t][0]) for t in tables)]
        block = np.concatenate([np.asarray(head, dtype=np.int64)] + [np.concatenate(mine[t]).astype(np.int64) for t in tables])
        block[0] = len(block)
        room = self.room
        dev = self.d.device if self.d.backend == "nccl" else torch.device("cpu")  # NCCL moves CUDA tensors only
        for _ in range(2):
            out = [torch.zeros(room, dtype=torch.int64, device=dev) for _ in range(self.d.world)]
            sent = torch.zeros(room, dtype=torch.int64)
            sent[: min(room, len(block))] = torch.from_numpy(block[:room])
            dist.all_gather(out, sent.to(dev))
            need = max(int(o[0]) for o in out)
            if need <= room:
                break
            room = need  # someone's block did not fit: again at the exact size
        self.room = max(256, need + need // 4)
        blocks = [o.cpu().numpy() for o in out]
        merged = {t: merge_counts([_table_part(b, tables, j) for b in blocks]) for j, t in enumerate(tables)}
        return merged, max(int(b[1]) for b in blocks)


def _table_part(block: np.ndarray, tables: list[str], j: int) -> tuple[np.ndarray, np.ndarray]:
    sizes = block[2: 2 + len(tables)]
    at = 2 + len(tables) + 2 * int(sizes[:j].sum())
    n = int(sizes[j])
    return block[at: at + n], block[at + n: at + 2 * n]


def merge_counts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Several ranks' (unique ids, occurrences) as one: sorted unique ids and their summed counts."""
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    uniq, inverse = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
    counts = np.zeros(len(uniq), dtype=np.int64)
    np.add.at(counts, inverse, np.concatenate([p[1] for p in parts]))
    return uniq, counts
