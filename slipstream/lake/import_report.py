"""What `slipstream import` tells its user: the per-source summary, progress while a file is read,
and the rejects file (`<raw_dir>/_rejects/<source>/<run>.jsonl`)."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa

from slipstream.lake.import_read import RawBatch
from slipstream.lake.import_rows import Reject
from slipstream.lake.raw_zone import rejects_path

log = logging.getLogger(__name__)


@dataclass
class SourceReport:
    source: str
    kind: str
    files: list[str] = field(default_factory=list)
    records: int = 0
    imported: int = 0
    streamed: int = 0
    """Of the imported events, those at or after `--stream-after`, also produced to the stream."""
    reasons: Counter[str] = field(default_factory=Counter)
    rejects_file: str | None = None
    days: list[str] = field(default_factory=list)
    absent: dict[str, list[str]] = field(default_factory=dict)
    """File -> optional fields none of its records has (they took their defaults)."""

    @property
    def rejected(self) -> int:
        return sum(self.reasons.values())

    def days_without_records(self) -> list[str]:
        if not self.days:
            return []
        first, last = date.fromisoformat(self.days[0]), date.fromisoformat(self.days[-1])
        every = (str(first + timedelta(days=i)) for i in range((last - first).days + 1))
        return [d for d in every if d not in set(self.days)]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "files": self.files, "records": self.records, "imported": self.imported,
                "streamed": self.streamed, "rejected": self.rejected, "reasons": dict(self.reasons.most_common()),
                "rejects_file": self.rejects_file, "days": self.days, "days_without_records": self.days_without_records(),
                "absent_fields": self.absent}

    def render(self) -> list[str]:
        n = len(self.files)
        span = "" if not self.days else f" ({self.days[0]})" if len(self.days) == 1 else f" ({self.days[0]} … {self.days[-1]})"
        folders = f"{len(self.days)} day folder{'s' * (len(self.days) != 1)}"
        where = f"into {folders}{span}" if self.kind != "table" else "(table replaced)"
        lines = [f"{self.source}: {n} file{'s' * (n != 1)}, {self.records:,} records: {self.imported:,} imported {where}, "
                 f"{self.rejected:,} rejected" + (f"; {self.streamed:,} of them also to the stream" if self.streamed else "")]
        if self.rejected:
            reasons = "; ".join(f"{k}: {v:,}" for k, v in self.reasons.most_common())
            lines.append(f"  rejected: {reasons} -> {self.rejects_file}")
        for path, fields in self.absent.items():
            lines.append(f"  {Path(path).name} has no {', '.join(fields)}: every record takes the default")
        for d in self.days_without_records():
            lines.append(f"  no records on {d}: no folder written (the preprocessing job skips the day with a warning)")
        return lines


@dataclass
class ImportResult:
    run_id: str
    raw_dir: str
    sources: dict[str, SourceReport]
    stream_after: datetime | None = None
    tail: pa.Table | None = None
    """The samples at or after `stream_after`, in event-time order (None without it)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run_id, "raw_dir": self.raw_dir,
                               "sources": {k: v.to_dict() for k, v in self.sources.items()}}
        if self.stream_after is not None:
            out["stream"] = {"after": self.stream_after.isoformat(), "samples": 0 if self.tail is None else self.tail.num_rows}
        return out

    def render(self) -> str:
        lines = [line for r in self.sources.values() for line in r.render()]
        if self.stream_after is not None:
            n = 0 if self.tail is None else self.tail.num_rows
            lines.append(f"stream after {self.stream_after.isoformat()}: {n:,} samples "
                         "(their events are in the raw zone too: a run whose T is at or after this time trains each once)")
        return "\n".join(lines)


class Progress:
    """A log line every few seconds while a file is read: rows, rate, share of bytes, ETA."""

    def __init__(self, path: Path, every_s: float) -> None:
        self.path, self.every_s = path, every_s
        self.size = max(path.stat().st_size, 1)
        self.start = self.last = time.monotonic()

    def update(self, rows: int, position: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return
        self.last, elapsed = now, now - self.start
        frac = min(max(position / self.size, 1e-9), 1.0)
        log.info("%s: %s rows (%s rows/s), %.0f%% of %.1f MB, ETA %.0f s", self.path.name, f"{rows:,}",
                 f"{rows / elapsed:,.0f}", 100 * frac, self.size / 1e6, elapsed * (1 - frac) / frac)

    def done(self, rows: int, rejected: int) -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        log.info("%s: %s records in %.1f s (%s/s), %s rejected", self.path.name, f"{rows:,}", elapsed,
                 f"{rows / elapsed:,.0f}", f"{rejected:,}")


class RejectsFile:
    """`<raw_dir>/_rejects/<source>/<run>.jsonl`, opened on the first reject; at most `cap` lines.
    The first few rejects of the current file are kept for an error message (`examples`)."""

    EXAMPLES = 3

    def __init__(self, raw_dir: Path, source: str, run: str, cap: int) -> None:
        self.path = Path(rejects_path(str(raw_dir), source, run))
        self.cap, self.written = cap, 0
        self.examples: list[tuple[int | None, str, str]] = []
        self._fh: TextIO | None = None

    def new_file(self) -> None:
        self.examples = []

    def write(self, path: Path, source: str, rejects: list[Reject], batch: RawBatch) -> None:
        for r in rejects:
            if len(self.examples) < self.EXAMPLES:
                self.examples.append((r.line, r.reason, r.raw if r.raw is not None else batch.text(r.row)))
            if self.written >= self.cap:
                continue
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "w")
            raw = r.raw if r.raw is not None else batch.text(r.row)  # built only for the lines written
            row = {"file": str(path), "line": r.line, "source": source, "reason": r.reason, "raw": raw}
            self._fh.write(json.dumps(row) + "\n")
            self.written += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
