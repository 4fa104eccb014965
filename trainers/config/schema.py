"""The trainer's configuration: nested typed dataclasses, parsed once at the entry point.

A config file (YAML or JSON) holds the sections `data`, `model`, `optim`, `run`; `--set
section.key=value` overrides any field (values are parsed as YAML scalars/lists). Every field is
validated in `__post_init__` so a bad value fails at start with its dotted name, never mid-run.
Deployment defaults (catalog name, Kafka bootstrap, runs folder) come from `slipstream.settings`
when the file leaves them empty.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, get_args

from slipstream.lake.planning import window_bounds
from slipstream.pipeline.request import TRAINER_KNOBS
from slipstream.pipeline.runlayout import RUN_ID_PATTERN, run_folder
from slipstream.pipeline.runplan import DEFAULT_MAX_LATENESS_S
from slipstream.samples.schema import SAMPLES_TABLE
from slipstream.settings import Settings
from trainers.config.parse import apply_override, build, check_choices, load_raw, parse_time, require


def knob(key: str) -> Any:
    """A field set by a training param (`slipstream.pipeline.request.KNOBS`): its default is the
    knob's, and `check_knobs` holds it to the knob's bounds, so the DAG's form, the request and
    the trainer cannot disagree."""
    return field(default=TRAINER_KNOBS[key].default, metadata={"knob": key})


def check_knobs(obj: Any) -> None:
    """Every knob-set field of dataclass `obj` within its knob's bounds (converted to its type)."""
    for f in dataclasses.fields(obj):
        if "knob" in f.metadata:
            key = f.metadata["knob"]
            setattr(obj, f.name, TRAINER_KNOBS[key].check(getattr(obj, f.name), key))


StopMode = Literal["caught_up", "duration", "samples", "continuous"]
ModelKind = Literal["dlrm", "dcn_v2", "deepfm", "wide_deep"]
Sharding = Literal["none", "auto", "table_wise", "column_wise", "row_wise", "table_row_wise"]
OptimizerName = Literal["adam", "adamw", "adagrad", "sgd"]
TableOptimizer = Literal["dense", "sparse_adam", "adagrad"]
Device = Literal["auto", "cpu", "cuda"]
AmpDtype = Literal["bfloat16", "float16"]
CpuAffinity = Literal["none", "per_rank"]
STOP_MODES: tuple[StopMode, ...] = get_args(StopMode)
MODEL_KINDS: tuple[ModelKind, ...] = get_args(ModelKind)
SHARDINGS: tuple[Sharding, ...] = get_args(Sharding)


@dataclass(kw_only=True)
class StopConfig:
    """When the stream phase ends."""

    mode: StopMode = "caught_up"
    """`caught_up`: stop once the total lag is <= max_lag; `duration`: after duration_s of stream
    training; `samples`: after `samples` fresh stream samples; `continuous`: never (export every
    export_every_min minutes)."""
    max_lag: int = 0
    """caught_up: records still unread across all partitions at which the tail counts as caught up."""
    duration_s: float = 60.0
    """duration: seconds of stream phase (wall clock, measured from the start of the stream phase)."""
    samples: int = 0
    """samples: fresh stream samples to train (all ranks together) before stopping."""
    export_every_min: float = 10.0
    """continuous: export the model (and checkpoint) every this many minutes."""
    timeout_s: float = 0.0
    """Hard cap on the stream phase in any finite mode (0 = none): stops with a warning, e.g. when
    the broker stays unreachable."""

    def __post_init__(self) -> None:
        check_choices(self, "data.stop")
        require(self.max_lag >= 0, f"data.stop.max_lag must be >= 0, got {self.max_lag}")
        require(self.duration_s > 0, f"data.stop.duration_s must be > 0, got {self.duration_s}")
        require(self.samples >= 0, f"data.stop.samples must be >= 0, got {self.samples}")
        require(
            self.mode != "samples" or self.samples > 0, "data.stop.mode is 'samples': set data.stop.samples > 0"
        )
        require(self.export_every_min > 0, f"data.stop.export_every_min must be > 0, got {self.export_every_min}")
        require(self.timeout_s >= 0, f"data.stop.timeout_s must be >= 0, got {self.timeout_s}")


