"""Airflow Params of the training DAGs, built from the one knob table in `slipstream.pipeline.request`.

Each Param carries the knob's JSON-schema type, bounds and description, so the trigger form shows
them and refuses a bad value (Airflow validates params against the schema before creating a run);
`TrainRequest` checks the same bounds again inside the tasks for runs created through the API.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow.sdk import Param

from slipstream.pipeline.request import GATE_KNOBS, KNOBS

__all__ = ["GATE_KNOBS", "train_params"]


def train_params(
    defaults: Mapping[str, Any] | None = None,
    *,
    only: tuple[str, ...] | None = None,
    enums: Mapping[str, tuple[str, ...]] | None = None,
    descriptions: Mapping[str, str] | None = None,
) -> dict[str, Param]:
    """One Param per knob; `defaults` overrides a knob's default (e.g. the deployment's backend),
    `enums` narrows a knob's choices (e.g. the backends this deployment has), `descriptions` a
    knob's text where a DAG uses it its own way."""
    defaults = dict(defaults or {})
    enums = dict(enums or {})
    descriptions = dict(descriptions or {})
    out: dict[str, Param] = {}
    for knob in KNOBS:
        if only is not None and knob.name not in only:
            continue
        schema: dict[str, Any] = knob.json_schema()
        if knob.name in enums:
            schema["enum"] = list(enums[knob.name])
        title = knob.name.replace("_", " ").capitalize()
        description = descriptions.get(knob.name, knob.description)
        out[knob.name] = Param(defaults.get(knob.name, knob.default), title=title, description=description, **schema)
    return out
