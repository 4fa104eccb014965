"""Every benchmark runs at a tiny size and returns its JSON object: none can rot unnoticed.

The sizes (`bench.BENCHMARKS[*].smoke`) are far too small for the numbers to mean anything; what
is checked is that each bench runs every measured path to the end and reports the machine load
or ratios it promises."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import BENCHMARKS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", [b.name for b in BENCHMARKS])
def test_the_benchmark_runs_at_a_tiny_size(name: str, tmp_path: Path) -> None:
    smoke = next(b for b in BENCHMARKS if b.name == name).smoke
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}", "SLIPSTREAM_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "slipstream.cli", "bench", name, "--json", *smoke], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict) and result, done.stdout[-2000:]
    numbers = [v for v in result.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert numbers and all(not math.isnan(v) for v in numbers), result
    if name == "history":  # the range-built table equals the day-by-day job's, read afresh, row for row
        assert result["same_rows"] is True and result["compared_rows"] == 1500, result
        assert result["forward_tail"]["rows"] > 0 and result["reason"], result


def test_the_bench_command_lists_only_benchmarks() -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}"}
    listed = subprocess.run([sys.executable, "-m", "slipstream.cli", "bench"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [b.name for b in BENCHMARKS]
    modules = sorted(p.stem for p in (REPO / "bench").glob("*.py") if p.stem != "__init__")
    assert modules == sorted(b.name for b in BENCHMARKS), "a module in bench/ is a benchmark, or lives in bench/support/"
