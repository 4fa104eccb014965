"""`slipstream quality check` and `slipstream insight` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slipstream.cli import main
from slipstream.lake.iceberg import get_catalog
from slipstream.settings import Settings
from tests.quality_fixtures import day_of, fill_samples, reference_days, replace_column


def test_quality_check_and_insight_commands(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    days = dict(reference_days())
    bad = days[str(day_of(7))]
    days[str(day_of(7))] = replace_column(bad, "label", [2] * bad.num_rows)
    fill_samples(get_catalog(settings), settings.namespace, days)

    assert main(["quality", "check", "--day", str(day_of(6)), "--run-id", "cli-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True and out["rows"] == 4000 and Path(out["html"]).exists()

    assert main(["quality", "check", "--day", str(day_of(7)), "--run-id", "cli-run"]) == 2
    err = capsys.readouterr().err
    assert "label.binary [critical]: observed 4000" in err

    assert main(["insight", "--run", "cli-run"]) == 0
    report = Path(capsys.readouterr().out.strip())
    assert report.name == "report.html" and "label.binary" in report.read_text()
