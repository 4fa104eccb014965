"""The data generator's hidden click probability of each sample (generated data only).

`slipstream demo`, the benches and the tests generate their data; the generator writes
`truth.parquet` (sample id, `p_true`, label) next to its `manifest.json`. Scored as a model on
exactly the rows of an evaluation set, `p_true` gives the best AUC any model can reach there,
with its interval, so "best achievable" is always measured on the same rows as the model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

log = logging.getLogger(__name__)


class GeneratorTruth:
    """`p_true` by sample id; NaN for ids the generator did not make (real data)."""

    def __init__(self, ids: pa.Array, p_true: np.ndarray, source: str) -> None:
        self.ids, self.p_true, self.source = ids, p_true, source

    @classmethod
    def load(cls, manifest: str, after_us: int | None = None) -> GeneratorTruth | None:
        """The truth next to the generator's manifest (None: no manifest or no truth file);
        `after_us`: keep only samples with event time at or after it (the stream's)."""
        if not manifest:
            return None
        path = Path(manifest).with_name("truth.parquet")
        if not path.exists():
            return None
        try:
            t = pq.read_table(path, columns=["sample_id", "event_time", "p_true"])
        except (OSError, KeyError, pa.ArrowInvalid) as e:
            log.warning("the generator's truth %s is unreadable (%s): no best achievable AUC", path, e)
            return None
        if after_us is not None:
            t = t.filter(pc.greater_equal(pc.cast(t.column("event_time"), pa.int64()), after_us))
        return cls(t.column("sample_id").combine_chunks(), t.column("p_true").to_numpy().astype(np.float64), str(path))

    def lookup(self, sample_ids: pa.Array) -> np.ndarray:
        """`p_true` of each id (NaN where unknown)."""
        if len(sample_ids) == 0:
            return np.zeros(0)
        idx = pc.index_in(sample_ids, value_set=self.ids)
        found = idx.is_valid().to_numpy(zero_copy_only=False)
        out = np.full(len(sample_ids), np.nan)
        out[found] = self.p_true[idx.to_numpy(zero_copy_only=False)[found].astype(np.int64)]
        return out
