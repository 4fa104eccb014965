"""Model registry: packages with lineage, champion/challenger with a tolerance, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slipstream.pipeline.registry import ModelRegistry, decide_promotion
from slipstream.pipeline.run_metrics import AucScore, EvalSet
from slipstream.pipeline.runlayout import RunArtifactMissing, make_run_id, read_summary, update_summary
from slipstream.settings import Settings
from tests.airflow_fixtures import T_HANDOFF, write_run
from tests.metrics_fixtures import run_metrics, scored_set


def test_first_model_is_champion_then_the_same_rows_decide(tmp_path: Path) -> None:
    reg = ModelRegistry(str(tmp_path / "registry"))
    runs = tmp_path / "runs"
    first = reg.publish(write_run(runs, "daily-1", 0.750), tolerance=0.002)
    assert first["decision"]["promoted"] and first["decision"]["champion_run_id"] is None
    assert "vs its logistic baseline 0.5000: +0.2500 [+0.2400, +0.2600] on 1,000 forward-tail rows" in first["decision"]["reason"]
    assert reg.champion()["run_id"] == "daily-1"

    # the champion re-scored on the challenger's rows: the lower bound -0.0018 is above -0.002
    within = reg.publish(write_run(runs, "daily-2", 0.7485, champion=("daily-1", 0.750), half_width=0.0003),
                         tolerance=0.002)
    assert within["decision"]["promoted"] and within["decision"]["champion_auc"] == 0.750
    assert within["decision"]["evaluated_on"] == "forward_tail"
    assert reg.champion()["run_id"] == "daily-2"

    worse = reg.publish(write_run(runs, "daily-3", 0.740, champion=("daily-2", 0.7485)), tolerance=0.002)
    d = worse["decision"]
    assert not d["promoted"] and d["registered"] and d["challenger_auc"] == 0.740 and d["champion_auc"] == 0.7485
    assert "vs the champion daily-2 on the same 1,000 rows: 0.7400 vs 0.7485 (-0.0085 [-0.0185, +0.0015])" in d["reason"]
    assert "the champion stays" in d["reason"]
    assert reg.champion()["run_id"] == "daily-2"

    # a champion that could not be re-scored on the same rows is not replaced on other numbers
    unjudged = reg.publish(write_run(runs, "daily-4", 0.9), tolerance=0.002)
    assert not unjudged["decision"]["promoted"] and "could not be compared" in unjudged["decision"]["reason"]
    assert reg.champion()["run_id"] == "daily-2"

    pkgs = reg.list_packages()
    assert [p["run_id"] for p in pkgs] == ["daily-1", "daily-2", "daily-3", "daily-4"]
    pkg = reg.package("daily-3")
    assert pkg["lineage"]["snapshot_id"] == 42 and pkg["lineage"]["final_offsets"] == {"0": 9}
    assert pkg["metrics"]["auc"] == 0.740 and pkg["metrics"]["auc_rows"] == 1000 and pkg["metrics"]["auc_on"] == "forward_tail"
    assert pkg["schema_version"] == 1
    assert (tmp_path / "registry" / "models" / "daily-3" / "model.pt").read_bytes() == b"weights-daily-3"
    assert len(pkg["files"]["model.pt"]["sha256"]) == 64


def test_no_auc_is_never_promoted() -> None:
    d = decide_promotion("r", run_metrics("r"), {"run_id": "c", "auc": 0.7}, 0.01)
    assert not d.promoted and "no finite AUC on 0 validation rows" in d.reason
    empty = EvalSet(rows=10, users=3, model=AucScore(auc=None))
    assert not decide_promotion("r", run_metrics("r", forward_tail=empty), None, 0.01).promoted


def test_a_model_that_does_not_beat_its_baseline_is_never_promoted() -> None:
    tail = scored_set(0.61, baseline=0.64, rows=500, users=120, half_width=0.02)
    for champion in (None, {"run_id": "old", "auc": 0.5}):  # not even as the first model
        d = decide_promotion("r", run_metrics("r", forward_tail=tail), champion, 0.01)
        assert not d.promoted and d.registered and d.baseline_auc == 0.64
        assert ("AUC 0.6100 vs its logistic baseline 0.6400: -0.0300 [-0.0500, -0.0100] on 500 forward-tail rows after T "
                "of 120 users: it does not beat its logistic-regression baseline") in d.reason


def test_a_model_equal_to_its_baseline_is_registered_not_promoted(tmp_path: Path) -> None:
    """Scores from the real bootstrap: the model and its baseline see the same signal through noise
    of the same size (equally good), so the model's advantage is not significant; the first model
    is registered, not promoted, and the reason says why. The `point` rule (for demos) keeps the old
    behaviour: ahead by a hair, promoted."""
    from slipstream.scoring import auc
    from trainers.eval.judge import judge

    rng = np.random.default_rng(6)  # a draw where the model is ahead by a hair (+0.017)
    users = rng.integers(0, 400, 3000)
    labels = (rng.random(3000) < 0.25).astype(np.float64)
    signal = 0.25 + 0.1 * labels
    baseline, model = (np.clip(signal + 0.15 * rng.standard_normal(3000), 0.01, 0.99) for _ in range(2))
    tail = judge(labels, users, {"model": model, "baseline": baseline})
    assert tail.vs_baseline is not None and tail.vs_baseline.lo < 0 < tail.vs_baseline.diff, tail.vs_baseline
    runs = tmp_path / "runs"
    path = write_run(runs, "daily-eq", None)
    (path / "metrics.json").write_text(run_metrics("daily-eq", forward_tail=tail).to_json())
    reg = ModelRegistry(str(tmp_path / "registry"))
    d = reg.publish(path)["decision"]
    assert d["registered"] and not d["promoted"] and reg.champion() is None
    assert "registered, not promoted" in d["reason"]
    assert "its advantage over its logistic-regression baseline is not significant" in d["reason"]
    assert f"{auc(labels, model):.4f} vs its logistic baseline {auc(labels, baseline):.4f}" in d["reason"]
    # the point rule promotes a model ahead by a hair
    assert decide_promotion("daily-eq", run_metrics("daily-eq", forward_tail=tail), None, 0.002, "point").promoted


def test_without_a_forward_tail_the_validation_days_decide_but_never_replace_a_champion() -> None:
    val = scored_set(0.70, baseline=0.65, rows=300, users=90)
    first = decide_promotion("r", run_metrics("r", validation=val), None, 0.01)
    assert first.promoted and first.evaluated_on == "validation" and "300 validation rows" in first.reason
    kept = decide_promotion("r", run_metrics("r", validation=val), {"run_id": "old", "auc": 0.5}, 0.01)
    assert not kept.promoted and "without a forward tail after T" in kept.reason


def test_missing_export_names_the_file(tmp_path: Path) -> None:
    run = write_run(tmp_path / "runs", "daily-x", 0.7)
    (run / "export" / "model.pt").unlink()
    with pytest.raises(RunArtifactMissing, match="model.pt is missing"):
        ModelRegistry(str(tmp_path / "reg")).publish(run)
    assert ModelRegistry(str(tmp_path / "reg")).list_packages() == []  # nothing half-published


def test_models_cli_lists_and_shows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from slipstream.cli import main

    reg = tmp_path / "registry"
    ModelRegistry(str(reg)).publish(write_run(tmp_path / "runs", "daily-a", 0.70))
    ModelRegistry(str(reg)).publish(write_run(tmp_path / "runs", "daily-b", 0.60))
    assert main(["models", "--registry", str(reg), "list"]) == 0
    out = capsys.readouterr().out
    line_a = next(ln for ln in out.splitlines() if "daily-a" in ln)
    line_b = next(ln for ln in out.splitlines() if "daily-b" in ln)
    assert line_a.startswith("*") and "0.7000" in line_a and "promoted" in line_a
    assert not line_b.startswith("*") and "not promoted" in line_b
    assert main(["models", "--registry", str(reg), "show", "champion"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "daily-a"
    assert main(["models", "--registry", str(reg), "show", "nope"]) == 1


def test_a_person_promotes_a_package_by_hand_and_the_next_run_is_judged_against_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from slipstream.cli import main
    from slipstream.errors import ConfigError

    reg = tmp_path / "registry"
    ModelRegistry(str(reg)).publish(write_run(tmp_path / "runs", "daily-a", 0.70))
    ModelRegistry(str(reg)).publish(write_run(tmp_path / "runs", "daily-b", 0.72, champion=("daily-a", 0.70)))
    assert ModelRegistry(str(reg)).champion()["run_id"] == "daily-b"
    # roll back to daily-a: the reason is kept, and the CLI says who is champion now
    assert main(["models", "--registry", str(reg), "promote", "daily-a", "--reason", "daily-b broke serving"]) == 0
    assert "daily-a is the champion" in capsys.readouterr().out
    champion = json.loads((reg / "champion.json").read_text())
    assert champion["run_id"] == "daily-a" and champion["manual"] == "daily-b broke serving"
    # the next run is compared with the champion a person chose
    nxt = ModelRegistry(str(reg)).publish(write_run(tmp_path / "runs", "daily-c", 0.60, champion=("daily-a", 0.70)))
    assert not nxt["decision"]["promoted"] and nxt["decision"]["champion_run_id"] == "daily-a"
    with pytest.raises(RunArtifactMissing, match="no package 'nope'"):
        ModelRegistry(str(reg)).promote("nope", "why")
    with pytest.raises(ConfigError, match="needs a reason"):
        ModelRegistry(str(reg)).promote("daily-b", "  ")
    assert ModelRegistry(str(reg)).champion()["run_id"] == "daily-a"


def test_run_ids_and_summary_sections(tmp_path: Path) -> None:
    a = make_run_id("daily", T_HANDOFF, "scheduled__2025-01-04")
    assert a == make_run_id("daily", T_HANDOFF, "scheduled__2025-01-04")  # a retry keeps its folder
    assert a != make_run_id("daily", T_HANDOFF, "manual__2025-01-04T10:00")
    assert a.startswith("daily-20250104-")
    update_summary(tmp_path, "publish", {"promoted": False})
    update_summary(tmp_path, "publish", {"promoted": True})  # re-run replaces its section
    update_summary(tmp_path, "train", {"auc": 0.7})
    assert read_summary(tmp_path) == {"publish": {"promoted": True}, "train": {"auc": 0.7}}


def test_latest_run_dir_finds_the_newest_run_of_a_day(settings) -> None:  # type: ignore[no-untyped-def]
    import os

    from slipstream.pipeline.runlayout import latest_run_dir

    runs = Path(settings.runs_dir)
    old = write_run(runs, "daily-20250104-aaaa0000", 0.7)
    new = write_run(runs, "daily-20250104-bbbb1111", 0.7)
    write_run(runs, "daily-20250105-cccc2222", 0.7)
    os.utime(old, (1, 1))
    assert latest_run_dir(settings, "daily", T_HANDOFF) == new
    with pytest.raises(RunArtifactMissing, match="no run folder stream-"):
        latest_run_dir(settings, "stream")


def test_the_promotion_rule_is_a_setting(tmp_path: Path) -> None:
    from slipstream.errors import ConfigError
    from slipstream.pipeline.registry import RegistryConfig

    settings = Settings(home=tmp_path)
    assert RegistryConfig.from_env(settings, {}).rule == "significant"
    assert RegistryConfig.from_env(settings, {"SLIPSTREAM_PROMOTION_RULE": "point"}).rule == "point"
    with pytest.raises(ConfigError, match="SLIPSTREAM_PROMOTION_RULE must be one of significant, point"):
        RegistryConfig.from_env(settings, {"SLIPSTREAM_PROMOTION_RULE": "optimistic"})


def test_each_data_set_has_its_own_registry_and_champion(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    """Publishing a criteo run never meets synthetic's champion ("the champion was trained on spec ...")."""
    from slipstream.cli import main
    from slipstream.pipeline.registry import RegistryConfig

    criteo = settings.for_dataset("criteo", env={})
    own = {s.dataset: RegistryConfig.from_env(s).location for s in (settings, criteo)}
    assert own == {"synthetic": str(Path(settings.home) / "registry" / "synthetic"),
                   "criteo": str(Path(settings.home) / "registry" / "criteo")}
    runs = Path(settings.runs_dir)
    ModelRegistry(own["synthetic"]).publish(write_run(runs, "daily-20250104-aaaaaaaa", 0.70))
    first = ModelRegistry(own["criteo"]).publish(write_run(runs, "daily-criteo-20250104-bbbbbbbb", 0.65))
    assert first["decision"]["promoted"] and first["decision"]["reason"].startswith("no champion yet")
    assert main(["models", "--spec", "criteo", "list"]) == 0
    out = capsys.readouterr().out
    assert "daily-criteo-20250104-bbbbbbbb" in out and "daily-20250104-aaaaaaaa" not in out
