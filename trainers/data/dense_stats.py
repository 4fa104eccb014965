"""The training window's statistics of the dense features the spec standardises.

`standardize: true` in a feature spec means: subtract the training window's mean and divide by its
standard deviation, inside the model (so the export carries them and serving applies the same
numbers). They are measured once, before the first step, over the dense columns of up to
`max_units` of the plan's row groups spread evenly over the window (the rows' order of the Iceberg
files is time, so an even spread samples the whole window); a resumed run restores them with the
weights. Only rows the batch phase trains count: the validation days and the hash hold-out are
evaluation rows, and an evaluation row never shapes the model, not even its scaling.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slipstream.samples.spec import EVENT_TIME, SAMPLE_ID
from trainers.data.holdout import holdout_mask
from trainers.data.rows import RowLayout
from trainers.data.units import Opener, WorkUnit


def _training_rows(table: pa.Table, start_us: int | None, end_us: int | None) -> pa.Table:
    """The rows with start_us <= event time < end_us that are not held out by hash."""
    keep = np.ones(table.num_rows, dtype=bool)
    if EVENT_TIME in table.column_names and (start_us is not None or end_us is not None):
        us = pc.cast(table.column(EVENT_TIME), pa.int64()).to_numpy(zero_copy_only=False)
        keep &= (us >= (start_us if start_us is not None else np.iinfo(np.int64).min)) & \
            (us < (end_us if end_us is not None else np.iinfo(np.int64).max))
    if SAMPLE_ID in table.column_names:
        keep &= ~holdout_mask(table.column(SAMPLE_ID))
    return table if keep.all() else table.filter(pa.array(keep))


def window_dense_stats(units: list[WorkUnit], open_file: Opener, layout: RowLayout, max_units: int = 64,
                       start_us: int | None = None, end_us: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of each dense column (`layout.dense` order) over the training rows (event time
    in [start_us, end_us), not held out) of a spread of the window's row groups; (0, 1) for a
    column no unit holds."""
    d = len(layout.dense)
    total = np.zeros(d)
    squares = np.zeros(d)
    count = np.zeros(d)
    if not units or not d:
        return np.zeros(d), np.ones(d)
    picked = [units[int(i)] for i in np.unique(np.linspace(0, len(units) - 1, min(max_units, len(units))).astype(int))]
    for unit in picked:
        with open_file(unit.path) as fh:
            pf = pq.ParquetFile(fh)
            names = pf.schema_arrow.names
            present = [c for c in layout.dense if c in names]
            table = pf.read_row_group(unit.row_group, columns=present + [c for c in (EVENT_TIME, SAMPLE_ID) if c in names])
        table = _training_rows(table, start_us, end_us)
        for j, name in enumerate(layout.dense):
            if name not in present:
                continue
            x = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
            x = x[np.isfinite(x)]
            total[j] += x.sum()
            squares[j] += (x * x).sum()
            count[j] += len(x)
    safe = np.maximum(count, 1)
    mean = np.where(count > 0, total / safe, 0.0)
    var = np.where(count > 0, squares / safe - mean * mean, 1.0)
    return mean, np.sqrt(np.maximum(var, 0.0))
