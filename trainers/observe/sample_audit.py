"""The per-sample audit: which sample ids were trained, from where, at which step.

Rows are buffered per rank and written as one part file per checkpoint (`audit/parts/
rank-R-step-N.parquet`) just before the checkpoint commits; a resume deletes parts newer than
the checkpoint it resumes from. So the parts always describe exactly the committed progress,
and at the end of a run rank 0 merges them into `audit/rank-R.parquet` (the run-layout contract).
Replayed rows (the priority mix) are training repeats by design and are not audited; records sent
to the dead-letter topic are, as source `dead_letter`, or `duplicate` for a sample id already
admitted (so a rejected record is not a lost one).

The same writer keeps the ids every evaluation scored, in `evaluated/` (`add_scored`: source = the
evaluation set, step = the optimizer steps the scoring model had taken), and the replayed ids (source
`replay`), so a reader can check that no evaluated row was trained before it was scored.
`write_final` adds the sets scored at the end of a run (`evaluated/final-rank-R.parquet`).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainers.checkpoint.store import writing
from trainers.data.rows import SOURCE_ICEBERG, SOURCE_KAFKA, Rows

log = logging.getLogger(__name__)

AUDIT_SCHEMA = pa.schema([
    pa.field("sample_id", pa.string()),
    pa.field("source", pa.string()),
    pa.field("epoch", pa.int32()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("step", pa.int64()),
])
_PART = re.compile(r"rank-(\d+)-step-(\d+)\.parquet$")


class AuditWriter:
    def __init__(self, audit_dir: Path, rank: int) -> None:
        self.dir = audit_dir
        self.parts = audit_dir / "parts"
        self.rank = rank
        self._pending: list[pa.Table] = []

    def add(self, rows: Rows, step: int) -> None:
        keep = (rows.source == SOURCE_ICEBERG) | (rows.source == SOURCE_KAFKA)
        if not keep.any():
            return
        r = rows.mask(keep)
        source = np.where(r.source == SOURCE_KAFKA, "kafka", "iceberg")
        self._pending.append(pa.table({
            "sample_id": r.sample_id,
            "source": pa.array(source, pa.string()),
            "epoch": pa.array(r.epoch, pa.int32()),
            "partition": pa.array(r.partition, pa.int32()),
            "offset": pa.array(r.offset, pa.int64()),
            "step": pa.array(np.full(len(r), step, dtype=np.int64)),
        }, schema=AUDIT_SCHEMA))

    def add_scored(self, rows: Rows, step: int, what: str) -> None:
        """Rows an evaluation scored (or `replay` drew) with the model after `step` steps."""
        if not len(rows):
            return
        self._pending.append(_table(rows, what, step))

    def add_dead_letters(self, letters: list[tuple[int, int, str]], step: int, source: str = "dead_letter") -> None:
        """Records sent to the dead-letter topic, (partition, offset, sample id or ""): audited as
        `source` (`dead_letter`, or `duplicate` for a sample id admitted before), so the report
        counts them as rejected, not as lost."""
        if not letters:
            return
        parts, offsets, ids = zip(*letters)
        n = len(letters)
        self._pending.append(pa.table({
            "sample_id": pa.array(ids, pa.string()), "source": pa.array([source] * n, pa.string()),
            "epoch": pa.array(np.zeros(n, np.int32)), "partition": pa.array(parts, pa.int32()),
            "offset": pa.array(offsets, pa.int64()), "step": pa.array(np.full(n, step, dtype=np.int64)),
        }, schema=AUDIT_SCHEMA))

    def write_part(self, step: int) -> None:
        """Write what was trained since the last checkpoint (call right before committing `step`)."""
        if not self._pending:  # nothing trained since the last checkpoint (same step re-committed)
            return
        table = pa.concat_tables(self._pending)
        path = self.parts / f"rank-{self.rank}-step-{step:09d}.parquet"
        tmp = path.with_name(path.name + ".tmp")
        with writing(tmp):  # a full disk's error names the file
            self.parts.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, tmp)
            tmp.replace(path)
        self._pending = []


def _table(rows: Rows, what: str, step: int) -> pa.Table:
    n = len(rows)
    return pa.table({
        "sample_id": rows.sample_id, "source": pa.array([what] * n, pa.string()),
        "epoch": pa.array(rows.epoch, pa.int32()), "partition": pa.array(rows.partition, pa.int32()),
        "offset": pa.array(rows.offset, pa.int64()), "step": pa.array(np.full(n, step, dtype=np.int64)),
    }, schema=AUDIT_SCHEMA)


def write_final(dir_: Path, rank: int, scored: list[tuple[Rows, str]], step: int) -> Path:
    """This rank's rows of the end-of-run evaluation sets, replacing an earlier finish's."""
    dir_.mkdir(parents=True, exist_ok=True)
    table = pa.concat_tables([_table(r, what, step) for r, what in scored] or [AUDIT_SCHEMA.empty_table()])
    path = dir_ / f"final-rank-{rank}.parquet"
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def read_evaluated(run_dir: Path) -> pa.Table:
    """Every committed scored id of a run: the parts and the end-of-run sets."""
    d = run_dir / "evaluated"
    paths = sorted((d / "parts").glob("rank-*-step-*.parquet")) + sorted(d.glob("final-rank-*.parquet"))
    if not paths:
        return AUDIT_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(p, schema=AUDIT_SCHEMA) for p in paths])


def drop_uncommitted(audit_dir: Path, committed_step: int) -> int:
    """Delete parts written after the checkpoint a run resumes from (their progress is lost)."""
    n = 0
    for p in (audit_dir / "parts").glob("rank-*-step-*.parquet*"):
        m = _PART.search(p.name.removesuffix(".tmp"))
        if p.name.endswith(".tmp") or (m and int(m.group(2)) > committed_step):
            p.unlink()
            n += 1
    if n:
        log.info("removed %d audit part(s) newer than the resumed checkpoint (step %d)", n, committed_step)
    return n


def merge_parts(audit_dir: Path) -> dict[int, int]:
    """Rewrite audit/rank-R.parquet from its parts (all ranks any run of this id had). Returns rows per rank."""
    by_rank: dict[int, list[Path]] = {}
    for p in sorted((audit_dir / "parts").glob("rank-*-step-*.parquet")):
        m = _PART.search(p.name)
        if m:
            by_rank.setdefault(int(m.group(1)), []).append(p)
    out: dict[int, int] = {}
    for rank, paths in sorted(by_rank.items()):
        table = pa.concat_tables([pq.read_table(p, schema=AUDIT_SCHEMA) for p in paths])
        dest = audit_dir / f"rank-{rank}.parquet"
        tmp = dest.with_name(dest.name + ".tmp")
        pq.write_table(table, tmp)
        tmp.replace(dest)
        out[rank] = table.num_rows
    return out


def read_audit(run_dir: Path) -> pa.Table:
    """Every committed audit row of a run (from the parts, so it also works on a killed run)."""
    paths = sorted((run_dir / "audit" / "parts").glob("rank-*-step-*.parquet"))
    if not paths:
        return AUDIT_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(p, schema=AUDIT_SCHEMA) for p in paths])
