"""A checkpoint commit is atomic, and audit parts of steps past the last commit are dropped on resume."""


from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from trainers.checkpoint.store import Checkpointer
from trainers.data.rows import Rows
from trainers.observe.sample_audit import AuditWriter, drop_uncommitted, read_audit


@pytest.fixture(scope="module")
def table() -> pa.Table:
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=600, seed=3)
    return next(iter(reference_samples(cfg).values()))


def test_checkpoint_commit_is_atomic_and_uncommitted_audit_is_dropped(tmp_path: Path, table: pa.Table) -> None:
    ck = Checkpointer(tmp_path / "checkpoint", rank=0, barrier=lambda: None, keep=2)
    audit = AuditWriter(tmp_path / "audit", rank=0)
    rows = Rows.from_arrow(table, source=0, epoch=0)
    for step in (1, 2, 3):
        audit.add(rows.slice(step * 10, step * 10 + 10), step)
        audit.write_part(step)
        ck.save(step, {"model": {}}, {"x": step}, {"step": step, "world": 1})
    assert ck.latest() == tmp_path / "checkpoint" / "step-000000003"
    assert sorted(p.name for p in (tmp_path / "checkpoint").glob("step-*")) == ["step-000000002", "step-000000003"]
    # a kill after writing the audit part of step 4 but before its checkpoint committed
    audit.add(rows.slice(40, 50), 4)
    audit.write_part(4)
    (tmp_path / "checkpoint" / "step-000000004.tmp").mkdir()
    assert json.loads((ck.latest() / "meta.json").read_text())["step"] == 3  # type: ignore[operator]
    drop_uncommitted(tmp_path / "audit", 3)
    assert read_audit(tmp_path).column("sample_id").to_pylist() == rows.slice(10, 40).sample_id.to_pylist()
