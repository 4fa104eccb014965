"""The project's code as one zip for a Spark cluster's executors (`spark-submit --py-files`).

A cluster's executors run on other machines: they must get `slipstream` and `spark_jobs` from the
job, not from whatever happens to be on their path. `code_zip` packs both packages of this
checkout and its shipped specs (sources and data files, no caches) into `<dest>/slipstream-code-<hash>.zip`; the hash
of the content names the file, so an unchanged checkout reuses the zip and a changed one never
overwrites a zip a running job is reading.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

PACKAGES = ("slipstream", "spark_jobs", "specs")
"""The two packages, and the shipped feature specs that `slipstream.samples` loads at import."""
SKIP_DIRS = {"__pycache__", "dev"}
"""`slipstream.dev` (local stack, generator, UI) never runs on an executor."""


def _files(root: Path) -> list[Path]:
    out: list[Path] = []
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(root / pkg):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
            out += [Path(dirpath) / f for f in sorted(filenames) if not f.endswith((".pyc", ".pyo"))]
    return out


def code_zip(root: Path, dest: Path) -> Path:
    """Zip `slipstream/`, `spark_jobs/` and `specs/` under `root` into `dest`; returns the zip's path."""
    files = _files(root)
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    path = dest / f"slipstream-code-{h.hexdigest()[:16]}.zip"
    if path.exists():
        return path
    dest.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in files:
            zf.write(f, str(f.relative_to(root)))
    tmp.replace(path)
    return path
