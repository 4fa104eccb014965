"""Helpers for the quality tests: realistic sample days in a real (SQLite) Iceberg catalog, and
a fake-but-faithful training run folder (the files the trainer writes, docs/trainer.md)."""

from __future__ import annotations

import functools
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.lake.iceberg import samples_table
from slipstream.samples.schema import ARROW_SCHEMA, is_holdout
from slipstream.samples.schema import DEFAULT_SPEC as SPEC
from tests.metrics_fixtures import run_metrics, scored_set

START = date(2026, 11, 1)
DAYS = 8
ROWS_PER_DAY = 4_000


@functools.lru_cache(maxsize=4)
def reference_days(days: int = DAYS, rows: int = ROWS_PER_DAY, seed: int = 11) -> dict[str, pa.Table]:
    cfg = GeneratorConfig(start_day=START, days=days, impressions_per_day=rows, users=800, items=300, seed=seed)
    return reference_samples(cfg)


def day_of(i: int) -> date:
    return START + timedelta(days=i)


def fill_samples(catalog: Any, namespace: str, tables: dict[str, pa.Table]) -> int:
    """Append the days (one commit each) and return the current snapshot id."""
    t = samples_table(catalog, namespace)
    for _, tbl in sorted(tables.items()):
        t.append(tbl.cast(ARROW_SCHEMA))
    return t.current_snapshot().snapshot_id  # type: ignore[union-attr]


def replace_column(tbl: pa.Table, name: str, values: pa.Array | np.ndarray) -> pa.Table:
    i = tbl.schema.get_field_index(name)
    return tbl.set_column(i, tbl.schema.field(name), pa.array(values, tbl.schema.field(name).type))


def write_fake_run(
    runs_dir: Path, run_id: str, window: dict[str, pa.Table], *, snapshot_id: int,
    t_handoff: datetime, stream: pa.Table | None = None, handoff_offsets: dict[int, int] | None = None,
    final_offsets: dict[int, int] | None = None, stream_partitions: np.ndarray | None = None,
    stream_offsets: np.ndarray | None = None, lose: int = 0, duplicate: int = 0, lose_stream: int = 0, world_size: int = 2,
) -> Path:
    """Write what `torchrun -m trainers.train` leaves in a run folder: metrics.json(l), the
    per-rank audit of trained samples (holdout excluded, shuffled), stream_profile.json."""
    from slipstream.quality.profiles import profile_table

    run = runs_dir / run_id
    (run / "audit").mkdir(parents=True, exist_ok=True)
    (run / "checkpoint").mkdir(exist_ok=True)
    batch = pa.concat_tables(window.values())
    batch = batch.filter(pc.invert(pa.array(is_holdout(batch.column("sample_id")))))
    rng = np.random.default_rng(3)
    order = rng.permutation(batch.num_rows)
    ids = np.asarray(batch.column("sample_id").to_pylist(), dtype=object)[order]
    if lose:
        ids = ids[lose:]
    if duplicate:
        ids = np.concatenate([ids, ids[:duplicate]])
    n = len(ids)
    frames = [
        pa.table({
            "sample_id": pa.array(ids, pa.string()), "source": pa.array(["iceberg"] * n),
            "epoch": pa.array(np.zeros(n, np.int32)), "partition": pa.array(np.full(n, -1, np.int32)),
            "offset": pa.array(np.full(n, -1, np.int64)), "step": pa.array(np.arange(n) // 64, pa.int64()),
        })
    ]
    kafka_rows = 0
    if stream is not None:
        keep = pc.and_(pc.greater_equal(stream.column("event_time"), pa.scalar(t_handoff, pa.timestamp("us", tz="UTC"))),
                       pc.invert(pa.array(is_holdout(stream.column("sample_id")))))
        mask = np.asarray(keep)
        sids = np.asarray(stream.column("sample_id").to_pylist(), dtype=object)[mask]
        if lose_stream:
            mask[np.flatnonzero(mask)[:lose_stream]] = False
            sids = sids[lose_stream:]
        k = len(sids)
        kafka_rows = k
        frames.append(pa.table({
            "sample_id": pa.array(sids, pa.string()), "source": pa.array(["kafka"] * k),
            "epoch": pa.array(np.zeros(k, np.int32)),
            "partition": pa.array(stream_partitions[mask] if stream_partitions is not None else np.zeros(k, np.int32), pa.int32()),
            "offset": pa.array(stream_offsets[mask] if stream_offsets is not None else np.arange(k), pa.int64()),
            "step": pa.array(n // 64 + np.arange(k) // 64, pa.int64()),
        }))
        profile_table(stream.filter(keep), SPEC).write(run / "stream_profile.json")
    audit = pa.concat_tables(frames)
    for r in range(world_size):
        pq.write_table(audit.slice(r * (audit.num_rows // world_size) if r else 0,
                                   audit.num_rows // world_size if r < world_size - 1 else None), run / "audit" / f"rank-{r}.parquet")
    starts = sorted(window)
    newest = pc.max(batch.column("event_time")).as_py() if stream is None else pc.max(stream.column("event_time")).as_py()
    metrics = run_metrics(
        run_id, forward_tail=scored_set(0.70, baseline=0.66), snapshot_id=snapshot_id, t_handoff=t_handoff,
        window_start=datetime.fromisoformat(starts[0]).replace(tzinfo=UTC),
        samples_iceberg=int(batch.num_rows), samples_kafka=kafka_rows, dropped_before_t=0, dead_letters=0,
        handoff_offsets={str(k): v for k, v in (handoff_offsets or {}).items()},
        final_offsets={str(k): v for k, v in (final_offsets or {}).items()},
        samples_per_s=52000.0, data_wait_share=0.08, newest_event_time=newest, kafka_lag_at_stop=12,
        checkpoint=str(run / "checkpoint" / "step-100"),
    )
    (run / "metrics.json").write_text(metrics.to_json())
    with (run / "metrics.jsonl").open("w") as f:
        for s in range(5):
            f.write(json.dumps({"step": s * 20, "loss": 0.6 - 0.03 * s, "auc": 0.6 + 0.02 * s, "samples_per_s": 50000}) + "\n")
    return run
