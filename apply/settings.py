"""Settings of the apply job: one class, read once in ``__main__``.

Environment variables use the ``APPLY_`` prefix and ``__`` between nested names, e.g.
``APPLY_KAFKA__BOOTSTRAP_SERVERS`` or ``APPLY_LAKE__ROOT``. The default Spark
configuration suits one small machine (few shuffle partitions, UI off); anything in
``APPLY_SPARK__CONF`` (a JSON object) overrides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import SettingsConfigDict

from runtime.logs import LogSettings
from runtime.schema_registry import SchemaRegistrySettings
from runtime.settings_env import ServiceSettings
from runtime.telemetry import MetricsSettings


class KafkaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    topic_prefix: str = Field("cdc", description="change topics are <prefix>.<schema>.<table>")
    control_topic: str = Field("cdc._control", description="where applied offsets are published")
    schema_topic: str = Field("cdc._schemas", description="writer schemas by fingerprint")
    max_offsets_per_trigger: int | None = Field(
        200_000,
        ge=1,
        description=(
            "cap on records per micro-batch (all topics together); null: none. As large as "
            "lake.driver_write_records, so a backlog (a snapshot, a catch-up after an "
            "outage) is applied in batches the driver writes, not in one batch Spark MERGEs"
        ),
    )
    client: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Kafka client properties for every client of the job (security.protocol, sasl.*, "
            "ssl.*): the Spark source gets them as kafka.* options"
        ),
    )
    client_secrets_dir: Path | None = Field(
        None,
        description=(
            "directory of secret client properties, one file each, named after the property "
            "(e.g. sasl.password): a mounted Secret"
        ),
    )
    spark_source: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Java Kafka client properties for Spark's Kafka source only, without the kafka. "
            "prefix, on top of those translated from client (e.g. ssl.keystore.location)"
        ),
    )
    registry: SchemaRegistrySettings = Field(
        default_factory=SchemaRegistrySettings,
        description=(
            "the Schema Registry that resolves the ids of registry-framed records (capture's "
            "encoding=registry); unset when every record is single-object encoded"
        ),
    )


class LakeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    root: str = Field(".local/lake", description="Delta tables live at <root>/<schema>/<table>")
    checkpoint_root: str = Field(".local/checkpoints", description="streaming checkpoints")
    deletion_vectors: bool = Field(
        False,
        description=(
            "deletion vectors on the tables apply creates: Spark's MERGE then writes only "
            "the changed rows, but the driver cannot write such a table, so its every batch "
            "takes a Spark MERGE, and readers need the deletionVectors feature; off, small "
            "batches are MERGEd from the driver, rewriting the files they touch "
            "(docs/apply.md, the driver writer)"
        ),
    )
    change_data_feed: bool = Field(
        False,
        description=(
            "Delta change data feed (delta.enableChangeDataFeed) on the tables apply "
            "creates, for jobs that read row-level changes from the lake"
        ),
    )
    deleted_file_retention_hours: int = Field(
        24,
        ge=1,
        description=(
            "delta.deletedFileRetentionDuration of the tables apply creates: VACUUM deletes "
            "files no version of the last this-many hours reads. A copy-on-write MERGE "
            "rewrites the files it touches, so a busy table leaves about its own size per "
            "commit on disk until then (Delta's default, 7 days, kept 150 GB for a 1.3 MB "
            "table at a 5 s trigger: docs/operations.md, Table upkeep); also how far back "
            "time travel and a reader's query reach"
        ),
    )
    log_retention_hours: int = Field(
        24,
        ge=1,
        description=(
            "delta.logRetentionDuration of the tables apply creates: commit files older "
            "than this are cleaned behind a checkpoint at upkeep's compaction turn. On a "
            "local lake every commit lists the whole log, so its cost grows with it: about "
            "1.4 ms of CPU per 1,000 commit files, 24 hours at a 5 s trigger being 17,280 "
            "(Delta's default, 30 days, 518,400); keep it at least the time between two of "
            "upkeep's vacuums"
        ),
    )
    driver_write_records: int = Field(
        200_000,
        ge=0,
        description=(
            "on a local lake: a micro-batch of at most this many records is collected to "
            "the driver, and each table's changes are written from there with delta-rs, no "
            "Spark job: MERGEd into a table without deletion vectors (docs/apply.md, the "
            "driver writer); larger batches, batches the driver cannot write exactly, and 0 "
            "take Spark's MERGE"
        ),
    )


class TriggerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["processing_time", "available_now"] = Field(
        "processing_time",
        description=(
            "processing_time: a micro-batch every interval, until stopped; available_now: "
            "read what the topics hold at start, apply it and exit (a catch-up run)"
        ),
    )
    interval: str = Field("5 seconds", description="processing-time trigger interval")


class UpkeepSettings(BaseModel):
    """Table upkeep run by the job itself (:mod:`apply.lake.upkeep`, docs/operations.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        True,
        description=(
            "compact and vacuum each table from the job, right after one of its MERGEs "
            "(docs/operations.md, Table upkeep); false leaves both to the operator"
        ),
    )
    compact_every_commits: int = Field(
        100,
        ge=2,
        description=(
            "OPTIMIZE a table each time its Delta version passes a multiple of this: a "
            "table then holds the files of at most this many commits besides its compacted ones"
        ),
    )
    vacuum_every_commits: int = Field(
        1000,
        ge=0,
        description=(
            "VACUUM (LITE) a table each time its version passes a multiple of this; it "
            "deletes files unreferenced for longer than the table's "
            "delta.deletedFileRetentionDuration (7 days unless set); 0: never"
        ),
    )
    target_file_size_mb: int = Field(
        128,
        ge=1,
        description=(
            "the size OPTIMIZE packs small files up to (Delta's optimize.maxFileSize for "
            "apply's compactions): larger means fewer files, and more rewritten per compaction"
        ),
    )


