"""daily_retrain params: JSON-schema types, bounds and descriptions; bad values refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slipstream.errors import ConfigError
from slipstream.pipeline.request import KNOBS, TrainRequest, trainer_overrides
from slipstream.settings import Settings
from tests.airflow_fixtures import plan_for

REQUIRED = ("window_days", "epochs", "stream_stop", "gpus", "batch_size", "lr", "replay_share", "backend")


@pytest.fixture(scope="module")
def params() -> Any:
    from slipstream_airflow.params import train_params

    return train_params({"backend": "local"})


def test_every_knob_is_a_described_typed_param(params: Any) -> None:
    assert set(REQUIRED) <= set(params)
    for name, param in params.items():
        kind = param.schema["type"]
        if isinstance(kind, list):  # a knob that may be left empty (null: not set)
            assert kind[1:] == ["null"] and param.value is None, name
            kind = kind[0]
        assert kind in ("integer", "number", "string", "boolean"), name
        assert len(param.description or "") > 20, f"{name} needs a description"
        if kind in ("integer", "number"):
            assert "maximum" in param.schema and ("minimum" in param.schema or "exclusiveMinimum" in param.schema), name
    assert params["backend"].schema["enum"] == ["local", "kubernetes"]
    assert params["stream_stop"].schema["pattern"]


@pytest.mark.parametrize(
    "name,bad",
    [("window_days", 0), ("window_days", 3651), ("epochs", "two"), ("gpus", -1), ("batch_size", 4),
     ("lr", 0), ("lr", 2.0), ("replay_share", 0.95), ("backend", "slurm"), ("stream_stop", "soon"),
     ("stream_stop", "-5"), ("gate_ctr_max", 1.5), ("gate_rows_ratio_min", -0.1), ("gate_ctr_min", "low")],
)
def test_bad_values_are_refused_by_params_and_request(params: Any, name: str, bad: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        copy.deepcopy(params[name]).resolve(bad)
    with pytest.raises(ConfigError, match=name):
        TrainRequest(**{name: bad})


def test_defaults_and_good_values_resolve(params: Any) -> None:
    for param in params.values():
        param.resolve(param.value)
    assert params["stream_stop"].resolve("caught_up") == "caught_up"
    assert params["stream_stop"].resolve("900") == "900"
    assert params["window_days"].resolve(14) == 14
    assert params["window_days"].resolve(400) == 400  # a long, sparse history is the data set's choice
    assert params["gate_ctr_max"].resolve(None) is None and params["gate_ctr_max"].resolve(0.3) == 0.3


def test_request_from_params_renders_trainer_overrides(settings: Settings) -> None:
    from trainers.config.plan import load_plan_config

    req = TrainRequest.from_params({"window_days": 3, "epochs": 2, "stream_stop": "0", "lr": 0.01, "stream_name": "x"},
                                   other_params=("stream_name",))
    sets = trainer_overrides(req)
    # the run's id and snapshot are not knobs: the trainer takes them from the run's plan
    plan = plan_for(settings, req, run_id="r1", snapshot_id=5)
    _, cfg = load_plan_config(f"{plan.run_dir}/plan.json", None, (), settings)
    assert sets["data.stream"] is False and "data.stop.mode" not in sets
    assert sets["data.window_days"] == 3 and sets["optim.lr"] == 0.01 and cfg.data.snapshot_id == 5
    assert (cfg.data.window_days, cfg.optim.lr, cfg.data.stream, cfg.run.run_id) == (3, 0.01, False, "r1")
    assert sets["data.exchange"] is False
    on = trainer_overrides(TrainRequest.from_params({"exchange": True}))
    assert on["data.exchange"] is True


def test_local_backend_refuses_many_nodes() -> None:
    with pytest.raises(ConfigError, match="nnodes=2 needs backend=kubernetes"):
        TrainRequest(nnodes=2)


def test_knob_table_matches_request_fields() -> None:
    from dataclasses import fields

    assert {k.name for k in KNOBS} == {f.name for f in fields(TrainRequest)}
    for k in KNOBS:
        assert getattr(TrainRequest(), k.name) == k.default


def test_an_unknown_param_is_refused_with_the_valid_names() -> None:
    """A misspelt key was accepted and ignored: the run trained with the default (issue 23, item 8)."""
    with pytest.raises(ConfigError) as e:
        TrainRequest.from_params({"learning_rat": 0.1, "window_days": 2})
    msg = str(e.value)
    assert "'learning_rat'" in msg and "lr, max_nodes" in msg and "window_days" in msg
    with pytest.raises(ConfigError, match="did you mean 'epochs'"):
        TrainRequest.from_params({"epoch": 3})


def test_a_configuration_error_fails_the_task_without_retries() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from slipstream_airflow.callbacks import fail_fast

    @fail_fast
    def task_body(params: dict) -> TrainRequest:  # type: ignore[type-arg]
        return TrainRequest.from_params(params)

    assert task_body({"nnodes": 1}).nnodes == 1
    with pytest.raises(AirflowFailException, match="nnodes=2 needs backend=kubernetes"):
        task_body({"nnodes": 2})


def test_the_form_shows_titles_in_words_bounds_units_and_sections(params: Any) -> None:
    """The trigger form titled params "Lr", "Gpus", "Nnodes" and showed no bounds."""
    assert params["lr"].schema["title"] == "Learning rate"
    assert params["gpus"].schema["title"] == "GPUs per node" and params["nnodes"].schema["title"] == "Nodes"
    assert params["window_days"].description.endswith("A whole number of days from 1 to 3650. Default: 7.")
    assert "A number greater than 0, at most 1. Default: 0.003." in params["lr"].description
    assert "seconds (0 to 999999)" in params["stream_stop"].description
    assert params["gate_ctr_min"].description.endswith("from 0 to 1; may be empty. Default: empty.")
    sections = [p.schema["section"] for p in params.values()]
    assert sections[0] == "Data window" and set(sections) == {"Data window", "Training", "Stream phase", "Resources",
                                                              "Quality gate", "Run"}
    assert sections == sorted(sections, key=sections.index)  # each section's params together
    for name, param in params.items():
        assert param.schema["title"][0].isupper() and "_" not in param.schema["title"], name
        assert "Default:" in param.description, name
    from slipstream_airflow.params import train_params

    narrowed = train_params({"backend": "kubernetes"}, enums={"backend": ("local", "kubernetes")}, only=("backend",))
    assert narrowed["backend"].description.endswith("One of: local, kubernetes. Default: kubernetes.")


def test_one_node_meets_on_loopback_and_runs_the_loopback_torchrun(settings: Settings) -> None:
    """No `--standalone` (its stores listen on every interface): a c10d endpoint on 127.0.0.1, and
    locally the launcher that binds every store there."""
    from slipstream.pipeline.cluster import ClusterSettings
    from slipstream.pipeline.jobspec import build_train_spec
    from slipstream_airflow.local_launch import local_command

    plan = plan_for(settings, TrainRequest(cpu_processes=2), run_id="daily-20250104-abcdef12", snapshot_id=3)
    spec = build_train_spec(settings, ClusterSettings(), plan)
    args = spec.torchrun_args(rdzv_port=41234)
    assert "--standalone" not in args
    assert args[5:13] == ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:41234", "--rdzv-id",
                          "daily-20250104-abcdef12", "--local-addr", "127.0.0.1"]
    command = local_command(args)
    assert command[1:3] == ["-m", "trainers.parallel.torchrun_loopback"]
    assert spec.overrides["data.dlq_topic"] == "synthetic.samples.dlq"  # the data set's, through the plan
