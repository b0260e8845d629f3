"""Kafka side of the apply job: writer schemas in, applied progress out.

- :class:`SchemaCatalog` reads the schema topic (compacted, keyed by fingerprint) to its
  end, at start and again whenever a batch names a writer it has not seen; with a
  Schema Registry configured (``APPLY_KAFKA__REGISTRY__URL``) it also resolves the ids
  of registry-framed records (:mod:`schemas.registry_framing`) through the registry.
- :class:`ProgressPublisher` publishes :class:`~schemas.control.AppliedProgress` (and
  :class:`~schemas.control.ApplyTableStatus`, :mod:`apply.table_status`) to the
  control topic after each Delta commit, with an idempotent ``acks=all`` producer and a
  synchronous flush: capture confirms WAL only from what it reads there, so a message
  lost here would only delay confirmation, never lose data, and the next batch (or the
  restart, from Delta's commit metadata) publishes it again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.cimpl import TopicPartition

from apply.errors import ConfigError, TransientError
from apply.kafka_clients import SCHEMA_GROUP, SETTING, client_conf
from apply.settings import KafkaSettings
from runtime.kafka_client import ConnectionErrors
from runtime.retry import call_with_retry
from runtime.schema_registry import RegistryRequestError, SchemaRegistryClient, SubjectStrategy
from schemas.change_record import NAMESPACE_ROOT, VALUE_RECORD
from schemas.control import AppliedProgress, ApplyTableStatus
from schemas.errors import SchemaMessageError
from schemas.registry_framing import writer_key
from schemas.schema_topic import read_schema_message
from schemas.single_object import Fingerprint, format_fingerprint, schema_fingerprint

_PUBLISH_ATTEMPTS = 3


REGISTRY_SETTING = "APPLY_KAFKA__REGISTRY"


def is_value_subject(subject: str, strategy: SubjectStrategy, topic_prefix: str) -> bool:
    """Whether capture would register a value schema under ``subject``
    (:func:`runtime.schema_registry.subject_name`): the subjects the catalog reads."""
    change = f".{VALUE_RECORD}"
    if strategy is SubjectStrategy.TOPIC:
        return subject.startswith(f"{topic_prefix}.") and subject.endswith("-value")
    if strategy is SubjectStrategy.RECORD:
        return subject.startswith(f"{NAMESPACE_ROOT}.") and subject.endswith(change)
    return (
        subject.startswith(f"{topic_prefix}.")
        and f"-{NAMESPACE_ROOT}." in subject
        and subject.endswith(change)
    )


class SchemaCatalog:
    """Writer schema JSON by writer key: fingerprints from the schema topic, and
    registry ids' writer keys from the Schema Registry when one is configured.

    Registry ids are found by reading the value subjects capture registers under (the
    ids themselves are only in the records, and a batch's unknown writer only makes the
    job call :meth:`refresh`); each subject's versions are read once, so a refresh costs
    one listing plus one request per subject and per new version.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self.schemas: dict[Fingerprint, str] = {}
        self._registry: SchemaRegistryClient | None = None
        self._versions_read: dict[str, int] = {}

    def _add(self, key: Fingerprint, schema_json: str, source: str) -> None:
        """Record ``schema_json`` under ``key``; refuse a key two different schemas
        claim (a fingerprint equal to a registry id's writer key, one schema in 2^32,
        :mod:`schemas.registry_framing`): decoding with either would be wrong."""
        known = self.schemas.get(key)
        if (
            known is not None
            and known != schema_json
            and schema_fingerprint(json.loads(known)) != schema_fingerprint(json.loads(schema_json))
        ):
            raise ConfigError(
                f"writer key {format_fingerprint(key)} names two different schemas "
                f"(one from {source}): a schema fingerprint coincides with a registry "
                "id; write every record with one encoding (CAPTURE_KAFKA__ENCODING) and "
                "resync the tables whose records use the other"
            )
        self.schemas[key] = schema_json

    def refresh(self, timeout_s: float = 30.0) -> dict[Fingerprint, str]:
        """Read the schema topic to its end, then the registry's new value schemas."""
        self._read_schema_topic(timeout_s)
        if self._settings.registry.url is not None:
            self._read_registry()
        return self.schemas

    def _read_registry(self) -> None:
        if self._registry is None:
            # Built here, not at construction: a password file that cannot be read is a
            # ConfigError of the first refresh, where the job reports it.
            self._registry = SchemaRegistryClient(self._settings.registry, setting=REGISTRY_SETTING)
        registry = self._registry
        strategy = self._settings.registry.subject_strategy
        try:
            subjects = registry.subjects()
        except RegistryRequestError as exc:
            raise ConfigError(f"{exc}: check {REGISTRY_SETTING}__URL") from exc
        for subject in subjects:
            if not is_value_subject(subject, strategy, self._settings.topic_prefix):
                continue
            versions = registry.versions(subject)
            read = self._versions_read.get(subject, 0)
            if versions and versions[-1] < read:
                read = 0  # the subject was deleted and started anew
            for version in versions:
                if version <= read:
                    continue
                found = registry.version(subject, version)
                if found is not None:
                    schema_id, schema_json = found
                    self._add(writer_key(schema_id), schema_json, f"registry id {schema_id}")
            if versions:
                self._versions_read[subject] = versions[-1]

    def _read_schema_topic(self, timeout_s: float) -> None:
        errors = ConnectionErrors(SETTING)
        consumer = Consumer(
            client_conf(self._settings)
            | {
                "group.id": SCHEMA_GROUP,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            },
            error_cb=errors,
        )
        try:
            metadata = consumer.list_topics(self._settings.schema_topic, timeout=10)
            topic = metadata.topics.get(self._settings.schema_topic)
            if topic is None or topic.error is not None or not topic.partitions:
                return  # nothing published yet
            partitions = sorted(topic.partitions)
            consumer.assign([TopicPartition(self._settings.schema_topic, p, 0) for p in partitions])
            at_end: set[int] = set()
            deadline = time.monotonic() + timeout_s
            while len(at_end) < len(partitions):
                if time.monotonic() > deadline:
                    raise TransientError("the schema topic could not be read to its end in time")
                for message in consumer.consume(1000, timeout=0.5):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            at_end.add(message.partition() or 0)
                            continue
                        raise TransientError(f"schema topic read failed: {error.str()}")
                    key, value = message.key(), message.value()
                    if key is None or value is None:
                        continue
                    try:
                        fingerprint, schema_json = read_schema_message(key, value)
                    except SchemaMessageError:
                        continue  # not a record of this contract; the message says so in logs
                    self._add(fingerprint, schema_json, "the schema topic")
        except KafkaException as exc:
            consumer.poll(0)  # serves the error callback: a refused login says so
            errors.check()
            raise TransientError(f"cannot read the schema topic: {exc}") from exc
        finally:
            consumer.close()


