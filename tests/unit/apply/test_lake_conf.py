"""The lake settings become Delta's session defaults for new tables."""

from __future__ import annotations

from apply.engine.spark_session import (
    CHANGE_DATA_FEED_DEFAULT,
    DELETION_VECTORS_DEFAULT,
    session_conf,
)
from apply.settings import LakeSettings, SparkSettings


def test_timestamps_are_written_as_int64_micros_by_default() -> None:
    conf = session_conf(SparkSettings(), [])
    assert conf["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS"


def test_default_lake_has_no_deletion_vectors_and_no_change_feed() -> None:
    conf = session_conf(SparkSettings(), [], LakeSettings())
    assert conf[DELETION_VECTORS_DEFAULT] == "false"
    assert CHANGE_DATA_FEED_DEFAULT not in conf


def test_lake_settings_turn_deletion_vectors_and_the_change_feed_on() -> None:
    lake = LakeSettings(deletion_vectors=True, change_data_feed=True)
    conf = session_conf(SparkSettings(), [], lake)
    assert conf[DELETION_VECTORS_DEFAULT] == "true"
    assert conf[CHANGE_DATA_FEED_DEFAULT] == "true"


def test_the_operators_spark_conf_still_wins_over_the_lake_settings() -> None:
    spark = SparkSettings(conf={DELETION_VECTORS_DEFAULT: "true"})
    conf = session_conf(spark, [], LakeSettings(deletion_vectors=False))
    assert conf[DELETION_VECTORS_DEFAULT] == "true"


def test_new_tables_keep_removed_files_and_commits_a_day_by_default() -> None:
    defaults = "spark.databricks.delta.properties.defaults."
    conf = session_conf(SparkSettings(), [], LakeSettings())
    assert conf[defaults + "deletedFileRetentionDuration"] == "interval 24 hours"
    assert conf[defaults + "logRetentionDuration"] == "interval 24 hours"
    lake = LakeSettings(deleted_file_retention_hours=6, log_retention_hours=12)
    conf = session_conf(SparkSettings(), [], lake)
    assert conf[defaults + "deletedFileRetentionDuration"] == "interval 6 hours"
    assert conf[defaults + "logRetentionDuration"] == "interval 12 hours"
