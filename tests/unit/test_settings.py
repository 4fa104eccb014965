"""Deployment settings: the environment over the home's settings file over the defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream.errors import ConfigError
from slipstream.settings import Settings, read_settings_file, remove_settings_file, write_settings_file


def test_the_broker_address_follows_the_port_unless_set(tmp_path: Path) -> None:
    env = {"SLIPSTREAM_HOME": str(tmp_path), "SLIPSTREAM_KAFKA_PORT": "29093"}
    assert Settings.from_env(env).kafka_bootstrap == "127.0.0.1:29093"
    env["SLIPSTREAM_KAFKA_BOOTSTRAP"] = "broker-1:9092"
    assert Settings.from_env(env).kafka_bootstrap == "broker-1:9092"


def test_the_settings_file_fills_what_the_environment_leaves_unset(tmp_path: Path) -> None:
    path = write_settings_file(tmp_path, {"SLIPSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:31000",
                                          "SLIPSTREAM_S3_ENDPOINT": "http://127.0.0.1:8333",
                                          "SLIPSTREAM_S3_SECRET_ACCESS_KEY": "k3y"})
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    s = Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path)})
    assert s.kafka_bootstrap == "127.0.0.1:31000"
    assert s.s3_io_properties() == {"s3.endpoint": "http://127.0.0.1:8333", "s3.secret-access-key": "k3y"}
    # the environment wins over the file; secrets never travel in a child's environment
    s = Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path), "SLIPSTREAM_KAFKA_BOOTSTRAP": "b:9092"})
    assert s.kafka_bootstrap == "b:9092"
    assert "SLIPSTREAM_S3_SECRET_ACCESS_KEY" not in s.as_env()
    assert "k3y" not in repr(s)
    remove_settings_file(tmp_path)
    assert read_settings_file(tmp_path) == {}


def test_a_broken_settings_file_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "settings.env").write_text("# ok\nSLIPSTREAM_TOPIC=t\nnot a setting\n")
    with pytest.raises(ConfigError, match=r"settings.env:3: expected NAME=value"):
        Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path)})
