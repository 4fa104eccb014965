"""One batch of a user's file -> the source's typed records, the rejected rows with their
reasons, and the split of the events at T (the tail goes to the stream).

A row is rejected for the first problem found, in field order: a malformed line, a value that is
not of its field's type (a NaN or infinite number included), a required field missing, a time
outside `[--from, --to)`. A missing optional field stays missing (null): the featurizer gives it
the spec's default when it builds samples, and a `missing: indicator` feature records that it was
absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.lake.import_parse import parse_field, reason_kind
from slipstream.lake.import_read import RawBatch
from slipstream.lake.import_time import TS
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import EVENT_TIME, LABEL, SAMPLE_ID, SourceSpec, Spec
from slipstream.samples.transform import Featurizer, sample_ids

US_PER_DAY = 86_400_000_000


@dataclass(frozen=True)
class Reject:
    line: int | None
    reason: str
    kind: str
    """The reason without its value: what the summary counts (`field `price` missing`)."""
    raw: str | None = None
    """The line as read (malformed lines), else None: `row` of the batch gives it on demand."""
    row: int = -1


@dataclass(frozen=True)
class TimeRule:
    """How a timed source's rows get and check their time."""

    spread_day: date | None = None
    """Rows without a time get one spread evenly over this UTC day, in file order."""
    spread_total: int = 0
    """Records the spread covers (all files of the source in this import)."""
    time_from: datetime | None = None
    time_to: datetime | None = None

    def spread(self, ordinal: np.ndarray) -> pa.Array:
        assert self.spread_day is not None
        d0 = int(datetime(self.spread_day.year, self.spread_day.month, self.spread_day.day, tzinfo=UTC).timestamp()) * 1_000_000
        us = d0 + ((ordinal + 0.5) * US_PER_DAY / max(self.spread_total, 1)).astype(np.int64)
        return pa.array(np.minimum(us, d0 + US_PER_DAY - 1), pa.int64()).cast(TS)

    def outside(self, t: pa.Array) -> np.ndarray:
        out = np.zeros(len(t), dtype=bool)
        if self.time_from is not None:
            out |= pc.fill_null(pc.less(t, pa.scalar(self.time_from, TS)), False).to_numpy(zero_copy_only=False)
        if self.time_to is not None:
            out |= pc.fill_null(pc.greater_equal(t, pa.scalar(self.time_to, TS)), False).to_numpy(zero_copy_only=False)
        return out


def _iso(t: datetime | None) -> str:
    return "…" if t is None else t.isoformat().replace("+00:00", "Z")


def typed_records(spec: Spec, source: SourceSpec, batch: RawBatch, rule: TimeRule, ordinal_offset: int = 0
                  ) -> tuple[pa.Table, list[Reject]]:
    """The batch's good rows as `source_arrow_schema(source)` (missing optional values null) and its rejects.
    A row's position among the records a `--day` spread covers is `ordinal_offset + line - 1`."""
    n = batch.num_rows
    reasons: list[tuple[str, str] | None] = [None] * n
    cols: dict[str, pa.Array] = {}
    for fs in source.fields:
        parsed = parse_field(fs, batch.columns[fs.name]) if fs.name in batch.columns else None
        values = parsed.values if parsed is not None else pa.nulls(n, source_arrow_schema(source).field(fs.name).type)
        for i, why in (parsed.bad.items() if parsed is not None else ()):
            if reasons[i] is None:
                reasons[i] = (f"field `{fs.name}`: {why}", f"field `{fs.name}` {reason_kind(why)}")
        if fs.name == source.time and rule.spread_day is not None and values.null_count:
            ordinal = ordinal_offset + batch.lines - 1
            values = pc.if_else(pc.is_null(values), rule.spread(ordinal), values)
        if not fs.optional and values.null_count:
            for j in np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False)):
                if reasons[j] is None:
                    reasons[j] = (f"field `{fs.name}` missing", f"field `{fs.name}` missing")
        cols[fs.name] = values
    if source.time and (rule.time_from or rule.time_to):
        t = cols[source.time]
        for j in np.flatnonzero(rule.outside(t)):
            if reasons[j] is None:
                reasons[j] = (f"field `{source.time}` outside [{_iso(rule.time_from)}, {_iso(rule.time_to)}): {t[j].as_py()}",
                              f"field `{source.time}` outside [--from, --to)")
    good = np.array([r is None for r in reasons], dtype=bool)
    table = pa.table(cols, schema=source_arrow_schema(source)).filter(pa.array(good))
    rejects = [Reject(int(batch.lines[i]), r[0], r[1], row=i) for i, r in enumerate(reasons) if r is not None]
    rejects += [Reject(line, why, "malformed line", text) for line, why, text in batch.malformed]
    return table, rejects


