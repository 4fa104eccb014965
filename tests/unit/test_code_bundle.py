"""The code zip a Spark cluster's executors get: a fresh interpreter that has only the zip (not
the checkout) on its path imports the executor-side modules from it, shipped specs included."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from slipstream.pipeline.code_bundle import code_zip

REPO = Path(__file__).resolve().parents[2]


def test_zip_holds_the_packages_and_specs_but_no_dev_or_caches(tmp_path: Path) -> None:
    path = code_zip(REPO, tmp_path)
    names = zipfile.ZipFile(path).namelist()
    assert "slipstream/samples/spec.py" in names and "spark_jobs/finisher.py" in names
    assert "specs/synthetic.yaml" in names and "slipstream/samples/spec.schema.json" in names
    assert not any(n.startswith("slipstream/dev/") or "__pycache__" in n for n in names)
    assert code_zip(REPO, tmp_path) == path  # same content, same file


def test_executor_modules_import_from_the_zip_alone(tmp_path: Path) -> None:
    path = code_zip(REPO, tmp_path / "code")
    probe = (
        "import sys; sys.path.insert(1, sys.argv[1]);"
        "import spark_jobs.finisher, spark_jobs.writer, slipstream.samples.schema, slipstream;"
        "from slipstream.samples.spec import load_spec; load_spec('synthetic');"
        "print(slipstream.__file__)"
    )
    # -S: no site-packages path hooks (the editable install would find the checkout), -E: no PYTHONPATH
    site = [p for p in sys.path if p.endswith("site-packages")]
    code = f"import sys; sys.path.extend({site!r}); " + probe
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code, str(path)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(path)), out.stdout
