"""pydantic-settings behind `slipstream.env_settings`: a settings dataclass's variables, read and
converted by a model built once per dataclass (one optional field per variable)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import AfterValidator, Field, ValidationError, create_model
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from slipstream.errors import ConfigError


class _EnvModel(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True, extra="ignore", frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # only what `_MappingSource` read from the given mapping: never os.environ or a .env behind its back
        return (init_settings,)


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of `os.environ`
    (tests, child environments, the home's settings file merged under the environment)."""

    def __init__(self, model: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._mapping = env
        super().__init__(model)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k: v for k, v in self._mapping.items() if v != ""}


_models: dict[type, type[BaseSettings]] = {}


def _model_of(cls: type, variables: Mapping[str, str], parsers: Mapping[str, Callable[[str], Any]]) -> type[BaseSettings]:
    if cls not in _models:
        hints = typing.get_type_hints(cls)
        fields: dict[str, Any] = {}
        for name, var in variables.items():
            parse = parsers.get(name)
            # a field with a parser is read as text (no JSON decoding of dict-typed fields)
            kind: Any = typing.Annotated[str, AfterValidator(parse)] if parse else hints[name]
            fields[name] = (kind | None, Field(default=None, validation_alias=var))
        _models[cls] = create_model(f"{cls.__name__}Env", __base__=_EnvModel, **fields)
    return _models[cls]


def read_variables(
    cls: type, env: Mapping[str, str], variables: Mapping[str, str], parsers: Mapping[str, Callable[[str], Any]],
) -> dict[str, Any]:
    """The fields of `cls` whose variables `env` sets, converted; a bad value is a ConfigError."""
    model = _model_of(cls, variables, parsers)
    try:
        parsed = model.model_validate(_MappingSource(model, env)())
    except ValidationError as e:
        raise _config_error(cls, e, variables, env) from None
    except ValueError as e:  # pydantic-settings' SettingsError: a value it could not decode
        raise ConfigError(f"{e}: check the variables {', '.join(variables.values())}") from None
    return {name: getattr(parsed, name) for name in parsed.model_fields_set}


def _config_error(cls: type, e: ValidationError, variables: Mapping[str, str], env: Mapping[str, str]) -> ConfigError:
    """The first bad variable, by name, with its value, what is wrong and the default."""
    err = e.errors(include_url=False)[0]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):  # a parser's own message already names the variable
        return cause
    loc = str(err["loc"][0]) if err["loc"] else ""
    field_name = next((name for name, var in variables.items() if loc in (var, name)), loc)
    var = variables.get(field_name, loc)
    reason = err["msg"][0].lower() + err["msg"][1:]
    return ConfigError(f"{var}={env.get(var, err.get('input'))!r} is not valid ({reason}): "
                       f"fix it or unset it for the default{_default_text(cls, field_name)}")


def _default_text(cls: type, field_name: str) -> str:
    for f in dataclasses.fields(cls):
        if f.name == field_name and f.default is not dataclasses.MISSING and f.default not in ("", None):
            return f" ({f.default})"
    return ""
