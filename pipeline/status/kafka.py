"""The Kafka side of the status: the control topic, the change topics' ends, and the
oldest waiting record of each lagging partition.

One :class:`~confluent_kafka.admin.AdminClient` (metadata of every topic and the end
offsets of every partition, each in one request per broker) and one consumer without a
group (partitions assigned by hand, nothing committed) are kept open between reads:

- the control topic is read **incrementally**: each read continues from where the last
  one stopped, up to the end offsets just listed, and keeps the newest message of every
  key (the topic is compacted, so that is its state);
- for every partition with offsets waiting, the record at apply's ``next_offset`` is
  read (skipping tombstones) for its commit time (:mod:`pipeline.status.lag`).

Read-only by construction: metadata is asked for every topic, never for one by name
(a request naming a topic may create it on a broker with ``auto.create.topics.enable``),
nothing is produced, no offset is committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import TopicPartition

from apply.errors import ConfigError
from apply.lake.tables import table_of_topic
from pipeline.status.errors import StatusError
from pipeline.status.lag import EnvelopeError, WaitingChange, envelope_head
from runtime.kafka_client import ConnectionErrors, connection_conf
from schemas.control import ControlMessage, ControlMessageError, decode_control

log = logging.getLogger(__name__)

Partition = tuple[str, int]
STATUS_GROUP = "pgdelta-status"
"""The status consumer's group id: nothing is committed under it (partitions are
assigned), but a secured cluster's ACLs name it."""
_TIMEOUT_S = 10.0
_LEADER_BACKOFF_S = 0.2
_LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)
_LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # untyped in confluent-kafka


@dataclass(frozen=True, slots=True)
class KafkaSnapshot:
    control_topic_exists: bool
    control: Mapping[bytes, ControlMessage]
    """The newest message of each key of the control topic."""
    change_topics: Mapping[str, str]
    """Change topic of each table (``schema.table``) present on the cluster."""
    ends: Mapping[Partition, int]
    """End offset (high watermark) of every change-topic partition."""


@dataclass
class _ControlLog:
    positions: dict[int, int] = field(default_factory=dict)
    """Next offset to read, per control-topic partition."""
    newest: dict[bytes, ControlMessage] = field(default_factory=dict)


def is_change_topic(topic: str, prefix: str, excluded: set[str]) -> bool:
    """``<prefix>.<schema>.<table>``: two escaped segments after the prefix."""
    if topic in excluded or not topic.startswith(f"{prefix}."):
        return False
    return len(topic[len(prefix) + 1 :].split(".")) == 2


