"""The raw zone's layout: where each source of a feature spec lands, and when a day is ready.

```
<raw_dir>/<events or labels source>/day=YYYY-MM-DD/hour=HH/<name>.jsonl.gz | .jsonl | .json(.gz) | .parquet
<raw_dir>/<table source>/<name>.parquet          (a side table, whole; replaced by a folder swap)
<raw_dir>/_rejects/<source>/<run>.jsonl          (rows `slipstream import` rejected, with reasons)
```
The default spec's sources are `impressions` (events) and `clicks` (labels). Records land in the
folder of the UTC hour of their time field, so a click on one of day D's late impressions can sit
in day D+1: the job for day D reads the labels of day D and of the first
`spill_hours(attribution_s)` hours of D+1. A day without records has no folder. Names starting
with `_` or `.` are ignored (markers, checksums, staging folders).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta

from pyarrow import fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO

IMPRESSIONS = "impressions"
CLICKS = "clicks"
FORMATS_BY_SUFFIX = (
    (".jsonl.gz", "json"),
    (".json.gz", "json"),
    (".jsonl", "json"),
    (".json", "json"),
    (".parquet", "parquet"),
)


def raw_format(path: str) -> str | None:
    """`json` or `parquet` by file name, None for a file the job does not read."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if name.startswith(("_", ".")):
        return None
    for suffix, fmt in FORMATS_BY_SUFFIX:
        if name.endswith(suffix):
            return fmt
    return None


def spill_hours(attribution_s: int) -> int:
    """How many hours of day D+1 can hold clicks on day D's impressions."""
    if attribution_s < 0:
        raise ValueError(f"attribution window must be >= 0 seconds, got {attribution_s}")
    return math.ceil(attribution_s / 3600)


REJECTS_DIR = "_rejects"


def source_dir(raw_dir: str, source: str) -> str:
    """A source's folder: its day folders (events, labels) or its files (a side table)."""
    return f"{raw_dir.rstrip('/')}/{source}"


def day_dir(raw_dir: str, source: str, day: date) -> str:
    return f"{source_dir(raw_dir, source)}/day={day.isoformat()}"


def hour_dir(raw_dir: str, source: str, day: date, hour: int) -> str:
    return f"{day_dir(raw_dir, source, day)}/hour={hour:02d}"


def rejects_path(raw_dir: str, source: str, run: str) -> str:
    """Where `slipstream import` writes the rows of `source` it rejected in run `run`."""
    return f"{raw_dir.rstrip('/')}/{REJECTS_DIR}/{source}/{run}.jsonl"


def click_dirs(raw_dir: str, day: date, attribution_s: int, labels: str = CLICKS) -> list[str]:
    """Folders holding the labels (clicks) day D needs: all of D, and D+1's spill-over hours."""
    nxt = day + timedelta(days=1)
    return [day_dir(raw_dir, labels, day)] + [
        hour_dir(raw_dir, labels, nxt, h) for h in range(min(spill_hours(attribution_s), 24))
    ]


def filesystem(uri: str, io_properties: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it, for a local path, a `file:` URI (Hadoop
    writes `file:/x`) or an object-store URI (reached with `io_properties`: `s3.endpoint`, keys;
    `Settings.s3_io_properties()`)."""
    if uri.startswith("file:"):
        return pafs.LocalFileSystem(), "/" + uri[len("file:"):].lstrip("/")
    if "://" not in uri:
        return pafs.LocalFileSystem(), uri
    scheme, rest = uri.split("://", 1)
    scheme = {"s3a": "s3", "s3n": "s3"}.get(scheme, scheme)  # Hadoop's names for the same store
    netloc = rest.split("/", 1)[0]
    fs = PyArrowFileIO(dict(io_properties or {})).fs_by_scheme(scheme, netloc)
    return fs, rest if scheme != "file" else "/" + rest.lstrip("/")


def _has_data_file(fs: pafs.FileSystem, path: str) -> bool:
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=True))
    return any(i.type == pafs.FileType.File and raw_format(i.path) for i in infos)


def _subdirs(fs: pafs.FileSystem, path: str, prefix: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and i.base_name.startswith(prefix))


def raw_day_ready(
    raw_dir: str, day: date, attribution_s: int, *, now: datetime | None = None, grace_s: int = 3600,
    io_properties: Mapping[str, str] | None = None, events: str = IMPRESSIONS, labels: str | None = CLICKS,
) -> bool:
    """Whether day D can be preprocessed (for the Airflow sensor).

    Ready when D's events (`events`: impressions) have landed (its last hour, 23, has a file) and
    the labels D needs (`labels`: clicks; None for a spec without a labels source) have landed:
    D+1's last spill-over hour (or any later hour or day) has a file, because hours land in order.
    A quiet hour may hold no file at all, so once `now` is past the end of the spill-over plus
    `grace_s`, any events of D and no more labels are enough.
    """
    fs, root = filesystem(raw_dir, io_properties)
    nxt = day + timedelta(days=1)
    end_of_day = datetime(nxt.year, nxt.month, nxt.day, tzinfo=UTC)
    old_enough = (now or datetime.now(UTC)) >= end_of_day + timedelta(seconds=attribution_s + grace_s)
    if not _has_data_file(fs, hour_dir(root, events, day, 23)):
        return old_enough and _has_data_file(fs, day_dir(root, events, day))
    spill = spill_hours(attribution_s) if labels else 0
    if spill == 0 or old_enough or labels is None:
        return True
    clicks = source_dir(root, labels)
    last_needed = f"hour={min(spill, 24) - 1:02d}"
    for hour in _subdirs(fs, day_dir(root, labels, nxt), "hour="):
        if hour >= last_needed and _has_data_file(fs, f"{day_dir(root, labels, nxt)}/{hour}"):
            return True
    later_days = [d for d in _subdirs(fs, clicks, "day=") if d > f"day={nxt.isoformat()}"]
    return any(_has_data_file(fs, f"{clicks}/{d}") for d in later_days)