_NO_SUCH_TOPIC = (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART)


class ProgressPublisher:
    def __init__(self, settings: KafkaSettings) -> None:
        self._topic = settings.control_topic
        self._errors = ConnectionErrors(SETTING)
        self._producer = Producer(
            client_conf(settings) | {"enable.idempotence": True, "acks": "all", "linger.ms": 0},
            error_cb=self._errors,
        )
        self._topic_seen = False

    def _missing_topic(self) -> ConfigError:
        return ConfigError(
            f"the control topic {self._topic} does not exist: the capture creates it when "
            "it starts; start the capture first, or create it (cleanup.policy=compact), or "
            "fix APPLY_KAFKA__CONTROL_TOPIC"
        )

    def _check_topic(self) -> None:
        """Fail fast on a missing control topic: a message for it would wait in the
        producer's queue for half a minute before failing."""
        if self._topic_seen:
            return
        try:
            metadata = self._producer.list_topics(self._topic, timeout=10)
        except KafkaException as exc:
            self._producer.poll(0)  # serves the error callback: a refused login says so
            self._errors.check()
            raise TransientError(f"cannot read the metadata of {self._topic}: {exc}") from exc
        found = metadata.topics.get(self._topic)
        if found is None or (found.error is not None and found.error.code() in _NO_SUCH_TOPIC):
            raise self._missing_topic()
        self._topic_seen = found.error is None

    def close(self) -> None:
        """Flush and close the producer: librdkafka's threads otherwise live on, retrying
        the broker, for as long as anything holds the publisher (Spark keeps the
        ``foreachBatch`` function, and with it the job, until the JVM lets it go).

        What is still undelivered after a few seconds is dropped rather than waited for
        (up to ``message.timeout.ms`` with the broker away): every message here is
        re-published from Delta when the job starts again (:mod:`apply.app`)."""
        self._producer.flush(5)
        self._producer.purge()
        self._producer.close()

    def publish(self, messages: Iterable[AppliedProgress | ApplyTableStatus]) -> None:
        pending = list(messages)
        if not pending:
            return
        self._check_topic()
        call_with_retry(
            lambda: self._publish_once(pending),
            what=f"publishing to {self._topic}",
            attempts=_PUBLISH_ATTEMPTS,
        )

    def _publish_once(self, pending: list[AppliedProgress | ApplyTableStatus]) -> None:
        """Produce ``pending`` and wait for delivery; on failure ``pending`` keeps only
        the messages not delivered, so a retry sends nothing twice that it need not."""
        failed: list[bytes] = []

        def report(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failed.append(msg.key() or b"")

        for message in pending:
            try:
                self._producer.produce(
                    self._topic, message.value(), message.key(), on_delivery=report
                )
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() in _NO_SUCH_TOPIC:
                    raise self._missing_topic() from exc
                raise TransientError(f"cannot publish to {self._topic}: {exc}") from exc
        if self._producer.flush(30) == 0 and not failed:
            return
        if failed:
            undelivered = set(failed)
            pending[:] = [m for m in pending if m.key() in undelivered]
        raise TransientError(
            f"{len(pending)} control messages could not be published to {self._topic}"
        )
