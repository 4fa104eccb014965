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


SECRETS = {"S3_ACCESS_KEY": "ak", "S3_SECRET_KEY": "sk", "POSTGRES_PASSWORD": "pg", "AIRFLOW_JWT_SECRET": "jwt",
           "AIRFLOW_API_SECRET_KEY": "api"}
"""What an operator puts in .env: compose refuses to start without each."""


def _interpolate(value: Any, env: dict[str, str]) -> str:
    """Compose's `${VAR:-default}` and `${VAR:?error}` (an unset VAR fails with the error)."""
    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise LookupError(f"{name}: {arg}")
        return arg
    return re.sub(r"\$\{([A-Z0-9_]+)(:-|:\?)([^}]*)\}", one, str(value))


def _expand(value: Any) -> str:
    return _interpolate(value, SECRETS)


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
    assert " -s3 " in services["s3"]["command"][0]
    commands = {name: services[name]["command"][0] for name in AIRFLOW_COMPONENTS}
    assert commands == {"airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
                        "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer"}


def test_the_joiner_service_runs_the_joiner_command_on_the_trainer_image(compose: dict[str, Any]) -> None:
    from slipstream.cli import build_parser

    joiner = compose["services"]["joiner"]
    assert joiner["image"] == compose["services"]["trainer"]["image"]
    argv = joiner["command"]
    assert argv[:3] == ["python", "-m", "slipstream.cli"]
    args = build_parser().parse_args(argv[3:])  # the command line is one the CLI accepts
    assert (args.command, args.joiner_command, args.health_port) == ("joiner", "run", 8090)
    assert "127.0.0.1:8090/health" in " ".join(joiner["healthcheck"]["test"])
    assert Settings.from_env(env_of(compose, "joiner")).kafka_bootstrap == "kafka:9092"


def test_preprocessing_submits_to_the_warm_spark_connect_service(compose: dict[str, Any]) -> None:
    from slipstream.pipeline.spark_settings import SparkSettings

    spark = SparkSettings.from_env(env_of(compose, "airflow-scheduler"))
    assert spark.remote == "sc://spark-connect:15002" and not spark.uses_submit
    server = compose["services"]["spark-connect"]
    assert server["image"] == compose["services"]["airflow-scheduler"]["image"]  # Java and pyspark are there
    command = " ".join(server["command"])
    assert "SparkConnectServer" in command and "spark.connect.grpc.binding.port=15002" in command
    assert "ports" not in server  # reached on the compose network only
    assert any(v.startswith("slipstream-raw:") for v in server["volumes"])


def test_every_setting_is_read_by_the_code_and_parses(compose: dict[str, Any]) -> None:
    env = env_of(compose, "airflow-scheduler")
    from slipstream.pipeline.spark_settings import SparkSettings

    known = ({f"SLIPSTREAM_{f.name.upper()}" for f in fields(Settings)} | set(cluster_env_names()) | OTHER_SETTINGS
             | {f"SLIPSTREAM_SPARK_{f.name.upper()}" for f in fields(SparkSettings)})
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
    assert "-s3.port=8333" in compose["services"]["s3"]["command"][0]
    assert compose["services"]["iceberg-rest"]["environment"]["CATALOG_S3_ENDPOINT"] == "http://s3:8333"
    assert "@postgres:5432/airflow" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver:8080/")


def test_airflow_sees_the_dags_and_images_build(compose: dict[str, Any]) -> None:
    svc = compose["services"]["airflow-scheduler"]
    mounts = dict(v.split(":")[:2] for v in svc["volumes"] if v.startswith("./"))
    assert mounts["./dags"] == svc["environment"]["AIRFLOW__CORE__DAGS_FOLDER"]
    assert mounts["./plugins"] == svc["environment"]["AIRFLOW__CORE__PLUGINS_FOLDER"]
    for name in ("./dags", "./plugins"):
        assert (REPO / name).exists(), name
    dockerfile = (REPO / "Dockerfile").read_text()
    for target in (svc["build"]["target"], compose["services"]["trainer"]["build"]["target"]):
        assert re.search(rf"^FROM .* AS {target}$", dockerfile, re.M), target
    assert "USER 1000:1000" in dockerfile  # non-root, as the pod security context expects
    assert ClusterSettings().run_as_user == 1000


def test_no_secret_has_a_default_and_compose_refuses_to_start_without_them() -> None:
    """A `${VAR:-change-me}` fallback starts production with a secret everyone knows (issue 23,
    item 14): every secret must be given, or compose fails naming it."""
    text = (REPO / "docker-compose.yaml").read_text()
    defaults = re.findall(r"\$\{([A-Z0-9_]*(?:KEY|SECRET|PASSWORD)[A-Z0-9_]*):-", text)
    assert not defaults, f"secrets with a default: {defaults}"
    for name in SECRETS:
        with pytest.raises(LookupError, match=name):
            _interpolate(text, {k: v for k, v in SECRETS.items() if k != name})
    assert "slipstream-secret" not in text and "change-me" not in text
    assert not (REPO / "deploy" / "seaweedfs-s3.json").exists()  # its keys were in the repository
