"""The raw zone's layout: where a day's impressions and clicks land, and when a day is ready.

```
<raw_dir>/impressions/day=YYYY-MM-DD/hour=HH/<name>.jsonl.gz | .jsonl | .json(.gz) | .parquet
<raw_dir>/clicks/day=YYYY-MM-DD/hour=HH/<name>.<same formats>
```
Files land in the folder of the UTC hour their records happen in, so a click on one of day D's
late impressions can sit in day D+1. The job for day D therefore reads the clicks of day D and of
the first `spill_hours(attribution_s)` hours of D+1. Names starting with `_` or `.` are ignored
(markers, checksums).
"""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta, timezone
from typing import Mapping

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


def day_dir(raw_dir: str, kind: str, day: date) -> str:
    return f"{raw_dir.rstrip('/')}/{kind}/day={day.isoformat()}"


def hour_dir(raw_dir: str, kind: str, day: date, hour: int) -> str:
    return f"{day_dir(raw_dir, kind, day)}/hour={hour:02d}"


def click_dirs(raw_dir: str, day: date, attribution_s: int) -> list[str]:
    """Folders holding the clicks day D needs: all of D, and D+1's spill-over hours."""
    nxt = day + timedelta(days=1)
    return [day_dir(raw_dir, CLICKS, day)] + [
        hour_dir(raw_dir, CLICKS, nxt, h) for h in range(min(spill_hours(attribution_s), 24))
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
    io_properties: Mapping[str, str] | None = None,
) -> bool:
    """Whether day D can be preprocessed (for the Airflow sensor).

    Ready when D's impressions have landed (its last hour, 23, has a file) and the clicks D needs
    have landed: D+1's last spill-over hour (or any later hour or day) has a file, because hours
    land in order. A quiet hour may hold no file at all, so once `now` is past the end of the
    spill-over plus `grace_s`, any impressions of D and no more clicks are enough.
    """
    fs, root = filesystem(raw_dir, io_properties)
    nxt = day + timedelta(days=1)
    end_of_day = datetime(nxt.year, nxt.month, nxt.day, tzinfo=timezone.utc)
    old_enough = (now or datetime.now(timezone.utc)) >= end_of_day + timedelta(seconds=attribution_s + grace_s)
    if not _has_data_file(fs, hour_dir(root, IMPRESSIONS, day, 23)):
        return old_enough and _has_data_file(fs, day_dir(root, IMPRESSIONS, day))
    spill = spill_hours(attribution_s)
    if spill == 0 or old_enough:
        return True
    clicks = f"{root.rstrip('/')}/{CLICKS}"
    last_needed = f"hour={min(spill, 24) - 1:02d}"
    for hour in _subdirs(fs, day_dir(root, CLICKS, nxt), "hour="):
        if hour >= last_needed and _has_data_file(fs, f"{day_dir(root, CLICKS, nxt)}/{hour}"):
            return True
    later_days = [d for d in _subdirs(fs, clicks, "day=") if d > f"day={nxt.isoformat()}"]
    return any(_has_data_file(fs, f"{clicks}/{d}") for d in later_days)
