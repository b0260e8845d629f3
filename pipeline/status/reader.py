"""One read of the whole pipeline's state: :class:`StatusReader` and :func:`collect`.

A reader keeps its connections (one Kafka admin client and consumer, one PostgreSQL
connection) so it can be read every second (the demo's live progress); each read costs
a metadata and an end-offset request, the control messages added since the last read,
one record per lagging partition, and one SQL query. It never writes: no topic is
created, nothing is produced or committed, the SQL session is read-only, and no Spark
is started (apply's parked records come from the control topic, see
:mod:`apply.control.table_status`).

The tables shown are those capture recorded a state for under its slot, those apply
published progress or a status for, and those with a change topic under the prefix.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from apply.settings import ApplySettings
from capture.settings import CaptureSettings
from capture.source.credentials import source_password
from pipeline.status.errors import StatusConfigError
from pipeline.status.kafka import KafkaReader, KafkaSnapshot, Partition
from pipeline.status.lag import WaitingChange, oldest, table_lag, waiting_offsets
from pipeline.status.model import PipelineStatus, TableView
from pipeline.status.slot import SlotReader
from runtime.errors import ConfigError
from runtime.kafka_client import client_properties
from schemas.control import AppliedProgress, ApplyTableStatus, TableStatus
from schemas.lsn import Lsn
from schemas.naming import table_topic


def check_settings(capture: CaptureSettings, apply: ApplySettings) -> None:
    """capture and apply must name the same control topic and topic prefix, or the
    status would mix what two pipelines say."""
    pairs = [
        ("CONTROL_TOPIC", capture.kafka.control_topic, apply.kafka.control_topic),
        ("TOPIC_PREFIX", capture.kafka.topic_prefix, apply.kafka.topic_prefix),
    ]
    for name, of_capture, of_apply in pairs:
        if of_capture != of_apply:
            raise StatusConfigError(
                f"CAPTURE_KAFKA__{name}={of_capture} and APPLY_KAFKA__{name}={of_apply} "
                "differ: capture and apply of one pipeline must use the same value"
            )


class StatusReader:
    """Reads :class:`PipelineStatus` on demand; :meth:`close` when done (or ``with``)."""

    def __init__(
        self,
        capture: CaptureSettings,
        apply: ApplySettings,
        *,
        clock: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        check_settings(capture, apply)
        self._slot = capture.postgres.slot
        self._prefix = capture.kafka.topic_prefix
        self._control_topic = capture.kafka.control_topic
        self._clock = clock
        try:
            # capture's client properties: the status reads the topics capture writes.
            client = client_properties(
                capture.kafka.client, capture.kafka.client_secrets_dir, setting="CAPTURE_KAFKA"
            )
            password = source_password(capture.postgres)
        except ConfigError as exc:
            raise StatusConfigError(str(exc)) from exc
        self._kafka = KafkaReader(
            capture.kafka.bootstrap_servers,
            capture.kafka.control_topic,
            capture.kafka.topic_prefix,
            capture.kafka.schema_topic,
            client,
        )
        self._postgres = SlotReader(capture.postgres.dsn, password, capture.postgres.slot)

    def read(self) -> PipelineStatus:
        server = self._postgres.read()
        kafka = self._kafka.read()
        now = self._clock()
        if not kafka.control_topic_exists:
            return PipelineStatus(
                self._control_topic, False, now, server.current_wal_lsn, server.slot, ()
            )
        tables = self._tables(kafka, server.current_wal_lsn, now)
        return PipelineStatus(
            self._control_topic, True, now, server.current_wal_lsn, server.slot, tables
        )

    def _tables(self, kafka: KafkaSnapshot, wal: Lsn, now: int) -> tuple[TableView, ...]:
        capture: dict[str, TableStatus] = {}
        apply: dict[str, ApplyTableStatus] = {}
        progress: dict[Partition, AppliedProgress] = {}
        change_topics = set(kafka.change_topics.values())
        for message in kafka.control.values():
            if isinstance(message, TableStatus) and message.slot == self._slot:
                capture[message.table] = message
            elif isinstance(message, ApplyTableStatus):
                apply[message.table] = message
            elif isinstance(message, AppliedProgress) and message.topic in change_topics:
                progress[(message.topic, message.partition)] = message
        topics = dict(kafka.change_topics)
        for table in {*capture, *apply} - set(topics):
            schema, _, name = table.partition(".")  # as capture splits a table name
            topics[table] = table_topic(self._prefix, schema, name)
        next_offsets = {tp: progress[tp].next_offset if tp in progress else 0 for tp in kafka.ends}
        waiting_changes = self._kafka.oldest_waiting(next_offsets, kafka.ends)
        views = []
        for table in sorted(topics):
            topic = topics[table]
            partitions = [tp for tp in kafka.ends if tp[0] == topic]
            views.append(
                _view(
                    table=table,
                    topic=topic,
                    capture=capture.get(table),
                    apply=apply.get(table),
                    progress=[progress[tp] for tp in partitions if tp in progress],
                    waiting=waiting_offsets(
                        (next_offsets[tp], kafka.ends[tp]) for tp in partitions
                    ),
                    oldest_waiting=oldest(
                        waiting_changes[tp] for tp in partitions if tp in waiting_changes
                    ),
                    wal=wal,
                    now=now,
                )
            )
        return tuple(views)

    def close(self) -> None:
        self._kafka.close()
        self._postgres.close()

    def __enter__(self) -> StatusReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _view(
    *,
    table: str,
    topic: str,
    capture: TableStatus | None,
    apply: ApplyTableStatus | None,
    progress: list[AppliedProgress],
    waiting: int,
    oldest_waiting: WaitingChange | None,
    wal: Lsn,
    now: int,
) -> TableView:
    # Every partition's message carries the table's applied LSN as of its publish: the
    # highest is the newest.
    applied = max((m.table_lsn for m in progress if m.table_lsn is not None), default=None)
    apply_errored = apply is not None and apply.errored
    lag_bytes, lag_s = table_lag(
        waiting=waiting,
        apply_errored=apply_errored,
        current_wal_lsn=wal,
        applied_lsn=applied,
        oldest_waiting=oldest_waiting,
        now_micros=now,
    )
    return TableView(
        table=table,
        topic=topic,
        capture_state=None if capture is None else capture.state,
        capture_message=None if capture is None else capture.message,
        applied_lsn=applied,
        lag_bytes=lag_bytes,
        lag_s=lag_s,
        waiting=waiting,
        apply_errored=apply_errored,
        parked=0 if apply is None else apply.parked,
        apply_error=None if apply is None else apply.error,
        snapshot_resume=None if capture is None else capture.resume,
    )


def collect(capture: CaptureSettings, apply: ApplySettings) -> PipelineStatus:
    """One status read with connections opened and closed for it."""
    with StatusReader(capture, apply) as reader:
        return reader.read()
