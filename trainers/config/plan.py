"""The trainer's side of the run plan (`slipstream.pipeline.runplan`, `<run_dir>/plan.json`).

`--plan <run_dir>/plan.json`: the plan fixes the run's data — run id and folder, table, snapshot,
window, T, topic and dead-letter topic — and sets its request's knobs (batch size, epochs, stream stop ...) and the
broker, lateness and cache folder; a `--config` file supplies everything else, and `--set` may
change a knob (an experiment) but never a fact. T reaches the trainer as the plan's datetime.

Without a plan (`--config`/`--set` only, e.g. a benchmark) the trainer plans the run itself from
its config, with the same `build_run_plan`, and writes the plan into its run folder, so every run
folder holds the plan it trained on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from slipstream.errors import ConfigError, PlanError, ResumeError
from slipstream.pipeline.request import trainer_overrides
from slipstream.pipeline.runplan import RunPlan, build_run_plan, plan_path, read_plan, write_plan
from slipstream.samples.spec import Spec
from slipstream.settings import Settings
from trainers.config.parse import apply_override, load_raw, set_key
from trainers.config.schema import TrainConfig, resolve

log = logging.getLogger(__name__)


def plan_facts(plan: RunPlan, plan_file: Path) -> dict[str, Any]:
    """The config keys a plan fixes. The run folder is the one that holds plan.json (a pod mounts
    the runs volume elsewhere than the worker that wrote the plan)."""
    return {
        "data.snapshot_id": plan.snapshot_id, "data.t_handoff": plan.t_handoff, "data.window_days": plan.window_days,
        "data.namespace": plan.namespace, "data.table": plan.table_name, "data.topic": plan.topic,
        "data.dlq_topic": plan.dlq_topic,
        "run.run_id": plan.run_id, "run.runs_dir": str(plan_file.parent.parent),
    }


def load_plan_config(plan_file: str | Path, config_path: str | Path | None, overrides: list[str] | tuple[str, ...],
                     settings: Settings) -> tuple[RunPlan, TrainConfig]:
    """The plan in `plan_file` and the trainer config of its run: the config file, then the plan's
    facts, knobs and endpoints, then `--set` (refused where it contradicts a fact)."""
    plan_file = Path(plan_file).absolute()
    plan = read_plan(plan_file)
    if plan_file.parent.name != plan.run_id:
        raise PlanError(f"{plan_file} is the plan of run {plan.run_id!r} but sits in folder {plan_file.parent.name!r}: "
                        f"a plan lives in its run folder, <runs_dir>/{plan.run_id}/plan.json")
    raw = load_raw(config_path)
    facts = plan_facts(plan, plan_file)
    for key, value in facts.items():
        set_key(raw, key, value)
    for key, value in (("data.bootstrap", plan.bootstrap), ("data.max_lateness_s", plan.max_lateness_s),
                       ("data.cache_dir", plan.cache_dir)):
        set_key(raw, key, value)
    if plan.request is not None:
        for key, value in trainer_overrides(plan.request).items():  # typed values: no text round trip
            set_key(raw, key, value)
    for o in overrides:
        apply_override(raw, o)
    cfg = resolve(raw, settings)
    for key, want in facts.items():
        section, name = key.split(".")
        got = getattr(getattr(cfg, section), name)
        if got != want:
            raise ConfigError(f"--set {key}={got} contradicts the plan {plan_file} ({key}={want}): a plan fixes the "
                              "run's data; drop the --set, or render a new plan for other data")
    return plan, cfg


def plan_for_config(cfg: TrainConfig, table: Any, spec: Spec) -> RunPlan:
    """Rank 0, no --plan: plan the run from its config and write it into the run folder. A folder
    that already holds a plan for other data is refused (resume it with --plan, or use a new run id)."""
    d = cfg.data
    plan = build_run_plan(table, run_id=cfg.run.run_id, run_dir=cfg.run.run_dir, t_handoff=d.t_handoff,
                          window_days=d.window_days, snapshot_id=d.snapshot_id, topic=d.topic, bootstrap=d.bootstrap,
                          cache_dir=d.cache_dir, max_lateness_s=d.max_lateness_s, spec=spec)
    existing = plan_path(cfg.run.run_dir)
    if existing.exists():
        old = read_plan(existing)
        differ = old.data_differences(plan)
        if differ:
            raise PlanError(f"{existing} plans other data than this config ({', '.join(differ)} differ): train that "
                            f"run with --plan {existing}, or use a new run.run_id")
        return old
    write_plan(plan, cfg.run.run_dir)
    return plan


class RunLineage:
    """The `lineage` checkpoint piece: the data and table layout a run trains. A resume with another
    plan (snapshot, T, window, topic) or another sharding is refused: it would mix two runs' data."""

    def __init__(self, plan: RunPlan, sharding: str) -> None:
        self.plan, self.sharding = plan, sharding

    def state_dict(self) -> dict[str, Any]:
        p = self.plan
        return {"snapshot_id": p.snapshot_id, "t_handoff": p.t_handoff.isoformat(), "window_days": p.window_days,
                "topic": p.topic, "sharding": self.sharding}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, mine in self.state_dict().items():
            if state.get(key) != mine:
                raise ResumeError(f"the checkpoint has {key}={state.get(key)!r} but the plan says {mine!r}: a run "
                                  "resumes only with the data and table layout it started with; use a new run.run_id")
