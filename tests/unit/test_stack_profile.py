"""The cluster profile's settings: the REST catalog replaces the local one, the endpoints fill what
is unset, the catalog credential never reaches a child's environment; a bad profile is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream.dev import stack
from slipstream.dev.s3server import S3Endpoint
from slipstream.errors import ConfigError
from slipstream.lake.iceberg import rest_catalog_properties
from slipstream.settings import Settings, write_settings_file

EP = S3Endpoint(url="http://127.0.0.1:9000", access_key="ak", secret_key="sk", iceberg_rest_url="http://127.0.0.1:8181")


def test_the_profile_env_makes_the_rest_catalog_the_catalog(tmp_path: Path) -> None:
    write_settings_file(tmp_path, {**EP.env(), **stack.rest_catalog_env(EP), "SLIPSTREAM_SPARK_MASTER": "spark://127.0.0.1:7077"})
    s = stack.effective_settings(Settings(home=tmp_path, s3_region="eu-west-1"))
    assert (s.catalog, s.catalog_uri, s.warehouse) == ("rest", "http://127.0.0.1:8181", "s3://lake/")
    assert s.s3_endpoint == "http://127.0.0.1:9000" and s.s3_region == "eu-west-1"  # set fields stay
    props = rest_catalog_properties(s)
    assert props["type"] == "rest" and props["credential"] == "ak:sk"
    assert props["oauth2-server-uri"] == "http://127.0.0.1:8181/v1/oauth/tokens" and props["s3.access-key-id"] == "ak"
    assert "SLIPSTREAM_CATALOG_CREDENTIAL" not in s.as_env() and s.as_env()["SLIPSTREAM_CATALOG_URI"] == s.catalog_uri


def test_without_a_profile_the_local_catalog_stays(tmp_path: Path) -> None:
    write_settings_file(tmp_path, EP.env())
    s = stack.effective_settings(Settings(home=tmp_path))
    assert s.catalog == "local" and not s.catalog_uri and s.warehouse.startswith("file://")


def test_an_unknown_profile_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="profile must be one of local, cluster"):
        stack.up(Settings(home=tmp_path), airflow=False, profile="prod")
