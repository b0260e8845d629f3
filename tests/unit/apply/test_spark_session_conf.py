"""Spark configuration layering: defaults, then jars, then the operator's overrides."""

from __future__ import annotations

from apply.engine.spark_session import DEFAULT_CONF, master_to_set, session_conf
from apply.settings import SparkSettings


def test_defaults_carry_delta_and_small_machine_settings() -> None:
    conf = session_conf(SparkSettings(), [])
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.databricks.delta.commitStats.collect"] == "false"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.databricks.delta.snapshotPartitions"] == "2"
    assert conf["spark.databricks.delta.properties.defaults.enableDeletionVectors"] == "false"
    assert conf["spark.scheduler.mode"] == "FAIR", "tables share the cores (apply.batch.table_pool)"
    assert "spark.jars" not in conf


def test_jars_are_comma_joined_and_overrides_win() -> None:
    settings = SparkSettings(conf={"spark.ui.enabled": "true", "spark.sql.shuffle.partitions": "8"})
    conf = session_conf(settings, ["/a.jar", "/b.jar"])
    assert conf["spark.jars"] == "/a.jar,/b.jar"
    assert conf["spark.ui.enabled"] == "true"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert DEFAULT_CONF["spark.ui.enabled"] == "false", "defaults must not be mutated"


def test_master_is_the_settings_then_spark_submits_then_local() -> None:
    assert master_to_set("local[2]", "yarn") == "local[2]"
    assert master_to_set(None, "spark://host:7077") is None, "spark-submit's stays"
    assert master_to_set("", "yarn") is None, "an empty setting is no setting"
    assert master_to_set(None, None) == "local[*]"
