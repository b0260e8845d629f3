"""The control topic, read by capture: where it left the slot, what apply applied, each
table's state.

At start, :meth:`ControlReader.load` reads the compacted topic to its end
(:class:`ControlState`: the last slot checkpoint and the server it names, the applied
offset and position of every change-topic partition, the status of every table); while
streaming, :meth:`ControlReader.poll` feeds the applied offsets apply publishes to the
in-flight book, which is what lets the slot advance (:mod:`capture.in_flight`). capture
writes to the topic through the publisher (:mod:`capture.publish.publisher`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka.cimpl import TopicPartition

from capture.errors import ConfigError, TransientError
from capture.in_flight import ProgressBook
from capture.publish.publisher import KAFKA_SETTING, Topics, client_conf
from capture.settings import KafkaSettings
from runtime.kafka_client import ConnectionErrors
from schemas.control import (
    AppliedProgress,
    ControlMessage,
    ControlMessageError,
    ServerIdentity,
    SlotCheckpoint,
    TableState,
    TableStatus,
    decode_control,
)
from schemas.lsn import Lsn

log = logging.getLogger(__name__)

_STREAMED_STATES = frozenset({TableState.SNAPSHOT, TableState.CATCH_UP, TableState.STREAMING})


@dataclass(frozen=True, slots=True)
class ControlState:
    """What the control topic said when capture started."""

    checkpoint: Lsn | None
    """The slot checkpoint capture wrote last, if any."""
    applied: dict[tuple[str, int], int]
    """Applied next offset per change-topic partition."""
    tables: dict[str, TableStatus] = field(default_factory=dict)
    """The last status of each table of the slot."""
    server: ServerIdentity | None = None
    """The server the last checkpoint was taken on (None: no checkpoint, or one written
    before capture recorded it)."""
    applied_lsns: dict[tuple[str, int], Lsn] = field(default_factory=dict)
    """Commit LSN of the newest applied record per change-topic partition."""

    def applied_topics(self, topic_prefix: str) -> set[str]:
        return {
            t for (t, _), n in self.applied.items() if n > 0 and t.startswith(f"{topic_prefix}.")
        }

    def streamed_tables(self) -> set[str]:
        """The tables whose changes capture is taking from the slot: snapshotting,
        catching up or streaming. Not the pending ones: their snapshot, when it comes,
        takes their rows again from a point of its own, so a new slot skips nothing of
        theirs; nor the errored ones, which stream again only after a resync (a
        snapshot)."""
        return {table for table, status in self.tables.items() if status.state in _STREAMED_STATES}

    def newest_position(self, topic_prefix: str) -> Lsn | None:
        """The newest LSN the lake or the slot checkpoint holds for this pipeline: apply
        drops every record at or below it as a replay, so the source must never write
        anything new at or below it."""
        positions = [
            lsn for (t, _), lsn in self.applied_lsns.items() if t.startswith(f"{topic_prefix}.")
        ]
        if self.checkpoint is not None:
            positions.append(self.checkpoint)
        return max(positions, default=None)


_UNKNOWN_TOPIC = (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART)
_CONTROL_METADATA_WAIT_S = 30.0
CONTROL_SILENCE_S = 30.0
"""After this long without a message from the control topic, its consumer is opened
anew where it was (:meth:`ControlReader.poll`)."""


class ControlTopicMissingError(ConfigError):
    """The control topic does not exist: capture has not started on this cluster yet."""


CONTROL_GROUP = "pgdelta-capture-control"
"""The group id of capture's control-topic consumer. Nothing is committed under it
(partitions are assigned), but a secured cluster's ACLs still name it."""


