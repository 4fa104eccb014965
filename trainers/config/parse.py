"""Typed dataclasses from nested mappings (a YAML/JSON file plus `--set section.key=value`).

`build` fills a dataclass (and its nested dataclass fields) from a mapping, converting each value
to the field's type and naming the dotted key of anything wrong: unknown keys, missing required
keys, a value of the wrong type. The dataclasses' own `__post_init__` then checks ranges.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from slipstream.errors import ConfigError


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def parse_time(value: Any, key: str) -> datetime:
    """A timezone-aware ISO-8601 time (or datetime) as UTC; a ConfigError names `key`."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{key} must be ISO-8601, got {value!r}") from None
    if not isinstance(value, datetime):
        raise ConfigError(f"{key} must be an ISO-8601 time, got {value!r}")
    if value.tzinfo is None:
        raise ConfigError(f"{key} must carry a timezone (e.g. +00:00), got {value.isoformat()!r}")
    return datetime.fromtimestamp(value.timestamp(), tz=UTC)


def build(cls: type, raw: Mapping[str, Any], where: str) -> Any:
    """An instance of dataclass `cls` from `raw`; `where` is the dotted prefix errors name."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    # a field's key is its name, or `metadata["key"]` where the name is a Python keyword (model.class)
    # (`to_dict` writes the name: both are accepted)
    known = {f.metadata.get("key", f.name): f for f in dataclasses.fields(cls)}
    aliases = {f.name: f for f in dataclasses.fields(cls) if "key" in f.metadata}
    unknown = sorted(set(raw) - set(known) - set(aliases))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(where + k for k in unknown)}; valid: {', '.join(sorted(known))}")
    missing = [
        where + n for n, f in known.items()
        if n not in raw and f.name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required key(s) {', '.join(missing)}")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        name = (known.get(key) or aliases[key]).name
        kwargs[name] = coerce(hints[name], value, where + key)
    return cls(**kwargs)


def coerce(tp: Any, value: Any, where: str) -> Any:
    """`value` as type `tp` (a nested dataclass, list, Literal choice, bool, int, float, datetime or str)."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value or {}, where + ".")
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return check_choice(tp, value, where)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [coerce(item, v, where) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                return int(value)
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{where} must be a number, got {value!r}") from None
        return float(value)
    if tp is datetime:
        return parse_time(value, where)
    if tp is str:
        if isinstance(value, datetime):  # YAML parses unquoted timestamps
            return value.isoformat()
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return str(value)
    return value


def check_choice(tp: Any, value: Any, where: str) -> Any:
    """`value` if it is one of the `Literal` type's choices, else a ConfigError listing them."""
    choices = typing.get_args(tp)
    if value not in choices:
        raise ConfigError(f"{where} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def check_choices(obj: Any, section: str) -> None:
    """Every `Literal` field of dataclass `obj` holds one of its choices (a config built in Python
    skips `coerce`); `section` is the dotted prefix errors name (`model`, `data.stop`)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if typing.get_origin(hints[f.name]) is typing.Literal:
            check_choice(hints[f.name], getattr(obj, f.name), f"{section}.{f.metadata.get('key', f.name)}")


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one `section.key=value` override to the raw nested dict (value parsed as YAML)."""
    if "=" not in assignment:
        raise ConfigError(f"--set expects section.key=value, got {assignment!r}")
    key, text = assignment.split("=", 1)
    set_key(raw, key.strip(), yaml.safe_load(text) if text.strip() else "")


def set_key(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted `section.key` of the raw nested dict to `value` (already typed or raw)."""
    parts = [p for p in key.split(".") if p]
    if len(parts) < 2:
        raise ConfigError(f"--set key must name a section and a field (e.g. data.batch_size), got {key!r}")
    node = raw
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {p!r} is not a section")
    node[parts[-1]] = value


def load_raw(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e}") from None
    try:
        raw = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"config file {p} is not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {e}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {p} must hold a mapping with sections data/model/optim/run")
    return raw
