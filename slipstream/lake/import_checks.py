"""What `slipstream import` refuses about a whole file, with a message a person can act on.

- A file whose columns (a CSV/TSV header, Parquet's schema, the keys of a JSON-lines file) lack a
  field of the spec while it has columns the spec does not know: a field was misnamed (`i1` for
  `I1`), and every value of it would silently become the default. Refused with a did-you-mean,
  unless the user allows the field to be absent (`--allow-missing FIELD`). An optional field
  absent with no unknown column takes its default, with a warning and a line in the summary.
- A required field that is no column of the file: every row would be rejected; refused at once
  (the time field is fine when `--day` gives the records a time).
- A file whose every row is rejected, or whose every line is malformed: refused, with the first
  bad lines and, for CSV/TSV, the separator that would split the lines into the spec's columns.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from slipstream.errors import RawDataError
from slipstream.samples.spec import SourceSpec

SEPARATORS = (",", "\t", ";", "|")
SHOWN = 3


def _name(sep: str) -> str:
    return {"\t": "a tab (tsv)", ",": "`,` (csv)"}.get(sep, f"`{sep}`")


def did_you_mean(field: str, unknown: Iterable[str]) -> str | None:
    """The unknown column most like `field`: the same name in another case, else a close spelling."""
    unknown = list(unknown)
    same = [u for u in unknown if u.lower() == field.lower()]
    if same:
        return same[0]
    close = difflib.get_close_matches(field, unknown, n=1, cutoff=0.75)
    return close[0] if close else None


@dataclass(frozen=True)
class ColumnCheck:
    absent: tuple[str, ...]
    """Optional fields no record of the file has: they take their defaults (allowed or unambiguous)."""
    unknown: tuple[str, ...]
    """Columns of the file the source does not know (ignored)."""


def check_columns(path: Path, source: SourceSpec, names: Iterable[str], *, allow_missing: Iterable[str] = (),
                  time_given: bool = False, fmt: str = "", sep_hint: str | None = None) -> ColumnCheck:
    """Refuse a file whose columns misname the source's fields (see the module docstring)."""
    names = set(names)
    allowed = set(allow_missing)
    unknown = tuple(sorted(n for n in names if n not in source.field_names and not n.startswith("_")))
    required = [f for f in source.required if f not in names and not (f == source.time and time_given)]
    optional = [f.name for f in source.fields if f.optional and f.name not in names]
    guessed = {f: did_you_mean(f, unknown) for f in [*required, *optional]}
    refused = required + [f for f in optional if f not in allowed and unknown]
    if source.time is not None and refused == [source.time] and not guessed[source.time]:
        raise RawDataError(f"{path}: the records of source {source.name!r} have no time (`{source.time}` is no column of "
                           "the file): give --day YYYY-MM-DD to spread them over that UTC day, in file order. "
                           "Nothing was imported")
    if refused:
        what = ", ".join(f"`{f}`" + (f" (did you mean `{guessed[f]}`?)" if guessed[f] else "") for f in refused)
        why = f"the file has columns the spec does not know: {', '.join(unknown[:12])}" if unknown else \
            f"its columns are {', '.join(sorted(names)[:12]) or 'none'}"
        fix = ("rename the columns (or the fields in the spec)"
               + ("" if not [f for f in refused if f not in required]
                  else ", or give --allow-missing FIELD for an optional field that is truly absent (it then takes its default)"))
        if source.time in required:
            fix += "; a log without times takes them from --day YYYY-MM-DD"
        if sep_hint:
            fix = f"{sep_hint}; else {fix}"
        raise RawDataError(f"{path}: field{'s' * (len(refused) > 1)} {what} of source {source.name!r} "
                           f"{'are' if len(refused) > 1 else 'is'} no column of the file, and {why}: {fix}. Nothing was imported")
    return ColumnCheck(tuple(optional), unknown)


def separator_hint(lines: Sequence[str], fmt: str, expected: int) -> str | None:
    """For CSV/TSV lines that do not split into `expected` columns with the format's separator:
    the separator that does, as a question."""
    if fmt not in ("csv", "tsv") or not lines:
        return None
    used = "," if fmt == "csv" else "\t"
    got = Counter(line.count(used) + 1 for line in lines).most_common(1)[0][0]
    for sep in SEPARATORS:
        if sep != used and all(line.count(sep) + 1 == expected for line in lines):
            ext = "tsv" if sep == "\t" else "csv"
            return (f"{got} column{'s' * (got != 1)} per line, the spec expects {expected}: is the separator "
                    f"{_name(sep)}? The source reads {fmt} (set `format:` in the spec, or name the file .{ext})")
    return None


def all_rejected(path: Path, rows: int, reasons: Counter[str], examples: Sequence[tuple[int | None, str, str]],
                 source: SourceSpec, rejects_path: Path | None, *, fmt: str, expected_columns: int,
                 time_given: bool) -> RawDataError:
    """The error for a file that had lines and yielded no record: the reasons, the first bad lines,
    and the likely cause."""
    counts = "; ".join(f"{k} in {v:,} record{'s' * (v != 1)}" for k, v in reasons.most_common(5))
    shown = "; ".join(f"line {line}: {why}" for line, why, _ in examples[:1])
    if len(examples) > 1:
        shown += f"; also line{'s' * (len(examples) > 2)} {', '.join(str(line) for line, _, _ in examples[1:SHOWN])}"
    hint = separator_hint([raw for _, _, raw in examples if raw], fmt, expected_columns)
    if not hint and source.time and not time_given and reasons.get(f"field `{source.time}` missing"):
        hint = f"records without `{source.time}`: give --day YYYY-MM-DD to spread them over that UTC day"
    where = f" Rejected rows: {rejects_path}" if rejects_path else ""
    return RawDataError(f"all {rows:,} rows of {path} rejected: {counts}" + (f" ({hint})" if hint else "")
                        + f". First bad lines: {shown}.{where} Nothing was imported")