class ControlReader:
    """Reads the compacted control topic from the beginning and feeds applied offsets
    to the book. No consumer group: every capture instance needs the whole state.

    With ``topics`` (the service, which writes to the topic) a missing control topic is
    created; without (operator commands that only read) it never is, and a missing one
    raises :class:`ControlTopicMissingError`.

    A consumer with assigned partitions may stop fetching for good after its broker
    restarts (librdkafka, https://github.com/confluentinc/librdkafka/issues/5153: only a
    new consumer reads again). Capture would then never hear of applied offsets and the
    slot would stop advancing. So a consumer that has brought nothing, not even an
    end-of-partition event, for :data:`CONTROL_SILENCE_S` is replaced by a new one at the
    offsets it had reached. On a quiet topic that costs a reconnection per interval;
    nothing is read twice that matters (applied offsets only ever move forward)."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: Topics | None,
        *,
        silence_s: float = CONTROL_SILENCE_S,
    ) -> None:
        if topics is not None:
            topics.ensure(settings.control_topic, compacted=True)
        errors = ConnectionErrors(KAFKA_SETTING)
        self._conf = client_conf(settings) | {
            "group.id": CONTROL_GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
        self._errors = errors
        self._consumer = Consumer(self._conf, error_cb=errors)
        self._silence_s = silence_s
        self._heard_at = time.monotonic()
        self._next: dict[int, int] = {}
        """By partition, the offset after the last message read."""
        self.reopened = 0
        """How many times the consumer was replaced after a silence."""
        self._topic = settings.control_topic
        # A topic created a moment ago may not be in the metadata yet (a broker that just
        # started shows it without partitions for a while): assigning no partitions would
        # read nothing, ever, and the slot would never advance. So the service, which
        # created it, waits for its partitions.
        deadline = time.monotonic() + _CONTROL_METADATA_WAIT_S
        while True:
            try:
                metadata = self._consumer.list_topics(settings.control_topic, timeout=10)
            except KafkaException as exc:
                self._consumer.poll(0)  # serves the error callback: a refused login says so
                self._consumer.close()
                errors.check()
                raise TransientError(f"cannot read the control topic's metadata: {exc}") from exc
            found = metadata.topics.get(settings.control_topic)
            partitions = [] if found is None else sorted(found.partitions)
            unknown = (
                found is not None
                and found.error is not None
                and found.error.code() in _UNKNOWN_TOPIC
            )
            if partitions and not unknown:
                break
            if topics is None:
                self._consumer.close()
                raise ControlTopicMissingError(
                    f"capture has not started yet (no control topic {settings.control_topic})"
                )
            if time.monotonic() > deadline:
                self._consumer.close()
                raise TransientError(
                    f"the control topic {settings.control_topic} has no partitions in the "
                    f"cluster's metadata {_CONTROL_METADATA_WAIT_S:.0f} s after it was "
                    "created; retrying"
                )
            time.sleep(0.2)
        self._partitions = partitions
        self._consumer.assign(
            [TopicPartition(settings.control_topic, p, 0) for p in self._partitions]
        )

    def load(self, slot: str, timeout_s: float = 30.0) -> ControlState:
        """Read the topic to its end; what it says about ``slot`` and the change topics."""
        # The end of each partition as of now; an empty partition is read already. Waiting
        # for end-of-partition events alone would cost a consume timeout per start.
        deadline = time.monotonic() + timeout_s
        ends = {p: self._end_offset(p, deadline) for p in self._partitions}
        at_end = {p for p, end in ends.items() if end == 0}
        checkpoint: Lsn | None = None
        server: ServerIdentity | None = None
        applied: dict[tuple[str, int], int] = {}
        applied_lsns: dict[tuple[str, int], Lsn] = {}
        tables: dict[str, TableStatus] = {}
        while len(at_end) < len(self._partitions):
            if time.monotonic() > deadline:
                raise TransientError("the control topic could not be read to its end in time")
            for message in self._consumer.consume(1000, timeout=0.1):
                error = message.error()
                partition = message.partition() or 0
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                    continue
                if (message.offset() or 0) + 1 >= ends[partition]:
                    at_end.add(partition)
                self._next[partition] = (message.offset() or 0) + 1
                decoded = self._decode(message)
                if isinstance(decoded, SlotCheckpoint) and decoded.slot == slot:
                    checkpoint, server = decoded.confirmed_lsn, decoded.server
                elif isinstance(decoded, AppliedProgress):
                    applied[(decoded.topic, decoded.partition)] = decoded.next_offset
                    if decoded.commit_lsn is not None:
                        applied_lsns[(decoded.topic, decoded.partition)] = decoded.commit_lsn
                elif isinstance(decoded, TableStatus) and decoded.slot == slot:
                    tables[decoded.table] = decoded
        return ControlState(checkpoint, applied, tables, server, applied_lsns)

    def _end_offset(self, partition: int, deadline: float) -> int:
        """The partition's end offset now, 0 when it is empty. A topic created a moment
        ago may have no leader yet; that passes, so it is retried until ``deadline``."""
        while True:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self._topic, partition), timeout=5
                )
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    raise TransientError(f"cannot read the control topic's end: {exc}") from exc
                time.sleep(0.1)
            else:
                return int(high) if high > low else 0

    def poll(self, book: ProgressBook, max_messages: int = 1000) -> int:
        """Feed what has arrived to ``book``; returns how many progress messages were read."""
        count = 0
        messages = self._consumer.consume(max_messages, timeout=0)
        now = time.monotonic()
        if messages:
            self._heard_at = now
        elif now - self._heard_at >= self._silence_s:
            self._reopen()
            self._heard_at = now
        for message in messages:
            decoded = self._decode(message)
            if message.error() is None:
                self._next[message.partition() or 0] = (message.offset() or 0) + 1
            if isinstance(decoded, AppliedProgress):
                book.applied(decoded.topic, decoded.partition, decoded.next_offset)
                count += 1
        return count

    def _reopen(self) -> None:
        """Replace the consumer by a new one at the offsets reached (see the class)."""
        log.debug("control topic silent for %.0f s: opening its consumer anew", self._silence_s)
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()
        self._consumer = Consumer(self._conf, error_cb=self._errors)
        self._consumer.assign(
            [TopicPartition(self._topic, p, self._next.get(p, 0)) for p in self._partitions]
        )
        self.reopened += 1

    @staticmethod
    def _decode(message: Message) -> ControlMessage | None:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return None
            raise TransientError(f"control topic read failed: {error.str()}")
        key, value = message.key(), message.value()
        if key is None or value is None:
            return None
        try:
            return decode_control(key, value)
        except ControlMessageError as exc:
            raise ConfigError(str(exc)) from exc

    def close(self) -> None:
        self._consumer.close()
