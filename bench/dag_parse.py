"""How much our DAG files cost the dag-processor, against a minimal TaskFlow DAG parsed the same way.

Each measurement is a fresh interpreter with Airflow already imported (as the dag-processor's
parsing child has it), timing `DagBag(<one file>)` only: our plugin imports, params, operators.
Reports the median of `--repeats` runs per file, the ratio to the baseline, and whether parsing
imported anything heavy (torch, pyspark, pyiceberg, pandas, pyarrow).

    slipstream bench dag_parse --json [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "pyspark", "pyiceberg", "pandas", "pyarrow", "great_expectations")
BASELINE_DAG = '''
import pendulum
from airflow.sdk import dag, task

@dag(dag_id="baseline", schedule="@daily", start_date=pendulum.datetime(2025, 1, 1, tz="UTC"), catchup=False)
def baseline():
    @task
    def a():
        return 1

    @task
    def b(x):
        return x

    b(a())

baseline()
'''
PROBE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
import airflow.sdk  # noqa: F401  (the parsing child has these already)
t0 = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
dt = time.perf_counter() - t0
print("PROBE " + json.dumps({"s": dt, "dags": sorted(bag.dag_ids), "errors": len(bag.import_errors),
                             "heavy": [m for m in sys.argv[2].split(",") if m in sys.modules]}))
"""


def probe(path: Path, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), ",".join(HEAVY)], env=env,
                         capture_output=True, text=True, timeout=300)
    line = next((text for text in out.stdout.splitlines() if text.startswith("PROBE ")), None)
    if line is None:
        raise RuntimeError(f"parsing {path} failed:\n{out.stderr[-2000:]}")
    probed: dict[str, Any] = json.loads(line.removeprefix("PROBE "))
    return probed


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="slipstream bench dag_parse")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="(accepted after the name; the runner prints JSON)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base_file = Path(tmp) / "baseline_dag.py"
        base_file.write_text(BASELINE_DAG)
        env = {**os.environ, "AIRFLOW_HOME": str(Path(tmp) / "airflow"), "SLIPSTREAM_HOME": str(Path(tmp) / "home"),
               "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins")])}
        files = {"baseline": base_file, **{p.stem: p for p in sorted((REPO / "dags").glob("*.py"))}}
        results: dict[str, Any] = {}
        for name, path in files.items():
            runs = [probe(path, env) for _ in range(args.repeats)]
            results[name] = {"median_s": round(statistics.median(r["s"] for r in runs), 3),
                             "errors": runs[0]["errors"], "heavy_imports": runs[0]["heavy"]}
    base = results["baseline"]["median_s"]
    for r in results.values():
        r["ratio_to_baseline"] = round(r["median_s"] / base, 2) if base > 0 else None
    return {"benchmark": "dag_parse", "repeats": args.repeats, "baseline_s": base, "files": results,
            "worst_ratio": max(r["ratio_to_baseline"] for n, r in results.items() if n != "baseline"),
            "any_heavy_import": any(r["heavy_imports"] for r in results.values())}
