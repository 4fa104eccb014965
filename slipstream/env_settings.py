"""One parser for every `SLIPSTREAM_*` settings object, on pydantic-settings.

Each settings object (`Settings`, `CacheSettings`, `ClusterSettings`, `SparkSettings`,
`RegistryConfig`) is a frozen dataclass that documents its fields and checks their values in
`__post_init__`, so a value built in code is checked like one read from the environment.
`settings_from_env` is how each of them reads the environment: pydantic-settings picks the
variables of a mapping (the process environment by default; an empty value counts as unset) and
converts them to the fields' types (`slipstream.env_model`); the dataclass is built from the
variables that were set, and every other field keeps its default.

A bad value is a `ConfigError` that names the variable, the value, what is wrong and the default,
never a pydantic trace. pydantic is imported on the first call, not with this module: DAG files
import the settings modules at parse time and mostly never call `from_env` there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

D = TypeVar("D")

Parser = Callable[[str], Any]
"""Turns a variable's text into the field's value; raises ConfigError (naming the variable) if it cannot."""


def env_names(cls: type, prefix: str, names: Mapping[str, str] | None = None) -> dict[str, str]:
    """Field name -> environment variable: `<prefix><FIELD NAME>` unless `names` says otherwise."""
    return {f.name: (names or {}).get(f.name, f"{prefix}{f.name.upper()}") for f in dataclasses.fields(cls)}


def settings_from_env(
    cls: type[D],
    env: Mapping[str, str] | None = None,
    *,
    prefix: str,
    names: Mapping[str, str] | None = None,
    parsers: Mapping[str, Parser] | None = None,
    defaults: Mapping[str, Any] | None = None,
    given: Mapping[str, Any] | None = None,
) -> D:
    """`cls` (a dataclass) from the variables of `env` (default: the process environment).

    `prefix` + the upper-cased field name is each field's variable, unless `names` maps the
    field to another; `parsers` read a field's text where it has a syntax of its own (byte sizes,
    `key=value` lists, JSON); `defaults` fill fields whose variable is unset (values derived from
    other settings, e.g. the registry under the home); `given` fields are the caller's and never
    read from the environment. `names`, `parsers` and the keys of `given` are bound on a class's
    first call (its parsing model is built once).
    """
    from slipstream import env_model  # pydantic: on first use only

    given = given or {}
    variables = {k: v for k, v in env_names(cls, prefix, names).items() if k not in given}
    read = env_model.read_variables(cls, os.environ if env is None else env, variables, parsers or {})
    return cls(**{**(defaults or {}), **read, **given})
