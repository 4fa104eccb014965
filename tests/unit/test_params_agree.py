"""One definition per training param: the DAG's Params, the request, the trainer config and the docs
table (docs/params.md) agree on every param's default and bounds, because all come from
`slipstream.pipeline.request.KNOBS`; this test fails the day one of them grows its own copy."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from slipstream.errors import ConfigError
from slipstream.pipeline.request import KNOBS, TRAINER_KNOBS, Knob, TrainRequest, knobs_markdown

REPO = Path(__file__).resolve().parents[2]


def _trainer_field(key: str) -> tuple[type, dataclasses.Field[Any]]:
    from trainers.config import schema

    section, name = key.split(".")
    cls = {"data": schema.DataConfig, "optim": schema.OptimConfig, "model": schema.ModelConfig, "run": schema.RunConfig}[section]
    return cls, next(f for f in dataclasses.fields(cls) if f.name == name)


def _build(key: str, value: Any) -> Any:
    from trainers.config.schema import load_config

    base = ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"]
    return load_config(None, [*base, f"{key}={str(value).lower() if isinstance(value, bool) else value}"])


def _outside(k: Knob) -> list[Any]:
    """Values just outside the knob's bounds."""
    out: list[Any] = []
    step = 1 if k.type == "integer" else 1e-6
    if k.minimum is not None:
        out.append(k.minimum - step)
    if k.exclusive_minimum is not None:
        out.append(k.exclusive_minimum)
    if k.maximum is not None:
        out.append(k.maximum + step)
    return out


def test_the_dags_params_are_the_knobs() -> None:
    from slipstream_airflow.params import train_params

    params = train_params()
    assert list(params) == [k.name for k in KNOBS]
    for k in KNOBS:
        p = params[k.name]
        assert p.value == k.default if k.default is not None else p.value is None, k.name
        schema = p.schema
        for key, mine in (("minimum", k.minimum), ("maximum", k.maximum), ("exclusiveMinimum", k.exclusive_minimum)):
            assert schema.get(key) == mine, (k.name, key)
        assert schema.get("title") == k.title and k.title and "_" not in k.title, k.name
        assert k.section and schema.get("section") == k.section, k.name
        assert str(k.default if k.default is not None else "empty").lower() in p.description.lower(), k.name
    assert (params["lr"].schema["title"], params["gpus"].schema["title"]) == ("Learning rate", "GPUs per node")


def test_the_request_takes_the_knobs_defaults() -> None:
    req = TrainRequest()
    assert [f.name for f in dataclasses.fields(TrainRequest)] == sorted(
        [k.name for k in KNOBS], key=[f.name for f in dataclasses.fields(TrainRequest)].index)
    assert {f.name for f in dataclasses.fields(TrainRequest)} == {k.name for k in KNOBS}
    for k in KNOBS:
        assert getattr(req, k.name) == k.default, k.name


@pytest.mark.parametrize("key", sorted(TRAINER_KNOBS))
def test_the_trainer_config_has_the_knobs_default_and_bounds(key: str) -> None:
    k = TRAINER_KNOBS[key]
    _, f = _trainer_field(key)
    assert f.default == k.default and f.metadata.get("knob") == key
    section, name = key.split(".")
    assert getattr(getattr(_build(key, k.default), section), name) == k.default
    for bad in _outside(k):
        with pytest.raises(ConfigError, match=re.escape(key)):
            _build(key, bad)
        with pytest.raises(ConfigError):
            TrainRequest(**{k.name: bad})
    for good in (k.minimum, k.maximum):
        if good is not None:
            assert getattr(getattr(_build(key, good), section), name) == good


def test_the_docs_table_is_made_from_the_knobs() -> None:
    page = (REPO / "docs" / "params.md").read_text()
    table = page.split("-->\n", 1)[1].split("<!-- params:end -->")[0]
    assert table == knobs_markdown(), "docs/params.md is stale: paste slipstream.pipeline.request.knobs_markdown() into it"


def _docs_defaults() -> dict[str, str]:
    """`key -> default` of the trainer config table in docs/trainer.md (rows like
    `| `data.a`, `.b` | 1, 2 | ... |`; rows of a whole section, `model.*`, are left out)."""
    out: dict[str, str] = {}
    for line in (REPO / "docs" / "trainer.md").read_text().splitlines():
        m = re.match(r"\| (`(?:data|model|optim|run)\.[^|]*`) \| ([^|]*) \|", line)
        if not m or "*" in m.group(1):
            continue
        keys, section = [], ""
        for raw in re.findall(r"`([^`]+)`", m.group(1)):
            key = section + raw if raw.startswith(".") else raw
            section = key.rsplit(".", 1)[0]
            keys.append(key)
        values = [v.strip() for v in m.group(2).split(",")]
        if len(values) == len(keys):
            out.update(zip(keys, values, strict=True))
    return out


def test_the_trainer_docs_table_shows_the_configs_defaults() -> None:
    """docs/trainer.md's config table shows each field's default as the dataclasses have it (a knob's
    default is its param's)."""
    from trainers.config.schema import TrainConfig, load_config

    cfg = load_config(None, ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"])
    docs = _docs_defaults()
    assert set(TRAINER_KNOBS) <= set(docs), sorted(set(TRAINER_KNOBS) - set(docs))
    checked = 0
    for key, shown in docs.items():
        node: Any = cfg
        for part in key.split("."):
            node = getattr(node, "class_path" if part == "class" else part)
        if isinstance(node, bool):
            assert shown == str(node).lower(), key
        elif isinstance(node, (int, float)) and re.fullmatch(r"[-0-9.e]+", shown):
            assert float(shown) == float(node), f"docs/trainer.md says {key} = {shown}, the config {node}"
        elif isinstance(node, str) and re.fullmatch(r"`?[a-z_0-9]+`?", shown) and shown not in ("settings", "empty"):
            assert shown.strip("`") == node, key
        else:
            continue
        checked += 1
    assert checked >= 30 and dataclasses.is_dataclass(TrainConfig)
