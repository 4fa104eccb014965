"""Exactly once per sample id in the stream phase: a bounded memory of the ids already admitted.

A sample id can reach the samples topic twice: a joiner restored from an older state, or a
producer that retried outside a transaction, emits it again, possibly after the joiner itself has
forgotten it (it remembers emitted ids for a few attribution windows). `SampleIdDedupe` admits the
first record of an id and refuses a later record of the same id while the first one's event time
is within `horizon_s` of the newest event time admitted on that partition; the refused record goes
to the dead-letter topic and the audit as a duplicate (rejected with a reason, never lost).

- State is kept per Kafka partition (a sample's key, hence its partition, follows its id), so a
  resume on another world size re-deals it with the partitions: a rank takes the ids of the
  partitions it now reads, whichever old rank held them (`load_rank_states`).
- The horizon is a rule on each record, not on when memory is freed: a record is a duplicate when
  its id was admitted with an event time >= (newest event time of its partition up to and including
  this record) - horizon. The decision depends only on the partition's records in offset order, so
  it is the same whether the run went straight through or was killed and resumed, and however the
  consume calls cut the stream. A checkpoint keeps the ids the rule can still match.
- `max_ids` caps the ids held per partition (about 150 bytes each). Reaching it forgets the
  oldest ids before the horizon does (counted as `evicted`, with a warning): a duplicate of one of
  them would be trained again, and the audit would report it as duplicated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from slipstream.errors import ResumeError
from trainers.checkpoint.stateful import check_version

log = logging.getLogger(__name__)

STATE_VERSION = 1
NO_TIME = -(1 << 62)
TRIM_SHARE = 0.9
"""Reaching `max_ids` trims a partition to this share of it (not one id per record)."""


class SampleIdDedupe:
    """Per partition, the admitted sample ids with their event times (see the module doc)."""

    def __init__(self, horizon_s: float, max_ids: int) -> None:
        if horizon_s < 0 or max_ids < 1:
            raise ValueError(f"dedupe needs horizon_s >= 0 and max_ids >= 1, got {horizon_s} and {max_ids}")
        self.horizon_us = int(horizon_s * 1_000_000)
        self.max_ids = int(max_ids)
        self.partitions: list[int] | None = None
        """The partitions this rank reads (set before a resume: it takes their ids from every old rank)."""
        self._seen: dict[int, dict[str, int]] = {}
        self._newest: dict[int, int] = {}
        self.duplicates = 0
        """Records refused as duplicates by this process."""
        self.evicted = 0
        """Ids forgotten within the horizon because a partition held `max_ids`."""

    def __len__(self) -> int:
        return sum(len(s) for s in self._seen.values())

    def admit(self, partitions: np.ndarray, ids: Sequence[str | None], event_us: np.ndarray) -> np.ndarray:
        """Which of these records (in offset order per partition) are admitted: False for a
        duplicate. A record without an id is always admitted (nothing to match it by)."""
        keep = np.ones(len(ids), dtype=bool)
        if not len(ids):
            return keep
        horizon = self.horizon_us
        for p in np.unique(partitions).tolist():
            seen = self._seen.setdefault(p, {})
            newest = self._newest.get(p, NO_TIME)
            for i in np.flatnonzero(partitions == p).tolist():
                sid, t = ids[i], int(event_us[i])
                if t > newest:
                    newest = t
                if sid is None:
                    continue
                first = seen.get(sid)
                if first is not None and first >= newest - horizon:
                    keep[i] = False
                else:
                    seen[sid] = t
            self._newest[p] = newest
            if len(seen) > self.max_ids:
                self._trim(p)
        self.duplicates += int((~keep).sum())
        return keep

    def _trim(self, p: int) -> None:
        """Forget ids of `p` past the horizon, then, still over `max_ids`, the oldest ones."""
        seen, cutoff = self._seen[p], self._newest[p] - self.horizon_us
        live = {s: t for s, t in seen.items() if t >= cutoff}
        if len(live) > self.max_ids:
            target = int(self.max_ids * TRIM_SHARE)
            times = np.fromiter(live.values(), dtype=np.int64, count=len(live))
            floor = int(np.partition(times, len(times) - target)[len(times) - target])
            kept = {s: t for s, t in live.items() if t > floor}
            for s, t in live.items():  # ties at the floor, in admission order, up to the target
                if len(kept) >= target:
                    break
                if t == floor:
                    kept[s] = t
            self.evicted += len(live) - len(kept)
            log.warning("partition %d: %d sample ids within the dedupe horizon (data.dedupe_max_ids is %d): the oldest "
                        "%d are forgotten, and a duplicate of one of them would be trained again; raise "
                        "data.dedupe_max_ids", p, len(live), self.max_ids, len(live) - len(kept))
            live = kept
        self._seen[p] = live

    # --- checkpoint piece (data, re-dealt by partition) --------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        """The ids each partition's rule can still match (None: nothing admitted yet)."""
        if not self._newest:
            return None
        parts: dict[int, Any] = {}
        for p, newest in sorted(self._newest.items()):
            cutoff = newest - self.horizon_us
            live = [(s, t) for s, t in self._seen.get(p, {}).items() if t >= cutoff]
            ids = pa.array([s for s, _ in live], pa.large_string())
            bufs = ids.buffers()
            n = len(live)
            offsets = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1).copy() if n else np.zeros(1, np.int64)
            data = np.frombuffer(bufs[2], dtype=np.uint8, count=int(offsets[-1])).copy() if n else np.zeros(0, np.uint8)
            parts[p] = {"newest": newest, "ids": data, "offsets": offsets,
                        "event_us": np.asarray([t for _, t in live], dtype=np.int64)}
        return {"version": STATE_VERSION, "horizon_us": self.horizon_us, "partitions": parts}

    def load_rank_states(self, states: Sequence[dict[str, Any] | None]) -> None:
        """Every old rank's ids: this rank takes those of the partitions it reads (all of them when
        `partitions` is None)."""
        self._seen, self._newest = {}, {}
        for s in states:
            if s is None:
                continue
            check_version("sample id dedupe", s, STATE_VERSION)
            for p, part in (s.get("partitions") or {}).items():
                p = int(p)
                if self.partitions is not None and p not in self.partitions:
                    continue
                if p in self._newest:
                    raise ResumeError(f"the checkpoint's sample id dedupe holds partition {p} twice: it is damaged")
                self._newest[p] = int(part["newest"])
                self._seen[p] = _ids_of(p, part)

    def state_of(self, partition: int) -> dict[str, int]:
        """The ids held for `partition` with their event times (for tests and the audit)."""
        return dict(self._seen.get(partition, {}))


def _ids_of(p: int, part: dict[str, Any]) -> dict[str, int]:
    offsets = np.asarray(part["offsets"], dtype=np.int64)
    times = np.asarray(part["event_us"], dtype=np.int64)
    n = len(offsets) - 1
    if n != len(times) or n < 0:
        raise ResumeError(f"the checkpoint's sample id dedupe of partition {p} holds {n} ids but {len(times)} "
                          "event times: it is damaged")
    if n == 0:
        return {}
    data = np.asarray(part["ids"], dtype=np.uint8)
    ids = pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data.tobytes())])
    return dict(zip(ids.to_pylist(), times.tolist()))
