"""Settings of the capture service: one class, read once in ``__main__``.

Environment variables use the ``CAPTURE_`` prefix and ``__`` between nested names, e.g.
``CAPTURE_POSTGRES__DSN`` or ``CAPTURE_KAFKA__TOPIC_PREFIX``. Passwords are
``SecretStr`` and are never logged; keep them out of the DSN and in
``CAPTURE_POSTGRES__PASSWORD``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from runtime.logs import LogSettings
from runtime.schema_registry import SchemaRegistrySettings
from runtime.settings_env import ServiceSettings
from runtime.telemetry import MetricsSettings


class PostgresSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dsn: str = Field(
        "postgresql://postgres@127.0.0.1:5432/postgres",
        description="libpq connection string of the source database, without the password",
    )
    password: SecretStr | None = Field(None, description="password, kept out of the DSN")
    password_file: Path | None = Field(
        None,
        description="file holding the password (a mounted secret); instead of password",
    )
    slot: str = Field("cdc_slot", description="logical replication slot to stream from")
    publication: str = Field("cdc_pub", description="publication naming the captured tables")
    tables: list[str] = Field(
        default_factory=list, description="schema-qualified tables to capture, e.g. public.orders"
    )
    schemas: list[str] = Field(
        default_factory=list, description="capture every table in these schemas"
    )
    silence_timeout_s: float = Field(
        60.0,
        gt=0,
        description=(
            "the replication connection is taken as dead (and reopened) when the server "
            "answers nothing this long after capture asked it to"
        ),
    )


class KafkaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    topic_prefix: str = Field("cdc", description="change topics are <prefix>.<schema>.<table>")
    control_topic: str = Field("cdc._control", description="applied-offset feedback from apply")
    schema_topic: str = Field("cdc._schemas", description="writer schemas by fingerprint")
    partitions: int = Field(3, ge=1, description="partitions of a newly created change topic")
    replication_factor: int = Field(1, ge=1, description="of newly created topics")
    client: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "librdkafka properties for every Kafka client of the service (security.protocol, "
            "sasl.*, ssl.*): producer, admin and consumer"
        ),
    )
    client_secrets_dir: Path | None = Field(
        None,
        description=(
            "directory of secret client properties, one file each, named after the property "
            "(e.g. sasl.password): a mounted Secret"
        ),
    )
    producer: dict[str, str] = Field(
        default_factory=dict, description="extra librdkafka producer settings (passthrough)"
    )
    encoding: Literal["single-object", "registry"] = Field(
        "single-object",
        description=(
            "framing of keys and values: single-object (C3 01 + fingerprint, schemas on the "
            "schema topic only) or registry (Confluent wire format: 00 + schema id, schemas "
            "registered in the Schema Registry at registry.url; the schema topic is still "
            "written)"
        ),
    )
    registry: SchemaRegistrySettings = Field(
        default_factory=SchemaRegistrySettings,
        description="the Schema Registry, for encoding=registry",
    )

    @model_validator(mode="after")
    def _registry_for_registry_encoding(self) -> KafkaSettings:
        if self.encoding == "registry" and self.registry.url is None:
            raise ValueError(
                "CAPTURE_KAFKA__ENCODING=registry needs the registry's URL in "
                "CAPTURE_KAFKA__REGISTRY__URL"
            )
        return self


class WalSettings(BaseModel):
    """Watching the WAL the slot keeps on the source (docs/operations.md, WAL safety)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warn_retained_bytes: int = Field(
        10 * 1024**3,
        ge=0,
        description="warn (log and metric) when the slot retains more WAL than this (0: never)",
    )
    check_interval_s: float = Field(
        30.0, gt=0, description="how often the slot's retained WAL and wal_status are read"
    )


