"""Kafka side of the apply job: writer schemas in, applied progress out.

- :class:`SchemaCatalog` reads the schema topic (compacted, keyed by fingerprint) to its
  end, at start and again whenever a batch names a writer it has not seen; with a
  Schema Registry configured (``APPLY_KAFKA__REGISTRY__URL``) it also resolves the ids
  of registry-framed records (:mod:`schemas.registry_framing`) through the registry.
- :class:`ProgressPublisher` publishes :class:`~schemas.control.AppliedProgress` (and
  :class:`~schemas.control.ApplyTableStatus`, :mod:`apply.control.table_status`) to the
  control topic after each Delta commit, with an idempotent ``acks=all`` producer.

The publish contract: :meth:`ProgressPublisher.publish` returns once the broker has
acknowledged every message, however long that takes, or (False) when the job stops
first. The Delta commit has already happened when it is called, and capture confirms WAL
only from what it reads on the control topic, so giving up would leave the slot pinned
behind data the lake holds; failing the query instead (as three bounded attempts once
did) turned a broker outage of two minutes into a dead job, and its restart cannot read
the schema topic or publish either until the broker is back. So a publish retries
without an attempt limit (:func:`runtime.retry.call_until_done`): each attempt waits
``_DELIVERY_WAIT_S`` for acknowledgements, every failed attempt is reported to the
caller (which marks the job not ready, :mod:`apply.app`), and a line is logged when the
failures start, once a minute while they last, and when the publish gets through.

Why block rather than keep the messages and send them with the next batch's: while the
publish waits, the micro-batch waits, so the next batch cannot run ahead of the
feedback of the one before. The control topic is compacted and its newest message per
key is the state, so a message held back and sent after a newer one of the same key
would move a partition's ``next_offset`` backwards; blocking keeps the messages of each
key in commit order without any bookkeeping across batches, and a broker that cannot
take the feedback could not give the next batch its records either. Messages stay in
the producer's queue between attempts (librdkafka re-sends them itself, without
duplicates); one librdkafka gave up on (``message.timeout.ms``, 300 s by default) is
produced again (:class:`Outbox`). Within one publish, only the newest message of a key
is sent: messages carry absolute values, so the older ones say nothing it does not.

Stopping (SIGTERM) ends the wait: the messages still undelivered are dropped at
:meth:`ProgressPublisher.close`, and nothing is lost, because a starting job
re-publishes the progress recorded in every Delta table and the dead-letter table
(:mod:`apply.app`) before its first batch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.cimpl import TopicPartition

from apply.engine.kafka_clients import SCHEMA_GROUP, SETTING, client_conf
from apply.errors import ConfigError, TransientError
from apply.settings import KafkaSettings
from runtime.kafka_client import ConnectionErrors
from runtime.retry import Backoff, call_until_done
from runtime.schema_registry import RegistryRequestError, SchemaRegistryClient, SubjectStrategy
from schemas.change_record import NAMESPACE_ROOT, VALUE_RECORD
from schemas.control import AppliedProgress, ApplyTableStatus
from schemas.errors import SchemaMessageError
from schemas.registry_framing import writer_key
from schemas.schema_topic import read_schema_message
from schemas.single_object import Fingerprint, format_fingerprint, schema_fingerprint

ControlMessage = AppliedProgress | ApplyTableStatus

_DELIVERY_WAIT_S = 5.0
"""How long one publish attempt waits for the broker's acknowledgements before it
counts as failed (and is retried): short, so a stop is noticed within seconds."""
_PUBLISH_BACKOFF = Backoff(initial_s=0.5, maximum_s=5.0)
_PUBLISH_LOG_EVERY_S = 60.0

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


class Outbox:
    """The messages of one publish until the broker has acknowledged each: due (to be
    produced), in flight (produced, waiting for the delivery report), or delivered
    (gone). Only the newest message of a key is kept, where that key last came.

    A delivery report with an error (librdkafka gave the message up, e.g. after
    ``message.timeout.ms`` with the broker away) makes its message due again; a report
    of success drops it. Reports come from the producer's ``flush``/``poll``, on the
    publishing thread, so no lock is needed."""

    def __init__(self, messages: Iterable[ControlMessage]) -> None:
        newest: dict[bytes, ControlMessage] = {}
        for message in messages:
            newest.pop(message.key(), None)
            newest[message.key()] = message
        self._due = newest
        self._in_flight: dict[bytes, ControlMessage] = {}
        self.last_error: str | None = None

    def due(self) -> list[ControlMessage]:
        """The messages to produce now, in order."""
        return list(self._due.values())

    def sent(self, message: ControlMessage) -> None:
        """``message`` is in the producer's queue: wait for its report."""
        key = message.key()
        self._in_flight[key] = self._due.pop(key)

    def report(self, key: bytes, error: str | None) -> None:
        """The producer's delivery report for ``key``: delivered, or failed (``error``)."""
        message = self._in_flight.pop(key, None)
        if message is not None and error is not None:
            self._due[key] = message
            self.last_error = error

    @property
    def undelivered(self) -> int:
        return len(self._due) + len(self._in_flight)


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

    def publish(
        self,
        messages: Iterable[ControlMessage],
        *,
        should_stop: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], object] = time.sleep,
        on_failure: Callable[[TransientError], None] = lambda _: None,
    ) -> bool:
        """Publish ``messages`` and wait until the broker has them all, retrying without
        an attempt limit (module docstring); False when ``should_stop`` turned true
        first. ``on_failure`` hears every failed attempt; ``sleep`` waits out the
        backoff (an event's ``wait`` lets the stop cut it short). A missing control
        topic is a :class:`ConfigError`, raised at once."""
        outbox = Outbox(messages)
        if not outbox.undelivered:
            return True
        return call_until_done(
            lambda: self._deliver(outbox),
            what=f"publishing to {self._topic}",
            should_stop=should_stop,
            on_failure=on_failure,
            sleep=sleep,
            backoff=_PUBLISH_BACKOFF,
            log_every_s=_PUBLISH_LOG_EVERY_S,
        )

    def _deliver(self, outbox: Outbox) -> None:
        """One attempt: produce what is due, wait up to ``_DELIVERY_WAIT_S`` for the
        reports; raise :class:`TransientError` while anything is undelivered."""
        self._check_topic()

        def report(err: KafkaError | None, msg: Message) -> None:
            outbox.report(msg.key() or b"", None if err is None else err.str())

        for message in outbox.due():
            try:
                self._producer.produce(
                    self._topic, message.value(), message.key(), on_delivery=report
                )
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() in _NO_SUCH_TOPIC:
                    raise self._missing_topic() from exc
                raise TransientError(f"cannot publish to {self._topic}: {exc}") from exc
            outbox.sent(message)
        self._producer.flush(_DELIVERY_WAIT_S)
        if outbox.undelivered:
            error = outbox.last_error
            why = "" if error is None else f" (last delivery error: {error})"
            raise TransientError(
                f"{outbox.undelivered} control messages not yet acknowledged by the broker "
                f"on {self._topic}{why}"
            )
