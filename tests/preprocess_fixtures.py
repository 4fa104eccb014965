"""Helpers for the preprocessing tests: hand-made raw rows, a small generated raw zone, and a
content checksum of a day in `samples`."""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.table import Table

from slipstream.lake.iceberg import day_predicate

HAND_DAY = date(2026, 10, 20)
"""A day of hand-made rows, far from the generated days so neither sees the other's clicks."""


def ts(day: date, hh: int, mm: int, ss: float = 0.0) -> str:
    t = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(hours=hh, minutes=mm, seconds=ss)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def impression(iid: str, when: str, user: int, item: int, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "impression_id": iid, "ts": when, "user_id": user, "item_id": item, "device": "ios",
        "country": "de", "item_category": "cat01", "price": 12.5, "position": 3,
        "item_age_days": 40.0, "user_tenure_days": 300.0,
    }
    row.update(over)
    return row


def write_jsonl(path: Path, rows: list[dict[str, Any]], extra_lines: list[bytes] = ()) -> Path:  # type: ignore[assignment]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as fh:
        for r in rows:
            fh.write(json.dumps(r).encode() + b"\n")
        for line in extra_lines:
            fh.write(line + b"\n")
    return path


def write_hand_day(raw: Path) -> dict[str, dict[str, Any]]:
    """Hand-made impressions and clicks of HAND_DAY; returns the expected label/hist per id."""
    d, nxt, prev = HAND_DAY, HAND_DAY + timedelta(days=1), HAND_DAY - timedelta(days=1)
    imps = [
        impression("h-early", ts(d, 1, 0), user=1, item=101),
        impression("h-in", ts(d, 2, 0), user=1, item=102),
        impression("h-out", ts(d, 3, 0), user=1, item=103),
        impression("h-dup", ts(d, 4, 0), user=2, item=201),
        impression("h-dup", ts(d, 4, 0), user=2, item=201),  # logged twice: one sample
        impression("h-before", ts(d, 5, 0), user=2, item=202),
        impression("h-midnight", ts(d, 23, 50), user=1, item=104),
    ]
    by_hour: dict[str, list[dict[str, Any]]] = {}
    for r in imps:
        by_hour.setdefault(r["ts"][11:13], []).append(r)
    for hh, rows in by_hour.items():
        write_jsonl(raw / "impressions" / f"day={d}" / f"hour={hh}" / "part-0.jsonl.gz", rows)
    # Yesterday's impression of user 1 must not enter today's history (same UTC day rule).
    write_jsonl(raw / "impressions" / f"day={prev}" / "hour=23" / "part-0.jsonl.gz",
                [impression("h-yesterday", ts(prev, 23, 59), user=1, item=999)])
    clicks = {
        d: [
            {"impression_id": "h-in", "ts": ts(d, 2, 29, 59)},     # 29:59 after: inside the window
            {"impression_id": "h-out", "ts": ts(d, 3, 30, 1)},     # 30:01 after: outside
            {"impression_id": "h-dup", "ts": ts(d, 4, 1)},
            {"impression_id": "h-before", "ts": ts(d, 4, 59)},      # before its impression
        ],
        nxt: [{"impression_id": "h-midnight", "ts": ts(nxt, 0, 10)}],  # across midnight, 20 min
    }
    for day, rows in clicks.items():
        write_jsonl(raw / "clicks" / f"day={day}" / f"hour={rows[0]['ts'][11:13]}" / "part-0.jsonl.gz", rows)
    return {
        "h-early": {"label": 0, "hist": []},
        "h-in": {"label": 1, "hist": [101]},
        "h-out": {"label": 0, "hist": [101, 102]},
        "h-dup": {"label": 1, "hist": []},
        "h-before": {"label": 0, "hist": [201]},
        "h-midnight": {"label": 1, "hist": [101, 102, 103]},
    }


def day_rows(table: Table, day: date) -> pa.Table:
    return table.scan(row_filter=day_predicate(table, day)).to_arrow().sort_by("sample_id")


def content_checksum(rows: pa.Table) -> str:
    """SHA-256 over the rows in sample_id order (every column, canonical JSON per row)."""
    h = hashlib.sha256()
    for r in rows.sort_by("sample_id").to_pylist():
        h.update(json.dumps(r, default=str, sort_keys=True).encode())
    return h.hexdigest()
