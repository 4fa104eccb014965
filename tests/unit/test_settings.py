"""Deployment settings: the environment over the home's settings file over the defaults, and the one
parser every settings object reads its variables with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slipstream.cache.settings import CacheSettings
from slipstream.errors import ConfigError
from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.registry import RegistryConfig
from slipstream.pipeline.spark_settings import SparkSettings
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


def test_from_env_reads_the_given_mapping_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLIPSTREAM_KAFKA_PORT", "29999")
    monkeypatch.setenv("SLIPSTREAM_SPARK_DRIVER_MEMORY", "64g")
    assert Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path)}).kafka_port == 19092
    assert SparkSettings.from_env({}).driver_memory == "2g"
    assert Settings.from_env().kafka_port == 29999  # no mapping: the process environment


def test_an_empty_variable_is_unset(tmp_path: Path) -> None:
    write_settings_file(tmp_path, {"SLIPSTREAM_TOPIC": "from-file"})
    s = Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path), "SLIPSTREAM_TOPIC": "", "SLIPSTREAM_KAFKA_PORT": ""})
    assert (s.topic, s.kafka_port) == ("from-file", 19092)
    assert ClusterSettings.from_env({"SLIPSTREAM_RDZV_PORT": ""}).rdzv_port == 29400


@pytest.mark.parametrize("build, variable, default", [
    (lambda env: Settings.from_env(env), "SLIPSTREAM_KAFKA_PORT", "19092"),
    (lambda env: ClusterSettings.from_env(env), "SLIPSTREAM_RDZV_PORT", "29400"),
    (lambda env: SparkSettings.from_env(env), "SLIPSTREAM_SPARK_SHUFFLE_PARTITIONS", "4"),
    (lambda env: RegistryConfig.from_env(Settings(), env), "SLIPSTREAM_PROMOTION_AUC_TOLERANCE", "0.002"),
    (lambda env: CacheSettings.from_env(Settings(), env), "SLIPSTREAM_CACHE_LOCK_TIMEOUT_S", "600.0"),
])
def test_a_bad_value_names_the_variable_and_its_default(build: Any, variable: str, default: str) -> None:
    with pytest.raises(ConfigError) as e:
        build({variable: "lots"})
    assert str(e.value).startswith(f"{variable}='lots' is not valid (")
    assert str(e.value).endswith(f"unset it for the default ({default})")
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no pydantic trace behind it


def test_each_setting_reads_its_own_variable(tmp_path: Path) -> None:
    cluster = ClusterSettings.from_env({"SLIPSTREAM_K8S_SERVICE_ACCOUNT": "sa", "SLIPSTREAM_RUN_AS_USER": "2000"})
    assert (cluster.service_account, cluster.run_as_user) == ("sa", 2000)
    spark = SparkSettings.from_env({"SLIPSTREAM_SPARK_CONF": '{"spark.executor.memory": "8g", "spark.x": 3}'})
    assert spark.conf == {"spark.executor.memory": "8g", "spark.x": "3"}
    registry = RegistryConfig.from_env(Settings(home=tmp_path), {"SLIPSTREAM_PROMOTION_AUC_TOLERANCE": "0.01"})
    assert (registry.location, registry.tolerance) == (str(tmp_path / "registry" / "synthetic"), 0.01)
    # the cache root is the Settings' (a CLI flag may have set it), never re-read from the environment
    cache = CacheSettings.from_env(Settings(home=tmp_path, cache_dir="/a"), {"SLIPSTREAM_CACHE_DIR": "/b",
                                                                             "SLIPSTREAM_CACHE_BUDGET_BYTES": "2GiB"})
    assert (cache.dir, cache.budget_bytes) == ("/a", 2 << 30)
    s = Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path), "SLIPSTREAM_TOPIC_PARTITIONS": "8"})
    assert (s.home, s.topic_partitions, s.runs_dir) == (tmp_path.resolve(), 8, str(tmp_path.resolve() / "runs"))


def test_each_data_set_is_named_from_its_spec(tmp_path: Path) -> None:
    """Two data sets of one deployment never share a table, a topic, a raw zone or a registry."""
    home = tmp_path.resolve()
    synthetic = Settings.from_env({"SLIPSTREAM_HOME": str(home)})
    assert (synthetic.dataset, synthetic.namespace, synthetic.table) == ("synthetic", "slipstream_synthetic",
                                                                          "slipstream_synthetic.samples")
    assert (synthetic.topic, synthetic.dlq_topic) == ("synthetic.samples", "synthetic.samples.dlq")
    assert (synthetic.raw_dir, synthetic.registry) == (str(home / "raw" / "synthetic"), str(home / "registry" / "synthetic"))
    avazu = synthetic.for_dataset("/specs/my-avazu.yaml", env={})
    assert (avazu.dataset, avazu.namespace, avazu.topic, avazu.dlq_topic) == (
        "my-avazu", "slipstream_my_avazu", "my-avazu.samples", "my-avazu.samples.dlq")
    assert avazu.raw_dir == str(home / "raw" / "my-avazu") and avazu.registry == str(home / "registry" / "my-avazu")
    assert avazu.warehouse == synthetic.warehouse and avazu.runs_dir == synthetic.runs_dir  # shared by all data sets
    on_s3 = Settings.from_env({"SLIPSTREAM_HOME": str(home), "SLIPSTREAM_REGISTRY_ROOT": "s3://models/registry/",
                               "SLIPSTREAM_RAW_ROOT": "s3://lake/raw"})
    assert (on_s3.registry, on_s3.for_dataset("criteo", env={}).registry) == ("s3://models/registry/synthetic",
                                                                            "s3://models/registry/criteo")
    assert on_s3.for_dataset("criteo", env={}).raw_dir == "s3://lake/raw/criteo"
    # the child of a run gets its data set's names, and reads them back as they were
    assert Settings.from_env({**avazu.as_env(), "SLIPSTREAM_HOME": str(home)}).table == avazu.table


def test_a_data_set_s_names_can_be_set_and_stay_its_own(tmp_path: Path) -> None:
    env = {"SLIPSTREAM_HOME": str(tmp_path), "SLIPSTREAM_TOPIC": "ctr-main", "SLIPSTREAM_NAMESPACE": "prod",
           "SLIPSTREAM_DATASET__CRITEO__TOPIC": "criteo-clicks", "SLIPSTREAM_DATASET__CRITEO__REGISTRY": "s3://models/criteo",
           "SLIPSTREAM_DATASET__SYNTHETIC__DLQ_TOPIC": "synthetic-rejects"}
    default = Settings.from_env(env)
    assert (default.topic, default.dlq_topic, default.namespace) == ("ctr-main", "synthetic-rejects", "prod")
    # the plain variables name the deployment's own data set only: criteo never gets `prod` or `ctr-main`
    criteo = default.for_dataset("criteo", env=env)
    assert (criteo.topic, criteo.dlq_topic, criteo.registry) == ("criteo-clicks", "criteo-clicks.dlq", "s3://models/criteo")
    assert criteo.namespace == "slipstream_criteo"
    assert Settings.from_env({**env, "SLIPSTREAM_SPEC": "criteo"}).topic == "criteo-clicks"  # the per-data-set name wins
    with pytest.raises(ConfigError, match="SLIPSTREAM_DATASET__CRITEO__TABLE: TABLE is not a per-data-set setting; valid: "
                                          "SLIPSTREAM_DATASET__CRITEO__NAMESPACE"):
        default.for_dataset("criteo", env={"SLIPSTREAM_DATASET__CRITEO__TABLE": "x"})
