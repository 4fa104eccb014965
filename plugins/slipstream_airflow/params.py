"""Airflow Params of the training DAGs, built from the one knob table in `slipstream.pipeline.request`.

Each Param carries the knob's JSON-schema type and bounds, its title in words and its section of
the trigger form, and a description that says its bounds, unit and default, so the form shows them
and refuses a bad value (Airflow validates params against the schema before creating a run). A
conf key that is no param is refused by the API (`slipstream_airflow.conf_guard`); `TrainRequest`
checks keys and bounds again inside the tasks for runs created another way (`airflow dags test`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

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
        if knob.name in enums:
            knob = dataclasses.replace(knob, enum=tuple(enums[knob.name]))
        schema: dict[str, Any] = knob.json_schema()
        default = defaults.get(knob.name, knob.default)
        description = knob.help_text(descriptions.get(knob.name), default)
        title = knob.title or knob.name.replace("_", " ").capitalize()
        section: dict[str, Any] = {"section": knob.section} if knob.section else {}
        out[knob.name] = Param(default, title=title, description=description, **section, **schema)
    return out
