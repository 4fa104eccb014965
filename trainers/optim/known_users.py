"""Which users the batch phase trained on, so the drift gauge compares rows of the same kind.

A fresh row of a user the model never saw has a higher loss than a row of a known user whether
or not the click model changed (cold start). A stream with many new users (a launch, a campaign,
the usual growth of a real service) would then read as drift and push the stream phase to its
highest rate, which costs accuracy. `KnownUsers` remembers, per bucket of the user id's table,
whether the batch phase trained a row of it; `trainers.optim.drift_gauge.DriftGauge` compares fresh and
replayed rows within each kind (known users with known users, new with new).

One bit per bucket (the table's size: 100k buckets are 12.5 kB), OR-merged over ranks at every
checkpoint, saved with the model state. A spec without a `role: user` id has one kind of row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from slipstream.samples.spec import Spec
from trainers.parallel.dist import Dist
from trainers.models.tables import table_sizes

KNOWN = 0
NEW = 1


class KnownUsers:
    def __init__(self, spec: Spec, buckets: dict[str, int] | None) -> None:
        user = spec.with_role("user")
        self.column = [f.name for f in spec.sparse].index(user.name) if user is not None else None
        self.size = table_sizes(spec, buckets)[spec.table_of(user)] if user is not None else 0
        self.bits = np.zeros(self.size, dtype=bool)

    def mark(self, sparse: np.ndarray) -> None:
        """Record the users of rows the batch phase trains (`Rows.sparse`)."""
        if self.column is not None and len(sparse):
            self.bits[np.remainder(sparse[:, self.column], self.size)] = True

    def kinds(self, sparse: np.ndarray) -> np.ndarray:
        """Per row: KNOWN (its user's bucket was trained) or NEW; all KNOWN without a user id."""
        if self.column is None:
            return np.zeros(len(sparse), dtype=np.int8)
        return np.where(self.bits[np.remainder(sparse[:, self.column], self.size)], KNOWN, NEW).astype(np.int8)

    def merge(self, d: Dist) -> None:
        """Collective: every rank ends up with the users any rank trained."""
        if not d.active or self.column is None:
            return
        for packed in d.gather(np.packbits(self.bits)):
            self.bits |= np.unpackbits(packed, count=self.size).astype(bool)

    @property
    def count(self) -> int:
        return int(self.bits.sum())

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size, "bits": torch.from_numpy(np.packbits(self.bits))}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore from a checkpoint; None (a checkpoint from before the gauge compared kinds) or
        another table size starts empty: every stream row then counts as new."""
        if not state or int(state.get("size", -1)) != self.size:
            self.bits = np.zeros(self.size, dtype=bool)
            return
        self.bits = np.unpackbits(state["bits"].numpy(), count=self.size).astype(bool)
