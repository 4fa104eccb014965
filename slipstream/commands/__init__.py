"""One module per `slipstream` command group; each exposes `register(subparsers)`."""

from __future__ import annotations

from slipstream.settings import Settings


def dataset_settings(spec: str | None) -> Settings:
    """The settings a command with `--spec` works on: that data set's own tables, topics, raw zone
    and registry (not the default data set's), or the environment's data set without one."""
    settings = Settings.from_env()
    return settings.for_dataset(spec) if spec else settings