def split_tail(table: pa.Table, time_field: str, t: datetime) -> tuple[pa.Table, pa.Table]:
    """(records before T, records at or after T): the raw zone gets the first, the stream the
    second. The one place the tail is cut, whatever it becomes (samples today, raw events later)."""
    after = pc.fill_null(pc.greater_equal(table.column(time_field), pa.scalar(t, TS)), False)
    return table.filter(pc.invert(after)), table.filter(after)


class SampleTail:
    """The events at or after T, turned into samples by the spec's `Featurizer` for the sample
    topic. A sequence needs the user's earlier events of the same UTC day, so the events of T's
    day before T are kept as context (they go to the raw zone too); a click-within label needs
    the labels source's records (from the same import) within the window."""

    def __init__(self, spec: Spec, t: datetime) -> None:
        self.spec, self.t = spec, t
        self.day_start = datetime(t.year, t.month, t.day, tzinfo=UTC)
        self.events: list[pa.Table] = []
        self.labels: list[pa.Table] = []
        self.needs_context = any(f.kind == "sequence" for f in spec.features)

    def add_events(self, before: pa.Table, after: pa.Table) -> None:
        if self.needs_context and before.num_rows:
            same_day = pc.greater_equal(before.column(self.spec.events.time or ""), pa.scalar(self.day_start, TS))
            before = before.filter(same_day)
            if before.num_rows:
                self.events.append(before)
        if after.num_rows:
            self.events.append(after)

    def add_labels(self, labels: pa.Table) -> None:
        src = self.spec.label_source
        if src is not None and labels.num_rows:
            self.labels.append(labels.filter(pc.greater_equal(labels.column(src.time or ""), pa.scalar(self.t, TS))))

    def samples(self, tables: dict[str, pa.Table]) -> pa.Table:
        """The tail's samples in event-time order (the order they are produced in)."""
        spec = self.spec
        if not self.events:
            return pa.Table.from_pylist([], schema=Featurizer(spec).schema)
        ev = pa.concat_tables(self.events)
        ev = ev.append_column(SAMPLE_ID, sample_ids(spec, ev))
        if spec.label.kind == "click_within":
            ev = ev.append_column(LABEL, self._click_labels(ev))
        seq = next((f for f in spec.features if f.kind == "sequence"), None)
        keys = [(seq.per or "", "ascending")] if seq is not None else []
        ev = ev.take(pc.sort_indices(ev, sort_keys=keys + [(spec.events.time or "", "ascending"), (SAMPLE_ID, "ascending")]))
        out = Featurizer(spec, tables).samples(ev)
        out = out.filter(pc.greater_equal(out.column(EVENT_TIME), pa.scalar(self.t, TS)))
        return out.take(pc.sort_indices(out, sort_keys=[(EVENT_TIME, "ascending"), (SAMPLE_ID, "ascending")]))

    def _click_labels(self, ev: pa.Table) -> pa.Array:
        src = self.spec.label_source
        label = np.zeros(ev.num_rows, dtype=np.int32)
        if src is None or not self.labels:
            return pa.array(label)
        clicks = pa.concat_tables(self.labels)
        idx = pc.index_in(pc.cast(clicks.column(src.key or ""), pa.string()), value_set=ev.column(SAMPLE_ID))
        found = pc.is_valid(idx).to_numpy(zero_copy_only=False)
        at = pc.fill_null(idx, 0).to_numpy()[found]
        t_click = pc.cast(clicks.column(src.time or ""), pa.int64()).to_numpy()[found]
        t_event = pc.cast(ev.column(self.spec.events.time or ""), pa.int64()).to_numpy()[at]
        delay = t_click - t_event
        ok = (delay >= 0) & (delay <= self.spec.label.window_s * 1_000_000)
        label[at[ok]] = 1
        return pa.array(label)
