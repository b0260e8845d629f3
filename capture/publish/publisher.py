"""Kafka side of capture: topics and the idempotent producer.

The producer is idempotent with ``acks=all``, so a record is either in the log once,
in order, or its delivery report says it failed. A failed delivery stops the service
(:class:`~capture.errors.TransientError`): the slot has not moved past that record, so a
restart re-reads it from PostgreSQL. Partitioning uses ``murmur2_random``, the Java
client's default, so other producers and consumers agree on which partition a key is in.

Writer schemas are flushed to the schema topic before the first record that uses them
is produced, so a consumer that reads the schema topic first can always decode.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, cast

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import NewTopic

from capture.errors import TransientError
from capture.in_flight import ProgressBook, RecordTicket
from capture.metrics import CaptureMetrics
from capture.publish import native_producer
from capture.publish.native_producer import (
    Delivery,
    NativeProducer,
    RecordProducer,
    Report,
)
from capture.publish.partitioning import key_partitions
from capture.records import OutgoingRecord, SchemaRecord
from capture.settings import KafkaSettings
from runtime.kafka_client import (
    ConnectionErrors,
    KafkaConf,
    client_properties,
    connection_conf,
)
from schemas.control import (
    ServerIdentity,
    SlotCheckpoint,
    TableStatus,
)
from schemas.headers import Headers
from schemas.lsn import Lsn

if TYPE_CHECKING:
    from capture_native import KafkaProducer, StreamedRun

log = logging.getLogger(__name__)

KAFKA_SETTING = "CAPTURE_KAFKA"
"""The settings every Kafka client of capture is configured by, as errors name them."""
_COMPACTED = {"cleanup.policy": "compact"}
_FLUSH_TIMEOUT_S = 30.0
_TOPIC_METADATA_WAIT_S = 30.0
_LEADERS_WAIT_S = 30.0
_LEADERS_RETRY_S = 0.05
_END_OFFSET = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # untyped in confluent-kafka


def client_conf(settings: KafkaSettings) -> KafkaConf:
    """What every Kafka client of capture starts from: the bootstrap servers and the
    shared client properties (``kafka.client`` and its secrets directory, read anew for
    each client so a rotated secret is used by the next one). The properties each
    client sets for itself go on top: they are what its guarantees rest on."""
    properties = client_properties(
        settings.client, settings.client_secrets_dir, setting=KAFKA_SETTING
    )
    return connection_conf(settings.bootstrap_servers, properties)


def producer_conf(settings: KafkaSettings) -> KafkaConf:
    """The producer's: the client properties, its own guarantees, then ``kafka.producer``
    (a deliberate per-producer override, e.g. of ``linger.ms``)."""
    conf = client_conf(settings)
    conf |= {
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "partitioner": "murmur2_random",
        "queue.buffering.max.messages": 500_000,
    }
    conf |= settings.producer
    return conf


class Topics:
    """Creates topics on first use with the configured partitions and replication, and
    knows how many partitions each topic it ensured has.

    A topic is handed to the producer only once every partition's leader answers
    (:meth:`_await_leaders`). A producer's first record to a partition must not race
    the partition's leader coming up: the idempotent producer sends its first batches
    to a partition pipelined, and a broker accepts any sequence number from a producer
    it has no state for. So when the first batch is refused (``NOT_LEADER_OR_FOLLOWER``,
    the leader not ready yet) and the second, sent before that answer came, is
    accepted, the second is in the log without the first, and librdkafka reports the
    first as delivered, "implicitly acked by subsequent batch success", with no offset.
    capture stops on such a report (:meth:`ChangePublisher._report`), but the later
    record is already in the log, and the first one, published again after the
    restart, lands behind it, where apply's replay rule takes it for a replay and drops
    it. A just-created topic's partitions are exactly in that state (reproduced: about
    one new topic in a hundred whose first records came 12 ms apart), and so is a
    partition whose leader moves while a new producer starts writing to it."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._errors = ConnectionErrors(KAFKA_SETTING)
        self._admin = AdminClient(client_conf(settings), error_cb=self._errors)
        self._partitions: dict[str, int] = {}

    def serve_callbacks(self) -> None:
        """With an error callback set, librdkafka queues each connection error until
        the client is polled: poll, so a long outage does not pile them up."""
        self._admin.poll(0)

    def ensure(self, topic: str, *, compacted: bool = False, partitions: int | None = None) -> None:
        if topic in self._partitions:
            return
        try:
            count = self._partition_count(topic)
            if count is None:
                count = partitions or self._settings.partitions
                new = NewTopic(
                    topic,
                    count,
                    self._settings.replication_factor,
                    config=_COMPACTED if compacted else {},
                )
                self._admin.create_topics([new])[topic].result(30)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (
                isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
            ):
                self._admin.poll(0)  # serves the error callback: a refused login says so
                self._errors.check()
                raise TransientError(f"cannot create Kafka topic {topic}: {exc}") from exc
            # Created by someone else meanwhile: its partitions are theirs, and a topic
            # created a moment ago may show none for a while.
            count = self._await_partitions(topic)
        self._await_leaders(topic, count)
        self._partitions[topic] = count

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (ensuring it first). Read once per topic and
        process: partitions added while capture runs are used after its next start."""
        self.ensure(topic)
        return self._partitions[topic]

    def _partition_count(self, topic: str) -> int | None:
        """The topic's partitions in the cluster's metadata; None: it has none (yet)."""
        metadata = self._admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if metadata is None or not metadata.partitions:
            return None
        return len(metadata.partitions)

    def _await_leaders(self, topic: str, count: int) -> None:
        """Wait until the leader of each of ``topic``'s ``count`` partitions answers a
        request for its end offset: it is then the leader in its own replica manager,
        not only in the cluster's metadata (which a broker publishes first), and takes
        produce requests. Once per topic and process, so once per producer."""
        deadline = time.monotonic() + _LEADERS_WAIT_S
        waiting = [TopicPartition(topic, partition) for partition in range(count)]
        while True:
            answers = self._admin.list_offsets(
                dict.fromkeys(waiting, _END_OFFSET), request_timeout=10
            )
            refused: list[TopicPartition] = []
            last: KafkaException | None = None
            for partition, answer in answers.items():
                try:
                    answer.result()
                except KafkaException as exc:
                    refused.append(partition)
                    last = exc
            if not refused:
                return
            if time.monotonic() > deadline:
                self._admin.poll(0)  # serves the error callback: a refused login says so
                self._errors.check()
                raise TransientError(
                    f"Kafka topic {topic}: {len(refused)} of {count} partitions have no "
                    f"leader that answers after {_LEADERS_WAIT_S:.0f} s ({last}); retrying"
                )
            waiting = refused
            time.sleep(_LEADERS_RETRY_S)

    def _await_partitions(self, topic: str) -> int:
        deadline = time.monotonic() + _TOPIC_METADATA_WAIT_S
        while (count := self._partition_count(topic)) is None:
            if time.monotonic() > deadline:
                raise TransientError(
                    f"Kafka topic {topic} exists but shows no partitions after "
                    f"{_TOPIC_METADATA_WAIT_S:.0f} s; retrying"
                )
            time.sleep(0.2)
        return count


class ChangePublisher:
    """Produces change and schema records and reports deliveries to the book."""

    def __init__(
        self,
        settings: KafkaSettings,
        book: ProgressBook,
        topics: Topics,
        *,
        start: Lsn,
        metrics: CaptureMetrics | None = None,
        compiled: bool = True,
        server: ServerIdentity | None = None,
    ) -> None:
        """``compiled``: produce through :class:`NativeProducer` where this process can
        (:func:`capture.publish.native_producer.library`); otherwise, or when false,
        confluent-kafka's producer does, with the same records and guarantees.
        ``server``: the server the slot lives on, recorded with every slot checkpoint
        (:mod:`capture.source.server_identity` compares it at the next start)."""
        self._settings = settings
        self._server = server
        self._book = book
        self._metrics = metrics
        self._topics = topics
        self._errors = ConnectionErrors(KAFKA_SETTING)
        self._producer: RecordProducer
        if compiled and native_producer.library() is not None:
            self._producer = NativeProducer(producer_conf(settings), error_cb=self._errors)
            self._producer.on_streamed = self._streamed
        else:
            self._producer = Producer(producer_conf(settings), error_cb=self._errors)
        self.failure: str | None = None
        self._checkpoint_sent = start
        self.durable_checkpoint = start
        """The highest slot checkpoint known to be in the control topic; the slot is never
        confirmed past it, so a slot ahead of the checkpoint means someone else moved it."""

    def checkpoint(self, slot: str, lsn: Lsn) -> None:
        """Write the slot checkpoint ``lsn`` to the control topic (asynchronously)."""
        if lsn <= self._checkpoint_sent:
            return
        self._checkpoint_sent = lsn
        message = SlotCheckpoint(slot, lsn, self._server)

        def delivered(err: KafkaError | None, _msg: Delivery) -> None:
            if err is not None:
                self.failure = self.failure or f"slot checkpoint not written: {err.str()}"
            elif lsn > self.durable_checkpoint:
                self.durable_checkpoint = lsn

        self._produce(self._settings.control_topic, message.value(), message.key(), delivered)

    def publish_status(self, status: TableStatus) -> None:
        """Persist a table's state on the control topic (asynchronously; a lost status
        only means a table is snapshotted again, see capture/stream/table_states.py)."""
        self._produce(
            self._settings.control_topic, status.value(), status.key(), self._status_report
        )

    def publish_schema(self, record: SchemaRecord) -> None:
        self._topics.ensure(self._settings.schema_topic, compacted=True, partitions=1)
        self._produce(self._settings.schema_topic, record.value, record.key, self._schema_report)
        self.flush()

    def publish(self, record: OutgoingRecord, *, pin: int | None = None) -> None:
        """Produce ``record`` as part of the open transaction, or of ``pin`` (a snapshot
        record, or a change held back behind one; see ProgressBook.pin)."""
        self._topics.ensure(record.topic)
        size = len(record.key) + (len(record.value) if record.value is not None else 0)
        ticket = self._book.produced(size) if pin is None else self._book.produced_under(pin, size)
        if self._metrics is not None:
            self._metrics.record_produced(record.table, record.headers, record.value, size)
        report = partial(self._report, ticket)
        # A list of (str, bytes) pairs, as produce takes it: passed as it is, not copied.
        headers = cast("list[tuple[str, str | bytes | None]]", record.headers)
        self._produce(record.topic, record.value, record.key, report, headers)

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes,
        report: Report,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        """Produce one record; while the producer's queue is full, serve delivery
        reports until there is room (every record, control and schema ones too: a broker
        that is slow to acknowledge can fill the queue at any of them)."""
        while True:
            try:
                self._producer.produce(topic, value, key, headers=headers, on_delivery=report)
            except BufferError:
                self._producer.poll(0.1)
            else:
                return

    def publish_batch(
        self,
        topic: str,
        table: str,
        headers: Headers,
        keys: list[bytes],
        values: Sequence[bytes],
        *,
        pin: int,
    ) -> None:
        """:meth:`publish` of records ``keys[i]``/``values[i]`` of ``table`` on ``topic``
        that share ``headers`` (a snapshot batch) under ``pin``: the per-record work
        that does not depend on the record (topic, metrics, headers) is done once.

        Each record goes to its key's partition, computed here (capture/publish/partitioning.py),
        and only the first and the last record of each partition's run ask for a
        delivery report: a report costs as much as the ``produce`` call, and a batch's
        records of one partition are one run in the log. The two reports' offsets tell
        whether the run is whole (:class:`PartitionRun`), so no record can be lost unseen."""
        sizes = [len(key) + len(value) for key, value in zip(keys, values, strict=True)]
        partitions = key_partitions(keys, self._topics.partitions(topic))
        if self._metrics is not None:
            self._metrics.records_produced(table, headers, len(sizes), sum(sizes))
        # Each partition's run: its first and last record, its count and its bytes.
        firsts: dict[int, int] = {}
        lasts: dict[int, int] = {}
        counts: dict[int, int] = {}
        run_bytes: dict[int, int] = {}
        for index, (partition, size) in enumerate(zip(partitions, sizes, strict=True)):
            if partition not in firsts:
                firsts[partition] = index
                counts[partition] = 0
                run_bytes[partition] = 0
            lasts[partition] = index
            counts[partition] += 1
            run_bytes[partition] += size
        tickets = self._book.produced_runs_under(pin, [(counts[p], run_bytes[p]) for p in firsts])
        reports: dict[int, Report] = {}
        for partition, ticket in zip(firsts, tickets, strict=True):
            if ticket.records == 1:
                reports[firsts[partition]] = partial(self._report, ticket)
            else:
                run = PartitionRun(ticket)
                reports[firsts[partition]] = partial(self._run_report, run, True)
                reports[lasts[partition]] = partial(self._run_report, run, False)
        shared: list[tuple[str, str | bytes | None]] = list(headers)
        if isinstance(self._producer, NativeProducer):
            # The whole batch in one call: the per-record loop below is most of a
            # snapshot row's cost in the capture loop.
            self._producer.produce_batch(topic, partitions, keys, list(values), shared, reports)
            return
        produce = self._producer.produce
        for index, (key, value, partition) in enumerate(zip(keys, values, partitions, strict=True)):
            on_delivery = reports.get(index)
            while True:
                try:
                    if on_delivery is None:
                        produce(topic, value, key, partition, headers=shared)
                    else:
                        produce(
                            topic, value, key, partition, headers=shared, on_delivery=on_delivery
                        )
                except BufferError:
                    self._producer.poll(0.1)  # the local queue is full: make room
                else:
                    break

    @property
    def compiled_producer(self) -> KafkaProducer | None:
        """The compiled producer, for the compiled stream; None with
        confluent-kafka's."""
        producer = self._producer
        return producer.native if isinstance(producer, NativeProducer) else None

    def ensure_topic(self, topic: str) -> None:
        self._topics.ensure(topic)

    def _streamed(self, runs: list[StreamedRun]) -> None:
        """The compiled stream's delivered records, summed per transaction and partition
        (a failed one comes as an unreported failure instead)."""
        delivered = self._book.delivered_records
        for run in runs:
            delivered(run.transaction, run.topic, run.partition, run.offset, run.records, run.bytes)

    def poll(self, timeout_s: float = 0.0) -> None:
        self._producer.poll(timeout_s)
        self._topics.serve_callbacks()
        self._raise_on_failure()

    def flush(self, timeout_s: float = _FLUSH_TIMEOUT_S) -> None:
        remaining = self._producer.flush(timeout_s)
        self._raise_on_failure()
        if remaining:
            raise TransientError(f"{remaining} records still undelivered after {timeout_s:.0f}s")

    def _report(self, ticket: RecordTicket, err: KafkaError | None, msg: Delivery) -> None:
        # Called once per streamed record: its checks are written out here, not shared
        # with _run_report through a helper (a call and a tuple more per record).
        if err is not None:
            self.failure = self.failure or f"delivery to {msg.topic()} failed: {err.str()}"
            return
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        if topic is None or partition is None or offset is None:
            self.failure = self.failure or "a delivery report without a position"
            return
        self._book.delivered(ticket, topic, partition, offset)

    def _run_report(
        self, run: PartitionRun, first: bool, err: KafkaError | None, msg: Delivery
    ) -> None:
        """The report of a run's first or last record (in either order); the run is
        booked once both came and show it whole."""
        if err is not None:
            self.failure = self.failure or f"delivery to {msg.topic()} failed: {err.str()}"
            return
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        if topic is None or partition is None or offset is None:
            self.failure = self.failure or "a delivery report without a position"
            return
        try:
            span = run.reported(first=first, offset=offset)
        except BrokenRunError as exc:
            self.failure = self.failure or f"{topic} [{partition}]: {exc}"
            return
        if span is not None:
            # The run ends at its last record's offset, whichever report came second.
            self._book.delivered(run.ticket, topic, partition, span[1])

    def _schema_report(self, err: KafkaError | None, _msg: Delivery) -> None:
        if err is not None:
            self.failure = self.failure or f"schema publication failed: {err.str()}"

    def _status_report(self, err: KafkaError | None, _msg: Delivery) -> None:
        if err is not None:
            self.failure = self.failure or f"table status not written: {err.str()}"

    def _raise_on_failure(self) -> None:
        if self.failure is None and isinstance(self._producer, NativeProducer):
            self.failure = self._producer.unreported_failure
        if self.failure is not None:
            self._errors.check()  # credentials rotated away under a running producer
            raise TransientError(
                f"{self.failure}; stopping so the restart re-reads it from the slot"
            )


