"""`slipstream bench loader --json`: samples/s of the batch-phase loader vs two baselines.

On one generated window (SQLite catalog in a temp folder), in the same run:
- `loader`: `trainers.data.iceberg_source.IcebergSource` over an epoch (global shuffle, window and
  holdout filter, in-rank shuffle, background prefetch) up to model-ready tensors;
- `raw`: pyarrow reads the same files' columns straight into numpy, one file after another with
  pyarrow's threads within each (the limit `vs_raw` is measured against);
- `naive`: pyiceberg scan → pandas → a row-indexed torch Dataset + DataLoader (the common way);
- `floor`: raw's reads, the files side by side, each followed by one seeded permutation gather of
  every column (numpy, the list gather, Arrow's take for the ids) and nothing else: the least a
  reader that shuffles rows does. `floor_vs_raw` is what a full row shuffle costs on this machine
  (above 1 where reading files side by side gains more than the gathers cost), `vs_floor` how close
  the loader (window, holdout, chunks, prefetch, batches, tensors) comes to it.

Fairness: `loader` and `raw` read the same files, the same columns (`READ_COLUMNS`) and the same
rows (every row of the window; checked), each with pyarrow's thread pool available; both start from
a warm page cache (best of `--repeat` alternating passes). The loader does more with them: the
window and holdout filter, the seeded shuffle, batching and tensors; it trains on the rows that are
not held out (about 90 %). So `vs_raw` (goal >= 0.8) is the ratio of window rows per second, i.e.
raw time / loader time for the same input; `vs_raw_delivered` is the stricter ratio of the samples
the loader delivers per second to raw rows per second. `naive` iterates `--naive-rows` rows; its
scan of the whole table is prorated to those rows. `vs_naive` (goal >= 10) is the ratio of samples
delivered per second. Each loader pass is a fresh source's first epoch (the headline) followed by
its second epoch (`vs_raw_epoch2`), where the source already knows each unit's training rows.

The history lists are gathered by the native kernel (`slipstream.samples.native`) where it is built; the
same passes with Arrow's `take` instead (`loader_arrow_s`, `vs_raw_arrow`) alternate with them,
and `native_speedup` is the ratio of the two (`native_kernel` is null where it is not built).
`vs_raw_median` is the ratio of the median passes, and `vs_raw_cpu` that of the median process
CPU per pass (loader: its first epoch), the steadier figures where neighbours share the host.

Size: the default window is 10 days x 100k rows (1M rows in 10 files, 50 row groups, 13 shuffle
chunks). Before its first batch the loader reads, filters and shuffles a whole chunk
(`first_batch_s`, median; `first_batch_share` of the median epoch); a window of only a few chunks
is mostly that fill and measures it, not the rate a real window is read at (`--days 2`: 3 chunks,
the first batch at ~80 % of the epoch). Raw reads each file whole, so larger files cost it more
per row; 100k-row files keep it at its cheapest.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.lake.planning import plan_window_files
from slipstream.samples import native
from slipstream.samples.ragged import take_list_column
from slipstream.samples.schema import CATEGORICAL_COLUMNS, DENSE_COLUMNS
from slipstream.settings import Settings
from trainers.data.iceberg_source import IcebergSource
from trainers.data.rows import DEFAULT_LAYOUT, Features
from trainers.data.units import file_opener, plan_units

READ_COLUMNS = DEFAULT_LAYOUT.read_columns


class _RowDataset(Dataset[dict[str, Any]]):
    def __init__(self, df: Any) -> None:
        self.df = df

    def __len__(self) -> int:
        return len(self.df)

    def __getitem__(self, i: int) -> dict[str, Any]:
        r = self.df.iloc[i]
        return {
            "user": int(r["user_id"]), "item": int(r["item_id"]),
            "cats": torch.tensor([int(r[c]) for c in CATEGORICAL_COLUMNS]),
            "dense": torch.tensor([float(r[c]) for c in DENSE_COLUMNS]),
            "hist": torch.tensor(list(r["hist_items"]), dtype=torch.int64), "label": float(r["label"]),
        }


def _collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    lengths = torch.tensor([len(x["hist"]) for x in items])
    return {
        "user": torch.tensor([x["user"] for x in items]), "item": torch.tensor([x["item"] for x in items]),
        "cats": torch.stack([x["cats"] for x in items]), "dense": torch.stack([x["dense"] for x in items]),
        "hist": torch.cat([x["hist"] for x in items]), "offsets": torch.cumsum(lengths, 0) - lengths,
        "label": torch.tensor([x["label"] for x in items]),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="slipstream bench loader")
    # ten days of 100k rows: 1M rows, 50 row groups, 13 shuffle chunks. The first batch waits for
    # the first chunk to be read, filtered and shuffled; in a window of a few chunks that fill is
    # most of the epoch (first_batch_share), which is not what a window of logs is to the loader.
    # Small files keep raw at its cheapest per row (it reads each file whole)
    p.add_argument("--days", type=int, default=10)
    p.add_argument("--per-day", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--row-group-rows", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=5, help="best of this many loader/raw passes")
    p.add_argument("--naive-rows", type=int, default=20_000, help="rows the (slow) naive baseline iterates")
    args = p.parse_args([a for a in (argv or []) if a not in ("--json", "--")])
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        settings = Settings(home=Path(tmp))
        gen = GeneratorConfig(start_day=date(2026, 11, 1), days=args.days, impressions_per_day=args.per_day, seed=5)
        table = samples_table(get_catalog(settings), settings.namespace)
        with table.transaction() as tx:
            tx.set_properties({"write.parquet.row-group-limit": str(args.row_group_rows)})
        for day in reference_samples(gen).values():
            table.append(day)
        table = get_catalog(settings).load_table(settings.table)
        snap = table.current_snapshot()
        assert snap is not None
        t = gen.t_handoff
        start = t - timedelta(days=args.days)
        plan = plan_window_files(table, snap.snapshot_id, start, t)
        open_file, _ = file_opener(table.io, None)
        units = plan_units(plan, open_file)

        window_us = (int(start.timestamp() * 1e6), int(t.timestamp() * 1e6))

        def run_loader(use_native: bool = True) -> tuple[int, float, int, float, float, float]:
            """(samples, seconds, rows read) of a fresh source's first epoch, + seconds of its
            second, + the process's CPU seconds in the first, + seconds to its first batch."""
            with native.enabled(use_native):
                return _epochs()

        def _epochs() -> tuple[int, float, int, float, float, float]:
            src = IcebergSource(units, open_file, rank=0, world=1, seed=0, batch_size=args.batch_size,
                                shuffle_rows=65_536, window_us=window_us)
            times, n, first = [], 0, 0.0
            cpu0 = time.process_time()
            for epoch in (0, 1):
                t0 = time.perf_counter()
                src.start_epoch(epoch)
                n = 0
                while (b := src.next_batch()) is not None:
                    if not n and epoch == 0:
                        first = time.perf_counter() - t0
                    n += len(Features.from_rows(b))
                src.close()
                times.append(time.perf_counter() - t0)
                if epoch == 0:
                    cpu = time.process_time() - cpu0
            return n, times[0], src.stats.rows_read // 2, times[1], cpu, first

        def run_floor() -> tuple[int, float]:
            """(rows, seconds) of the shuffle floor: read, permute, gather; no window, no batches."""
            def one(k: int, path: str) -> int:
                with open_file(path) as fh:
                    tbl = pq.read_table(fh, columns=list(READ_COLUMNS))
                perm = np.random.default_rng([0, k]).permutation(tbl.num_rows)
                _ = ([tbl.column(c).to_numpy()[perm] for c in READ_COLUMNS if c not in ("sample_id", "hist_items")],
                     take_list_column(tbl.column("hist_items"), perm),
                     tbl.column("sample_id").combine_chunks().take(pa.array(perm)))
                rows: int = tbl.num_rows
                return rows

            t0 = time.perf_counter()
            with ThreadPoolExecutor(max(1, min(len(plan.files), os.cpu_count() or 1))) as pool:
                n = sum(pool.map(one, range(len(plan.files)), [f.path for f in plan.files]))
            return n, time.perf_counter() - t0

        def run_raw() -> tuple[int, float, float]:
            t0, cpu0 = time.perf_counter(), time.process_time()
            n = 0
            for f in plan.files:
                with open_file(f.path) as fh:
                    tbl = pq.read_table(fh, columns=list(READ_COLUMNS))
                cols = [tbl.column(c).to_numpy() for c in READ_COLUMNS if c not in ("sample_id", "hist_items")]
                hist = tbl.column("hist_items").combine_chunks()
                _ = (cols, hist.values.to_numpy(), hist.offsets.to_numpy())
                n += tbl.num_rows
            return n, time.perf_counter() - t0, time.process_time() - cpu0

        # best of `repeat`, alternating, so a busy moment of a shared machine or a cold page
        # cache does not decide the ratio
        kern = native.kernels()
        loader_runs, arrow_runs, raw_runs, floor_runs = [], [], [], []
        for _ in range(args.repeat):
            loader_runs.append(run_loader())
            if kern is not None:
                arrow_runs.append(run_loader(use_native=False))
            raw_runs.append(run_raw())
            floor_runs.append(run_floor())
        n_loader, loader_s, read_loader, _, _, _ = min(loader_runs, key=lambda r: r[1])
        first_batch_s = statistics.median(r[5] for r in loader_runs)
        later_s = min(r[3] for r in loader_runs)
        n_raw, raw_s, _ = min(raw_runs, key=lambda r: r[1])
        # medians of every pass: on a shared host the best pass and the typical one can differ a lot
        loader_med_s, raw_med_s = statistics.median(r[1] for r in loader_runs), statistics.median(r[1] for r in raw_runs)
        loader_cpu_s, raw_cpu_s = statistics.median(r[4] for r in loader_runs), statistics.median(r[2] for r in raw_runs)
        arrow_s = min(r[1] for r in arrow_runs) if arrow_runs else loader_s
        floor_s, floor_med_s = min(r[1] for r in floor_runs), statistics.median(r[1] for r in floor_runs)
        if not read_loader == n_raw == floor_runs[0][0]:
            raise AssertionError(f"loader read {read_loader} rows, raw {n_raw}, floor {floor_runs[0][0]}: not the same input")

        t0 = time.perf_counter()
        df = table.scan(snapshot_id=snap.snapshot_id).to_pandas()
        scan_s = (time.perf_counter() - t0) * min(1.0, args.naive_rows / max(1, len(df)))  # its share of the scan
        df = df.head(args.naive_rows)
        t0 = time.perf_counter()
        n_naive = 0
        for batch in DataLoader(_RowDataset(df), batch_size=args.batch_size, shuffle=True, collate_fn=_collate):
            n_naive += len(batch["label"])
        naive_s = scan_s + time.perf_counter() - t0
    loader_rate, raw_rate, naive_rate = n_loader / loader_s, n_raw / raw_s, n_naive / naive_s
    return {
        "benchmark": "loader", "rows_window": n_raw, "rows_loader": n_loader, "batch_size": args.batch_size,
        "loader_s": round(loader_s, 4), "raw_s": round(raw_s, 4),
        "loader_rows_per_s": round(read_loader / loader_s, 1), "loader_samples_per_s": round(loader_rate, 1),
        "raw_samples_per_s": round(raw_rate, 1), "naive_samples_per_s": round(naive_rate, 1),
        "vs_raw": round(raw_s / loader_s, 3), "vs_raw_delivered": round(loader_rate / raw_rate, 3),
        "first_batch_s": round(first_batch_s, 4), "first_batch_share": round(first_batch_s / loader_med_s, 3),
        "loader_epoch2_s": round(later_s, 4), "vs_raw_epoch2": round(raw_s / later_s, 3),
        "loader_runs_s": [round(r[1], 4) for r in loader_runs], "raw_runs_s": [round(r[1], 4) for r in raw_runs],
        "native_kernel": None if kern is None else str(kern.path), "loader_arrow_s": round(arrow_s, 4),
        "vs_raw_arrow": round(raw_s / arrow_s, 3), "native_speedup": round(arrow_s / loader_s, 3),
        "vs_naive": round(loader_rate / naive_rate, 1),
        "vs_raw_median": round(raw_med_s / loader_med_s, 3),
        "loader_cpu_s": round(loader_cpu_s, 4), "raw_cpu_s": round(raw_cpu_s, 4),
        "vs_raw_cpu": round(raw_cpu_s / loader_cpu_s, 3),
        "floor_s": round(floor_s, 4), "floor_runs_s": [round(r[1], 4) for r in floor_runs],
        "floor_vs_raw": round(raw_s / floor_s, 3), "floor_vs_raw_median": round(raw_med_s / floor_med_s, 3),
        "vs_floor": round(floor_s / loader_s, 3), "vs_floor_median": round(floor_med_s / loader_med_s, 3),
        "loader_note": "loader and raw read the same rows and columns; vs_raw = raw_s / loader_s. The loader "
                       "delivers the rows_loader not held out (vs_raw_delivered counts only those), shuffled, as tensors",
    }


if __name__ == "__main__":
    print(json.dumps(main()))