@dataclass(kw_only=True)
class DataConfig:
    """What to train on: the batch window at a pinned snapshot, then the Kafka tail."""

    snapshot_id: int
    """Iceberg snapshot to read the batch window from. Required: a run never reads "the latest"."""
    t_handoff: datetime
    """T, the handoff time (ISO-8601 with a timezone, e.g. 2026-11-04T00:00:00+00:00; from a plan
    the plan's datetime): the batch window ends before T and the stream starts at T."""
    catalog: str = ""
    """pyiceberg catalog name (empty: SLIPSTREAM_CATALOG)."""
    namespace: str = ""
    """Iceberg namespace (empty: SLIPSTREAM_NAMESPACE)."""
    table: str = SAMPLES_TABLE
    """Iceberg table of samples inside the namespace."""
    window_days: int = knob("data.window_days")
    """W: the batch window is [T - W days, T)."""
    max_lateness_s: float = DEFAULT_MAX_LATENESS_S
    """How late (in seconds after its event time) a record can reach Kafka; the stream is read
    from the offsets of T - max_lateness and records before T are dropped."""
    max_future_skew_s: float = 3600.0
    """A stream record whose event_time is more than this ahead of the consumer's clock (or before
    1970) is a dead letter, never trained: it would set the run's freshness to a time to come."""
    max_age_s: float = 400 * 86_400.0
    """A stream record whose event_time is more than this before T is a dead letter ('event_time
    out of range': 1971, a 0 default, a wrong unit), never counted as dropped before T; 0: no limit.
    The joiner's --max-age-s, measured from the run's T instead of the clock."""
    dedupe_horizon_s: float = 0.0
    """Stream phase: a record whose sample id was admitted with an event time within this many
    seconds of its partition's newest one is a duplicate (dead-lettered, trained once). 0: the
    joiner's reach plus a margin, data.max_lateness_s + 3 attribution windows of the spec."""
    dedupe_max_ids: int = 1_000_000
    """Sample ids remembered per partition for the dedupe (about 150 bytes each); more within the
    horizon forgets the oldest, with a warning."""
    bootstrap: str = ""
    """Kafka bootstrap.servers (empty: SLIPSTREAM_KAFKA_BOOTSTRAP)."""
    topic: str = ""
    """Kafka topic of the sample stream (empty: SLIPSTREAM_TOPIC)."""
    dlq_topic: str = ""
    """Dead-letter topic for records that cannot be trained on, reason and origin in headers
    (empty: `<topic>.dlq`, the one `slipstream stack up` creates)."""
    stream: bool = True
    """Tail Kafka after the batch phase (false: batch phase only)."""
    stop: StopConfig = field(default_factory=StopConfig)
    """When the stream phase ends."""
    replay_share: float = knob("data.replay_share")
    """Share of each stream batch replayed from recent batch-window samples (0 <= share < 1): guards
    the per-id tables against forgetting (the DAG's default too)."""
    replay_window_hours: float = 24.0
    """Replay draws from samples with event_time in [T - this, T)."""
    replay_reservoir: int = 50_000
    """Replay samples held in memory per rank."""
    shuffle_buffer: int = 65_536
    """Batch phase: rows shuffled together in one rank (work units are grouped until they reach it)."""
    stream_shuffle_buffer: int = 4_096
    """Stream phase: rows buffered and mixed before training (bigger mixes more, adds latency)."""
    batch_size: int = knob("data.batch_size")
    """Batch phase: samples per rank per step."""
    stream_batch_size: int = 128
    """Stream phase: samples per rank per step, replay included. Smaller than batch_size because
    the stream is short and fresh: a few thousand samples in batches of 1024 are a handful of
    optimizer steps, too few to follow a change of the click model (docs/trainer.md, Model
    quality)."""
    epochs: int = knob("data.epochs")
    """At most this many passes over the batch window (validation stops earlier, see below)."""
    validation_days: float = 1.0
    """The last days of the window (before T) are the validation set: never trained in the batch
    phase, scored after every epoch; the epoch with the lowest validation loss goes on to the
    stream phase. 0: no validation, `epochs` passes; a window no longer than this: no validation,
    one pass."""
    patience: int = 1
    """Epochs in a row without a better validation loss after which the batch phase stops."""
    seed: int = 0
    """Seeds the global unit permutation, the shuffle buffers, replay and model init."""
    cache_dir: str = ""
    """Read warehouse files through slipstream.cache.reader.CacheReader from this folder (empty:
    read them directly)."""
    prefetch_chunks: int = 2
    """Shuffle chunks read ahead by the background reader: at most prefetch_chunks + 1 chunks are
    held ahead of training (being read or queued), all of them read at the same time if need be."""
    exchange: bool = knob("data.exchange")
    """Stream phase: deal every rank's fresh rows to all ranks (an all-to-all each stream-loop
    iteration) so every rank's batch mixes all partitions, not only the ones it reads. Costs two
    collectives per iteration and sends (world-1)/world of the stream across the network."""
    consume_batch: int = 10_000
    """Kafka records fetched per consume call."""
    consume_timeout_s: float = 0.2
    """How long one consume call waits for records."""
    lag_interval_s: float = 1.0
    """How often the watermarks (lag) are refreshed."""
    eval_max_rows: int = 200_000
    """Cap on the rows scored per end-of-run evaluation set (forward tail, hold-outs, validation days)."""
    forward_tail_share: float = 0.2
    """The last share of the after-T stream's time span (from T to the newest event at the
    handoff) is the forward tail: never trained, scored at the end by the model, its baselines and
    the champion, and what promotion is decided on (0: no tail; a continuous run has none)."""
    prequential_max_rows: int = 1_000_000
    """Stream rows scored before training (prequential) kept for the run's scores, all ranks
    together; past it the oldest are dropped (a continuous run reports its newest rows)."""
    generator_manifest: str = ""
    """Path of the generator's manifest.json: its best achievable AUC goes into the summary."""

    def __post_init__(self) -> None:
        check_knobs(self)
        require(self.max_lateness_s >= 0, f"data.max_lateness_s must be >= 0, got {self.max_lateness_s}")
        require(self.max_future_skew_s >= 0, f"data.max_future_skew_s must be >= 0, got {self.max_future_skew_s}")
        require(self.max_age_s >= 0, f"data.max_age_s must be >= 0 (0: no limit), got {self.max_age_s}")
        require(self.dedupe_horizon_s >= 0, f"data.dedupe_horizon_s must be >= 0 (0: derived), got {self.dedupe_horizon_s}")
        require(self.dedupe_max_ids >= 1, f"data.dedupe_max_ids must be >= 1, got {self.dedupe_max_ids}")
        require(self.replay_window_hours > 0, f"data.replay_window_hours must be > 0, got {self.replay_window_hours}")
        require(self.replay_reservoir >= 1, f"data.replay_reservoir must be >= 1, got {self.replay_reservoir}")
        require(self.stream_batch_size >= 1, f"data.stream_batch_size must be >= 1, got {self.stream_batch_size}")
        require(self.shuffle_buffer >= 1, f"data.shuffle_buffer must be >= 1, got {self.shuffle_buffer}")
        require(self.stream_shuffle_buffer >= 1, f"data.stream_shuffle_buffer must be >= 1, got {self.stream_shuffle_buffer}")
        require(self.validation_days >= 0, f"data.validation_days must be >= 0, got {self.validation_days}")
        require(self.patience >= 1, f"data.patience must be >= 1, got {self.patience}")
        require(self.prefetch_chunks >= 1, f"data.prefetch_chunks must be >= 1, got {self.prefetch_chunks}")
        require(self.consume_batch >= 1, f"data.consume_batch must be >= 1, got {self.consume_batch}")
        require(self.eval_max_rows >= 1, f"data.eval_max_rows must be >= 1, got {self.eval_max_rows}")
        require(0.0 <= self.forward_tail_share < 1.0, f"data.forward_tail_share must be in [0, 1), got {self.forward_tail_share}")
        require(self.prequential_max_rows >= 1, f"data.prequential_max_rows must be >= 1, got {self.prequential_max_rows}")
        self.t_handoff = parse_time(self.t_handoff, "data.t_handoff")  # parsed once, here

    @property
    def window_start(self) -> datetime:
        """T - window_days (`slipstream.lake.planning.window_bounds`, where every window is computed)."""
        return window_bounds(self.t_handoff, self.window_days)[0]