class BrokenRunError(Exception):
    """A run's two delivery reports show its records were not written one after another."""


@dataclass(slots=True)
class PartitionRun:
    """A run of a snapshot batch's records produced one after another to one partition,
    of which only the first and the last ask for a delivery report.

    The idempotent producer writes a partition's records in produce order, so a run of
    n records takes n consecutive offsets unless some were lost (a record that timed out
    in the producer's queue leaves a gap, even with idempotence: librdkafka's
    INTRODUCTION.md, "Message timeout considerations") or another producer wrote in
    between. Either way the run cannot be vouched for, so any other span fails it."""

    ticket: RecordTicket
    first_offset: int | None = None
    last_offset: int | None = None

    def reported(self, *, first: bool, offset: int) -> tuple[int, int] | None:
        """Take the first or the last record's offset; once both came and the run is
        whole, its first and last offsets. Raises :class:`BrokenRunError` when they show
        it is not."""
        if first:
            self.first_offset = offset
        else:
            self.last_offset = offset
        if self.first_offset is None or self.last_offset is None:
            return None
        records = self.ticket.records
        span = self.last_offset - self.first_offset + 1
        if span != records:
            raise BrokenRunError(
                f"{records} records produced one after another were written across "
                f"{span} offsets ({self.first_offset} to {self.last_offset}): some may "
                "be lost (refused by the broker, e.g. larger than the topic's "
                "max.message.bytes, or timed out in the producer), or another producer "
                "writes to capture's topics"
            )
        return self.first_offset, self.last_offset
