"""The trainer's configuration: dotted names in errors, the shipped example loads."""


from __future__ import annotations

from pathlib import Path

import pytest

from slipstream.errors import ConfigError
from slipstream.settings import Settings
from trainers.config.schema import load_config


def _cfg(tmp_path: Path, *sets: str) -> object:
    base = ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"]
    return load_config(None, [*base, *sets], Settings(home=tmp_path))


def test_config_validates_with_dotted_names(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "data.stop.mode=samples", "data.stop.samples=10", "model.top_mlp=[8, 4]")
    assert cfg.data.stop.samples == 10 and cfg.model.top_mlp == [8, 4]  # type: ignore[attr-defined]
    assert cfg.run.runs_dir == str(tmp_path / "runs")  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="data.replay_share"):
        _cfg(tmp_path, "data.replay_share=1.5")
    with pytest.raises(ConfigError, match="timezone"):
        _cfg(tmp_path, "data.t_handoff=2026-11-03T00:00:00")
    with pytest.raises(ConfigError, match="unknown key.*data.batchsize"):
        _cfg(tmp_path, "data.batchsize=3")
    with pytest.raises(ConfigError, match="missing required key.*data.snapshot_id"):
        load_config(None, ["data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"], Settings(home=tmp_path))


def test_the_example_config_loads_with_the_run_keys(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[3] / "trainers" / "config" / "example.yaml"
    cfg = load_config(example, ["data.snapshot_id=42", "data.t_handoff=2026-11-04T00:00:00Z", "run.run_id=d"],
                      Settings(home=tmp_path))
    assert cfg.data.snapshot_id == 42 and cfg.data.window_start.isoformat() == "2026-11-01T00:00:00+00:00"
    with pytest.raises(ConfigError, match="data.snapshot_id"):
        load_config(example, ["data.t_handoff=2026-11-04T00:00:00Z", "run.run_id=d"], Settings(home=tmp_path))