class CaptureSettings(ServiceSettings):
    """Everything the capture service can be told."""

    model_config = SettingsConfigDict(
        env_prefix="CAPTURE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    postgres: PostgresSettings = Field(default_factory=PostgresSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    metrics: MetricsSettings = Field(default_factory=lambda: MetricsSettings(port=9108))
    log: LogSettings = Field(default_factory=LogSettings)
    wal: WalSettings = Field(default_factory=WalSettings)
    tombstones: bool = Field(
        False, description="after each delete, also publish a null value (for compaction)"
    )
    status_interval_s: float = Field(
        5.0, gt=0, description="longest gap between standby status updates to PostgreSQL"
    )
    max_in_flight_records: int = Field(
        200_000, ge=1, description="produced but not yet applied records before reading pauses"
    )
    max_in_flight_bytes: int = Field(
        256 * 1024 * 1024, ge=1, description="same bound in encoded bytes"
    )
    snapshot_pace: Literal["kafka", "lake"] = Field(
        "kafka",
        description=(
            "kafka: a snapshot row leaves the in-flight bound once Kafka has it, so the "
            "source is read as fast as Kafka takes the rows and the lake catches up from "
            "the topic; lake: once it is applied, so no snapshot row waits in Kafka much "
            "longer than apply takes for one bound (for change topics whose retention is "
            "shorter than the time apply needs for a whole table)"
        ),
    )
    snapshot_mode: Literal["initial", "never"] = Field(
        "initial",
        description=(
            "initial: publish each table's existing rows (snapshot) before its changes, at "
            "first start and for tables added later; never: only changes made after the "
            "slot was created"
        ),
    )
    snapshot_workers: int | None = Field(
        None,
        ge=1,
        description=(
            "processes that read a snapshot's chunks in parallel (default: one per core "
            "this process may use: its CPU affinity, capped by its cgroup's CPU limit); 1 "
            "reads them in the capture process itself"
        ),
    )
    snapshot_chunk_rows: int = Field(
        100_000,
        ge=1,
        le=100_000_000,
        description=(
            "rows per snapshot chunk, about (a chunk is a range of the table's blocks, "
            "sized from pg_class statistics); with the workers, it bounds the rows held "
            "in memory to publish chunks in order"
        ),
    )
    spool_dir: Path | None = Field(
        None,
        description=(
            "where changes held back during a snapshot, and streamed transactions until "
            "their commit, are spooled (default: system temp)"
        ),
    )
    streaming: bool = Field(
        False,
        description=(
            "ask PostgreSQL to stream transactions in progress (pgoutput protocol version "
            "2, streaming on): a transaction outgrowing the server's "
            "logical_decoding_work_mem arrives while it runs and waits in the spool until "
            "its commit, instead of being spilled by the server and sent only at the "
            "commit; the records are the same either way (docs/streaming.md)"
        ),
    )
    streaming_spool_max_bytes: int = Field(
        16 * 1024**3,
        ge=1,
        description=(
            "bytes the spools of streamed transactions not committed yet may hold "
            "together; past it capture warns and goes on without streaming until restarted "
            "(the server then spills that transaction and sends it at its commit)"
        ),
    )
    compiled_rows: bool = Field(
        True,
        description=(
            "encode rows with the compiled row encoder (capture_native) when it is "
            "installed; false: always the Python path, which writes the same bytes with "
            "more CPU (to rule the encoder out when diagnosing)"
        ),
    )
    compiled_producer: bool = Field(
        True,
        description=(
            "produce change records through the compiled producer (capture_native), which "
            "drives the librdkafka confluent-kafka loaded with the same properties; false: "
            "confluent-kafka's producer, same records and guarantees, more CPU per record"
        ),
    )
    compiled_stream: bool = Field(
        True,
        description=(
            "take streamed changes from the replication connection to the producer "
            "through the compiled stream (capture_native) where it can run: with the "
            "compiled rows and producer, and psycopg's libpq found; false: every frame "
            "through the Python loop, same records, more CPU per change"
        ),
    )
    table_refresh_s: float = Field(
        30.0,
        ge=0,
        description=(
            "how often the captured schemas are searched for new tables, which are then "
            "added to the publication and snapshotted while the rest streams (0: only at start)"
        ),
    )
