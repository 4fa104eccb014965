"""Bad raw lines of the kinds real logs have, for a generated data set of any spec.

Each bad line is a copy of a good record of the same file, broken one way: `malformed` (cut in
the middle), `missing_required` (a required field left out), `wrong_type` (text in a number
field), `nan` (NaN in a number field), `outside_day` (a time far outside the file's day). They are
extra lines: the truth leaves them out, and the preprocessing job must reject every one, naming
the reason. A typed Parquet file can only hold the last two kinds.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples.spec import Spec

KINDS = ("malformed", "missing_required", "wrong_type", "nan", "outside_day")
OUTSIDE_TIME = "1970-01-01T00:00:00.000000Z"
NUMERIC = ("long", "int", "double")


def _numeric_field(spec: Spec) -> str | None:
    ev = spec.events
    return next((f.name for f in ev.fields if f.type in NUMERIC and f.name != ev.id), None)


def bad_json_lines(spec: Spec, lines: pa.Array, k: int, rng: np.random.Generator, counts: dict[str, int]) -> list[str]:
    """k bad lines made from `lines` (the file's good JSON lines); `counts` adds up each kind."""
    ev = spec.events
    number = _numeric_field(spec)
    required = [n for n in ev.required if n != ev.time] or [ev.time or ""]
    out = []
    done = sum(counts.values())  # cycle the kinds over the whole data set, not per file
    for j in range(k):
        kind = KINDS[(done + j) % len(KINDS)]
        line = lines[int(rng.integers(len(lines)))].as_py()
        rec = json.loads(line)
        if kind == "malformed":
            out.append(line[: max(1, len(line) // 2)])
        else:
            if kind == "missing_required":
                rec.pop(required[j % len(required)], None)
            elif kind == "wrong_type":
                rec[number or ev.time or ""] = "oops" if number else "not-a-time"
            elif kind == "nan":
                if number is None:
                    continue
                rec[number] = float("nan")  # json.dumps writes NaN, as some loggers do
            else:
                rec[ev.time or ""] = OUTSIDE_TIME
            out.append(json.dumps(rec))
        counts[kind] = counts.get(kind, 0) + 1
    return out


def bad_typed_rows(spec: Spec, chunk: pa.Table, k: int, rng: np.random.Generator, counts: dict[str, int]) -> pa.Table:
    """k bad rows for a typed (Parquet) file: a time outside the day, or NaN in a double field."""
    ev = spec.events
    double = next((f.name for f in ev.fields if f.type == "double"), None)
    rows = chunk.take(pa.array(rng.integers(chunk.num_rows, size=k)))
    kinds = np.array(["outside_day", "nan"] if double else ["outside_day"])[np.arange(k) % (2 if double else 1)]
    t = ev.time or ""
    ts = pc.if_else(pa.array(kinds == "outside_day"), pa.scalar(0, pa.int64()).cast(rows.schema.field(t).type), rows.column(t))
    rows = rows.set_column(rows.schema.get_field_index(t), t, ts)
    if double:
        x = pc.if_else(pa.array(kinds == "nan"), pa.scalar(float("nan")), rows.column(double))
        rows = rows.set_column(rows.schema.get_field_index(double), double, x)
    for kind in kinds:
        counts[str(kind)] = counts.get(str(kind), 0) + 1
    return rows