LOCAL_MASTER = "local[*]"
"""The master when neither the settings nor spark-submit name one."""


class SparkSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    master: str | None = Field(
        None,
        description=(f"Spark master; unset: the one spark-submit was given, else {LOCAL_MASTER}"),
    )
    app_name: str = Field(
        "cdc-apply", description="the Spark application's name (spark.app.name), as its UI shows"
    )
    jars: list[str] | None = Field(
        None,
        description="exact jars for spark.jars; overrides jars_dir",
    )
    jars_dir: str | None = Field(
        None,
        description=(
            "directory of resolved jars (Maven's closure of deploy/jars/spark/pom.xml); "
            "jars the pyspark wheel already ships are skipped"
        ),
    )
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark confs")


class ApplySettings(ServiceSettings):
    """Everything the apply job can be told."""

    model_config = SettingsConfigDict(
        env_prefix="APPLY_", env_nested_delimiter="__", extra="forbid", frozen=True
    )
    retired_settings: ClassVar[Mapping[str, str]] = {
        "LAKE__CHANGE_LOG": (
            "the change log is retired: the Delta table itself is fresh, a small batch "
            "MERGEd from the driver within seconds of its commit, and at start the job "
            "folds what a log left in the lake still holds into its table "
            "(docs/lake-change-log.md); unset it"
        ),
        "LAKE__FOLD_EVERY_S": (
            "it folded the change log, which is retired (docs/lake-change-log.md); unset it"
        ),
        "LAKE__FOLD_PARALLELISM": (
            "it folded the change log, which is retired (docs/lake-change-log.md); unset it"
        ),
    }

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    lake: LakeSettings = Field(default_factory=LakeSettings)
    trigger: TriggerSettings = Field(default_factory=TriggerSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    metrics: MetricsSettings = Field(default_factory=lambda: MetricsSettings(port=9109))
    log: LogSettings = Field(default_factory=LogSettings)
    upkeep: UpkeepSettings = Field(default_factory=UpkeepSettings)
    lanes: dict[str, list[str]] = Field(
        default_factory=dict,
        description=(
            "independent streaming queries, by lane name, each for the tables it lists "
            '(schema.table or schema.*), e.g. {"big": ["public.events"]}; every other '
            "table goes to the default lane, so a big table in its own lane no longer holds "
            "the small ones back (docs/apply.md, Lanes)"
        ),
    )
    table_parallelism: int = Field(
        4,
        ge=1,
        description=(
            "tables of one micro-batch applied at the same time, each in its own Spark "
            "session (1: one after another)"
        ),
    )