@dataclass(kw_only=True)
class ModelConfig:
    """The CTR model: one of the zoo (`kind`) or a user's class, over the spec's tables."""

    kind: ModelKind = "dlrm"
    """The zoo model: `dlrm`, `dcn_v2`, `deepfm` or `wide_deep` (trainers.models.zoo)."""
    class_path: str = field(default="", metadata={"key": "class"})
    """`model.class`: a user's model as `package.module:Class`, a subclass of
    `trainers.models.RecModel` (replaces `kind`; docs/trainer.md, Models)."""
    embed_dim: int = 16
    """Width of every embedding and of the bottom MLP's output."""
    buckets: dict[str, int] = field(default_factory=dict)
    """Rows of a feature's embedding table where it differs from the spec's `buckets` (an
    experiment; a benchmark with a large table), e.g. {user_id: 10000019}."""
    bottom_mlp: list[int] = field(default_factory=lambda: [64])
    """Hidden widths of the MLP over the dense features (its output is embed_dim wide)."""
    top_mlp: list[int] = field(default_factory=lambda: [64, 32])
    """Hidden widths of the MLP over interactions and embeddings (its output is one logit)."""
    dropout: float = 0.0
    """Dropout in the top MLP."""
    cross_layers: int = 3
    """dcn_v2: cross layers over the concatenated vectors and dense features."""
    sharding: Sharding = "none"
    """How the embedding tables are spread over ranks: `none` (data parallel: every rank holds every
    table, sparse gradients), `auto` (TorchRec's planner chooses among the types the device has
    kernels for), or one of `table_wise`, `column_wise`, `row_wise`, `table_row_wise` (CPU:
    table_wise and column_wise). Not `none` needs `optim.table_optimizer` adagrad (or sparse_adam
    on GPUs): tables are then stepped by FBGEMM's fused optimizer (trainers.parallel.sharding)."""

    def __post_init__(self) -> None:
        check_choices(self, "model")
        require(self.embed_dim >= 1, f"model.embed_dim must be >= 1, got {self.embed_dim}")
        for name, n in self.buckets.items():
            require(isinstance(n, int) and n >= 1, f"model.buckets.{name} must be an integer >= 1, got {n!r}")
        require(all(w >= 1 for w in self.bottom_mlp), f"model.bottom_mlp widths must be >= 1, got {self.bottom_mlp}")
        require(all(w >= 1 for w in self.top_mlp), f"model.top_mlp widths must be >= 1, got {self.top_mlp}")
        require(0.0 <= self.dropout < 1.0, f"model.dropout must be in [0, 1), got {self.dropout}")
        require(not self.class_path or ":" in self.class_path,
                f"model.class must be package.module:Class, got {self.class_path!r}")
        require(self.cross_layers >= 1, f"model.cross_layers must be >= 1, got {self.cross_layers}")