class KafkaReader:
    def __init__(
        self,
        bootstrap_servers: str,
        control_topic: str,
        topic_prefix: str,
        schema_topic: str,
        client: Mapping[str, str] | None = None,
    ) -> None:
        """``client``: the Kafka client properties (:mod:`runtime.kafka_client`)."""
        self._control_topic = control_topic
        self._prefix = topic_prefix
        self._excluded = {control_topic, schema_topic}
        self._errors = ConnectionErrors("CAPTURE_KAFKA")
        conf = connection_conf(bootstrap_servers, client or {})
        self._admin = AdminClient(conf, error_cb=self._errors)
        self._consumer = Consumer(
            conf
            | {
                "group.id": STATUS_GROUP,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
                "allow.auto.create.topics": False,
                "fetch.wait.max.ms": 50,
            },
            error_cb=self._errors,
        )
        self._log = _ControlLog()

    def read(self) -> KafkaSnapshot:
        # With an error callback set, librdkafka queues connection errors until polled.
        self._admin.poll(0)
        try:
            topics = self._admin.list_topics(timeout=_TIMEOUT_S).topics
        except KafkaException as exc:
            self._admin.poll(0)  # serves the error callback: a refused login says so
            try:
                self._errors.check()
            except ConfigError as refused:
                raise StatusError(str(refused)) from exc
            raise StatusError(f"cannot read the Kafka cluster's metadata: {exc}") from exc
        control = topics.get(self._control_topic)
        if control is None or not control.partitions:
            return KafkaSnapshot(False, {}, {}, {})
        change_topics: dict[str, str] = {}
        for topic in topics:
            if is_change_topic(topic, self._prefix, self._excluded):
                try:
                    change_topics[str(table_of_topic(topic))] = topic
                except ConfigError:
                    log.warning("topic %s has the prefix but names no table; left out", topic)
        partitions = [(self._control_topic, p) for p in control.partitions]
        partitions += [(t, p) for t in change_topics.values() for p in topics[t].partitions]
        ends = self._end_offsets(partitions)
        self._read_control({p: ends[(self._control_topic, p)] for p in control.partitions})
        return KafkaSnapshot(
            True,
            dict(self._log.newest),
            change_topics,
            {tp: end for tp, end in ends.items() if tp[0] != self._control_topic},
        )

    def oldest_waiting(
        self, next_offsets: Mapping[Partition, int], ends: Mapping[Partition, int]
    ) -> dict[Partition, WaitingChange]:
        """The first change (not a tombstone) at or after ``next_offsets`` of each
        partition, below its end; partitions with none are left out."""
        spans = {tp: (start, ends[tp]) for tp, start in next_offsets.items() if start < ends[tp]}
        found: dict[Partition, WaitingChange] = {}

        def take(message: Message) -> bool:
            value = message.value()
            if value is None:
                return False  # a tombstone: its DELETE came before it
            partition = (message.topic() or "", message.partition() or 0)
            try:
                found[partition] = envelope_head(value)
            except EnvelopeError as exc:
                log.warning(
                    "the record at %s/%d/%d is not a change record, its lag is unknown: %s",
                    partition[0],
                    partition[1],
                    message.offset() or 0,
                    exc,
                )
            return True

        self._consume(spans, take)
        return found

    def _end_offsets(self, partitions: list[Partition]) -> dict[Partition, int]:
        """The end offset of every partition. A partition whose leader is moving (a topic
        created a moment ago answers NOT_LEADER_FOR_PARTITION to its first requests, as
        does one whose broker restarts) is asked again until the read's deadline: status
        runs beside a capture that creates topics as tables appear."""
        ends: dict[Partition, int] = {}
        waiting = list(partitions)
        deadline = time.monotonic() + _TIMEOUT_S
        while waiting:
            request = {TopicPartition(t, p): _LATEST for t, p in waiting}
            futures = self._admin.list_offsets(request, request_timeout=_TIMEOUT_S)
            moving: list[Partition] = []
            for tp, future in futures.items():
                partition = (tp.topic, tp.partition)
                try:
                    ends[partition] = int(future.result().offset)
                except KafkaException as exc:
                    error = exc.args[0] if exc.args else None
                    if not _leader_moving(error) or time.monotonic() > deadline:
                        raise StatusError(
                            f"cannot list the end offset of {tp.topic}[{tp.partition}]: {exc}"
                        ) from exc
                    moving.append(partition)
            waiting = moving
            if waiting:
                time.sleep(_LEADER_BACKOFF_S)
        return ends

    def _read_control(self, ends: Mapping[int, int]) -> None:
        if any(self._log.positions.get(p, 0) > end for p, end in ends.items()):
            # The topic ends before where the last read stopped: it was deleted and
            # created again, so what was read from it no longer holds.
            self._log = _ControlLog()
        spans = {
            (self._control_topic, p): (self._log.positions.get(p, 0), end)
            for p, end in ends.items()
        }

        def take(message: Message) -> bool:
            partition, offset = message.partition() or 0, message.offset() or 0
            self._log.positions[partition] = offset + 1
            key, value = message.key(), message.value()
            if key is None:
                return False
            if value is None:
                self._log.newest.pop(key, None)  # a tombstone deletes the key
                return False
            try:
                self._log.newest[key] = decode_control(key, value)
            except ControlMessageError as exc:
                log.warning("control message left out: %s", exc)
            return False

        self._consume(spans, take)
        for p, end in ends.items():
            # Compaction may have removed the last offsets before the end: read them all.
            self._log.positions[p] = max(self._log.positions.get(p, 0), end)

    def _consume(
        self, spans: Mapping[Partition, tuple[int, int]], take: Callable[[Message], bool]
    ) -> None:
        """Read each partition from ``start`` until ``take`` says done or ``end``."""
        open_spans = {tp: span for tp, span in spans.items() if span[0] < span[1]}
        if not open_spans:
            return
        try:
            self._consumer.assign(
                [TopicPartition(t, p, s) for (t, p), (s, _) in open_spans.items()]
            )
            deadline = time.monotonic() + _TIMEOUT_S
            while open_spans:
                if time.monotonic() > deadline:
                    raise StatusError(
                        f"{len(open_spans)} partitions could not be read to their end in "
                        f"{_TIMEOUT_S:.0f}s (first: {min(open_spans)})"
                    )
                for message in self._consumer.consume(500, timeout=0.1):
                    tp = (message.topic() or "", message.partition() or 0)
                    if tp not in open_spans:
                        continue
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            del open_spans[tp]
                            continue
                        raise StatusError(f"reading {tp[0]}/{tp[1]} failed: {error.str()}")
                    offset, end = message.offset() or 0, open_spans[tp][1]
                    if offset >= end or take(message) or offset + 1 >= end:
                        del open_spans[tp]
        except KafkaException as exc:
            raise StatusError(f"cannot read from Kafka: {exc}") from exc
        finally:
            self._consumer.unassign()

    def close(self) -> None:
        self._consumer.close()


def _leader_moving(error: object) -> bool:
    """Whether a partition's error says its leadership is being settled, which passes."""
    return isinstance(error, KafkaError) and error.code() in _LEADER_MOVING
