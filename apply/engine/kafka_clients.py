"""How every Kafka client of the apply job is configured.

The job has five: Spark's Kafka source (the Java client, reading the change topics),
the schema-topic consumer and the control-topic producer (:mod:`apply.control.feedback`), the
table-status consumer (:mod:`apply.control.table_status`), and the consumer that reads a small
batch's records in the driver (:mod:`apply.batch.held_batch`). All take the same
``APPLY_KAFKA__CLIENT`` properties and ``APPLY_KAFKA__CLIENT_SECRETS_DIR`` secrets
(:mod:`runtime.kafka_client`), read when each client is built; the properties a client
sets for itself (group id, idempotence) go on top, since its guarantees rest on them.
Spark's source gets their Java form (:func:`~runtime.kafka_client.java_client_properties`)
as ``kafka.*`` options, with ``APPLY_KAFKA__SPARK_SOURCE`` on top.

The group ids below are the job's; nothing is committed under them (partitions are
assigned by hand), but a secured cluster's ACLs name them (docs/security.md).
"""

from __future__ import annotations

from apply.settings import KafkaSettings
from runtime.kafka_client import (
    KafkaConf,
    client_properties,
    connection_conf,
    java_client_properties,
)

SETTING = "APPLY_KAFKA"
SCHEMA_GROUP = "pgdelta-apply-schemas"
STATUS_GROUP = "pgdelta-apply-status"
HELD_GROUP = "pgdelta-apply-held"
"""The consumer that reads a small batch's records in the driver (:mod:`apply.batch.held_batch`)."""
SPARK_SOURCE_GROUP_PREFIX = "spark-kafka-source"
"""Spark's own prefix of the source's generated group ids (its ``groupIdPrefix``)."""


def client_conf(settings: KafkaSettings) -> KafkaConf:
    """The librdkafka configuration every client of the job starts from."""
    properties = client_properties(settings.client, settings.client_secrets_dir, setting=SETTING)
    return connection_conf(settings.bootstrap_servers, properties)


def spark_source_options(settings: KafkaSettings) -> dict[str, str]:
    """The ``kafka.*`` options of Spark's Kafka source: bootstrap servers and the Java
    form of the client properties."""
    properties = client_properties(settings.client, settings.client_secrets_dir, setting=SETTING)
    java = java_client_properties(properties, settings.spark_source)
    java["bootstrap.servers"] = settings.bootstrap_servers
    return {f"kafka.{name}": value for name, value in java.items()}