@dataclass(kw_only=True)
class OptimConfig:
    """The optimizer."""

    name: OptimizerName = "adam"
    """`adam`, `adamw`, `adagrad` or `sgd`."""
    lr: float = knob("optim.lr")
    """Learning rate (batch phase; in the stream phase, of the per-id tables)."""
    stream_lr: float = 0.02
    """Stream-phase learning rate of the shared parameters (MLPs, wide part, categorical tables)
    under drift: they carry what a change of the click model moves (0: `lr`). With
    `adaptive_stream_lr` it is the upper end, reached when drift is seen. The per-id tables (user,
    item and their biases) keep their batch-phase rate per sample: `lr * stream_batch_size / batch_size`."""
    adaptive_stream_lr: bool = True
    """Stream phase: set the shared rate from the observed drift (`trainers.optim.drift_gauge`): the fresh rows'
    loss against the replayed rows' in the same batches. No drift: the batch phase's rate per sample
    (the stream only adds samples, no noise); drift: `stream_lr`. Needs `data.replay_share` > 0
    (without replay the shared rate is `stream_lr`). false: always `stream_lr`."""
    drift_low: float = 0.1
    """Relative excess of fresh over replayed loss ((fresh - replay) / replay) at and below which no
    drift is assumed; fresh rows are unseen, so on stationary data the excess is a few %."""
    drift_high: float = 0.3
    """Relative excess at and above which the shared rate is `stream_lr` (between: linear)."""
    drift_window_rows: int = 2_048
    """Fresh rows (all ranks) over which both losses are averaged: shorter reacts sooner, longer is
    steadier (a batch's replay part is small, so one step's replay loss is noisy)."""
    weight_decay: float = 0.0
    """L2 penalty (decoupled for adamw) of the shared parameters, and of the id tables when
    `id_weight_decay` is negative."""
    id_weight_decay: float = 1e-4
    """L2 penalty (decoupled for adamw) of the per-id tables (user and item vectors and biases),
    negative: `weight_decay`. With Adam a prior that shrinks rarely seen ids toward 0: +0.001-0.002
    held-out AUC on stationary data at 360k rows (docs/trainer.md, Model quality)."""
    table_optimizer: TableOptimizer = "dense"
    """How the embedding tables are stepped (their gradients always travel between ranks as the
    rows a batch touched): `dense`: with `name`, every row each step (the id L2 prior reaches every
    row; memory and time grow with the tables); `sparse_adam` (lazy Adam) or `adagrad`: only the
    touched rows, no weight decay, for tables of millions of rows."""
    table_lr: float = 0.0
    """Learning rate of the tables' own optimizer (`table_optimizer` `sparse_adam` or `adagrad`, and
    the fused ones of a sharded run) in the batch phase; the stream phase scales it as it scales
    `lr` for the per-id tables. 0: `lr`. Adagrad's steps shrink as squared gradients add up, so it
    wants a larger rate than Adam (0.01-0.1 are usual)."""
    grad_clip: float = 0.0
    """Clip the gradient norm to this (0 = no clipping)."""
    baseline_lr: float = 0.05
    """Adagrad learning rate of the logistic-regression baseline fitted alongside the model."""

    def __post_init__(self) -> None:
        check_choices(self, "optim")
        check_knobs(self)
        require(self.stream_lr >= 0, f"optim.stream_lr must be >= 0 (0: use optim.lr), got {self.stream_lr}")
        require(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        require(0 <= self.drift_low < self.drift_high,
                f"optim.drift_low and optim.drift_high must satisfy 0 <= drift_low < drift_high, "
                f"got {self.drift_low}, {self.drift_high}")
        require(self.drift_window_rows >= 1, f"optim.drift_window_rows must be >= 1, got {self.drift_window_rows}")
        require(not self.grad_clip or self.table_optimizer == "dense",
                f"optim.grad_clip needs optim.table_optimizer=dense (the sparse ones step sparse gradients), "
                f"got {self.table_optimizer!r}")
        require(self.table_lr >= 0, f"optim.table_lr must be >= 0 (0: optim.lr), got {self.table_lr}")
        require(not self.table_lr or self.table_optimizer != "dense",
                "optim.table_lr is the rate of the tables' own optimizer: set optim.table_optimizer to sparse_adam or "
                "adagrad, or leave optim.table_lr at 0 (with table_optimizer=dense the tables step with optim.lr)")
        require(self.grad_clip >= 0, f"optim.grad_clip must be >= 0, got {self.grad_clip}")
        require(self.baseline_lr > 0, f"optim.baseline_lr must be > 0, got {self.baseline_lr}")


@dataclass(kw_only=True)
class RunConfig:
    """Where the run writes, how often it checkpoints and logs, which device it uses."""

    run_id: str
    """Name of the run folder under runs_dir. Required; the same id resumes the same run."""
    runs_dir: str = ""
    """Parent of run folders (empty: SLIPSTREAM_RUNS_DIR)."""
    device: Device = "auto"
    """`auto` (cuda when available), `cpu` or `cuda`."""
    amp: bool = True
    """Mixed precision on cuda (autocast; a GradScaler when amp_dtype is float16). Ignored on CPU."""
    amp_dtype: AmpDtype = "bfloat16"
    """`bfloat16` or `float16`."""
    checkpoint_every_steps: int = 500
    """Commit a checkpoint every this many steps (and at the handoff and at the end)."""
    checkpoint_every_s: float = 300.0
    """...or when this many seconds passed since the last one (0 = only by steps)."""
    keep_checkpoints: int = 2
    """Committed checkpoints kept on disk (older ones are deleted after a new commit)."""
    log_every_steps: int = 50
    """Write a metrics.jsonl line (and TensorBoard scalars) every this many steps."""
    resume: bool = True
    """Resume from run_dir/checkpoint/latest when it exists (false: refuse to reuse a run folder)."""
    tensorboard: bool = True
    """Write TensorBoard event files under run_dir/tb."""
    num_threads: int = 0
    """torch intra-op threads per rank (0: torch's default)."""
    cpu_affinity: CpuAffinity = "none"
    """`per_rank`: the node's CPUs (those the launcher may use) split evenly over its ranks, each
    rank's threads confined to its own share, as NUMA binding or a Kubernetes CPU manager would;
    `none`: the scheduler places every thread anywhere."""

    def __post_init__(self) -> None:
        require(RUN_ID_PATTERN.fullmatch(self.run_id) is not None,
                 f"run.run_id must be a folder name (letters, digits, '.', '_', '-'; at most 128), got {self.run_id!r}")
        check_choices(self, "run")
        require(self.checkpoint_every_steps >= 1, f"run.checkpoint_every_steps must be >= 1, got {self.checkpoint_every_steps}")
        require(self.checkpoint_every_s >= 0, f"run.checkpoint_every_s must be >= 0, got {self.checkpoint_every_s}")
        require(self.keep_checkpoints >= 1, f"run.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        require(self.log_every_steps >= 1, f"run.log_every_steps must be >= 1, got {self.log_every_steps}")
        require(self.num_threads >= 0, f"run.num_threads must be >= 0, got {self.num_threads}")

    @property
    def run_dir(self) -> Path:
        return run_folder(self.runs_dir, self.run_id)


@dataclass(kw_only=True)
class TrainConfig:
    """The whole trainer configuration (the file's top-level sections)."""

    data: DataConfig
    """What to train on."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer."""
    run: RunConfig
    """Run folder, checkpoints, logging, device."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (T as ISO-8601)."""
        out = dataclasses.asdict(self)
        out["data"]["t_handoff"] = self.data.t_handoff.isoformat()
        return out


def resolve(raw: dict[str, Any], settings: Settings) -> TrainConfig:
    """Build the typed config, filling deployment defaults from settings."""
    cfg: TrainConfig = build(TrainConfig, raw, "")
    d, r = cfg.data, cfg.run
    d.catalog = d.catalog or settings.catalog
    d.namespace = d.namespace or settings.namespace
    d.bootstrap = d.bootstrap or settings.kafka_bootstrap
    d.topic = d.topic or settings.topic
    d.dlq_topic = d.dlq_topic or f"{d.topic}.dlq"
    r.runs_dir = r.runs_dir or settings.runs_dir
    d.generator_manifest = d.generator_manifest or str(settings.home / "generator" / "manifest.json")
    return cfg


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = (),
                settings: Settings | None = None) -> TrainConfig:
    raw = load_raw(path)
    for o in overrides:
        apply_override(raw, o)
    return resolve(raw, settings or Settings.from_env())
