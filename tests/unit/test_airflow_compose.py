"""docker-compose.yaml (cannot start here: no Docker engine) parses, names the services the
architecture needs, and its settings are ones the code reads, pointing at those services."""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

import pytest
import yaml

from slipstream.pipeline.cluster import ClusterSettings, cluster_env_names
from slipstream.settings import Settings
from tests.airflow_fixtures import REPO

AIRFLOW_COMPONENTS = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
OTHER_SETTINGS = {
    "SLIPSTREAM_REGISTRY", "SLIPSTREAM_PROMOTION_AUC_TOLERANCE", "SLIPSTREAM_S3_ENDPOINT",
    "SLIPSTREAM_S3_ACCESS_KEY_ID", "SLIPSTREAM_S3_SECRET_ACCESS_KEY", "SLIPSTREAM_S3_REGION",
}


def _expand(value: Any) -> str:
    """`${VAR:-default}` → default (the value when nothing is set)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yaml").read_text())


def env_of(compose: dict[str, Any], service: str) -> dict[str, str]:
    return {k: _expand(v) for k, v in compose["services"][service]["environment"].items()}


def test_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"postgres", "kafka", "s3", "iceberg-rest", "trainer", *AIRFLOW_COMPONENTS} <= set(services)
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert not any("zookeeper" in name for name in services)
    assert services["postgres"]["image"].startswith("postgres:")
    assert "-s3" in services["s3"]["command"]
    commands = {name: services[name]["command"][0] for name in AIRFLOW_COMPONENTS}
    assert commands == {"airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
                        "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer"}


def test_every_setting_is_read_by_the_code_and_parses(compose: dict[str, Any]) -> None:
    env = env_of(compose, "airflow-scheduler")
    known = {f"SLIPSTREAM_{f.name.upper()}" for f in fields(Settings)} | set(cluster_env_names()) | OTHER_SETTINGS
    unknown = {k for k in env if k.startswith("SLIPSTREAM_")} - known
    assert not unknown, f"compose sets settings no code reads: {unknown}"
    settings = Settings.from_env(env)
    cluster = ClusterSettings.from_env(env)
    assert cluster.trainer_image == compose["services"]["trainer"]["image"]
    # the catalog name resolves through pyiceberg's env configuration to the REST service
    assert env[f"PYICEBERG_CATALOG__{settings.catalog.upper()}__URI"] == "http://iceberg-rest:8181"
    assert settings.kafka_bootstrap == "kafka:9092"
    assert "PLAINTEXT://kafka:9092" in compose["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert env["SLIPSTREAM_S3_ENDPOINT"].startswith("http://s3:8333")
    assert "-s3.port=8333" in compose["services"]["s3"]["command"]
    assert compose["services"]["iceberg-rest"]["environment"]["CATALOG_S3_ENDPOINT"] == "http://s3:8333"
    assert "@postgres:5432/airflow" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver:8080/")


def test_airflow_sees_the_dags_and_images_build(compose: dict[str, Any]) -> None:
    svc = compose["services"]["airflow-scheduler"]
    mounts = dict(v.split(":")[:2] for v in svc["volumes"] if v.startswith("./"))
    assert mounts["./dags"] == svc["environment"]["AIRFLOW__CORE__DAGS_FOLDER"]
    assert mounts["./plugins"] == svc["environment"]["AIRFLOW__CORE__PLUGINS_FOLDER"]
    for name in ("./dags", "./plugins", "./deploy/seaweedfs-s3.json"):
        assert (REPO / name).exists(), name
    dockerfile = (REPO / "Dockerfile").read_text()
    for target in (svc["build"]["target"], compose["services"]["trainer"]["build"]["target"]):
        assert re.search(rf"^FROM .* AS {target}$", dockerfile, re.M), target
    assert "USER 1000:1000" in dockerfile  # non-root, as the pod security context expects
    assert ClusterSettings().run_as_user == 1000
