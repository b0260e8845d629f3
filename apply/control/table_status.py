"""apply's state of each table on the control topic: errored or not, records parked.

The dead-letter table is the truth (:mod:`apply.lake.dead_letter`: a table is errored exactly
while records of it wait there), but reading it needs Spark. So apply also publishes,
per table, an :class:`~schemas.control.ApplyTableStatus` (key ``apply:<schema.table>``)
that tools read from the control topic without Spark: ``python -m apply errored`` and
``python -m pipeline status``.

Invariants:

- **Published after the commit it describes, never before.** The job publishes a
  table's status after the Delta commit that parked new records of it; ``reapply`` and
  ``discard`` after the commit that released or set aside some; and, at start, for
  every table that has rows in the dead-letter table, so a status lost to a crash
  between a commit and its publish is put right by the restart.
- **Absolute values, computed from the dead-letter table** after that commit (the
  waiting records, the error of the oldest): publishing one twice is harmless, and the
  newest message of a key is the state.
- This module imports no Spark: the status comes from the job's coordinating code
  (:mod:`apply.app`) and is read back here.

What it cannot see: a streaming batch that parks while ``reapply`` releases in another
process may publish its count after the release's count although it was read before
it. The status is then stale until the next parking, ``reapply``, ``discard`` or job
start publishes again; ``python -m apply errored --from-lake`` reads the truth.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.cimpl import TopicPartition

from apply.engine.kafka_clients import SETTING, STATUS_GROUP, client_conf
from apply.errors import ConfigError, TransientError, parked_cure
from apply.settings import KafkaSettings
from runtime.kafka_client import ConnectionErrors
from schemas.control import ApplyTableStatus, ControlMessageError, decode_control

_UNKNOWN_TOPIC = (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART)


class WaitingRecords(Protocol):
    """What the dead-letter table says about an errored table
    (:class:`apply.lake.dead_letter.ErroredTable` has these)."""

    @property
    def records(self) -> int: ...
    @property
    def error(self) -> str: ...
    @property
    def error_kind(self) -> str: ...


def now_micros() -> int:
    return time.time_ns() // 1000


def table_statuses(
    tables: Iterable[str], errored: Mapping[str, WaitingRecords], updated_at: int
) -> list[ApplyTableStatus]:
    """The status of each of ``tables`` (by name), given the errored tables the
    dead-letter table holds now: a table not among them has nothing waiting."""
    statuses = []
    for table in sorted(set(tables)):
        waiting = errored.get(table)
        statuses.append(
            ApplyTableStatus(table, False, 0, None, updated_at)
            if waiting is None or waiting.records == 0
            else ApplyTableStatus(
                table,
                True,
                waiting.records,
                f"{waiting.error_kind}: {waiting.error}",
                updated_at,
            )
        )
    return statuses


def format_errored(statuses: Mapping[str, ApplyTableStatus]) -> str:
    """What ``python -m apply errored`` prints: one line per errored table."""
    errored = [statuses[t] for t in sorted(statuses) if statuses[t].errored]
    if not errored:
        return "no errored table"
    return "\n".join(errored_line(s.table, s.parked, s.error or "") for s in errored)


def errored_line(table: str, parked: int, error: str, since_batch: int | None = None) -> str:
    """One errored table as ``python -m apply errored`` prints it, with the cure that fits
    its error; ``error`` is ``<class>: <message>``, as :func:`table_statuses` writes it."""
    since = "" if since_batch is None else f" since batch {since_batch}"
    cure = parked_cure(error.partition(":")[0], table)
    return f"{table}: {parked} records parked{since}: {error}; cure: {cure}"


def read_table_statuses(
    settings: KafkaSettings, timeout_s: float = 30.0
) -> dict[str, ApplyTableStatus]:
    """The newest apply status of every table on the control topic, read to its end.
    Only reads: a missing control topic is a :class:`~apply.errors.ConfigError`, and is
    not created."""
    topic = settings.control_topic
    errors = ConnectionErrors(SETTING)
    consumer = Consumer(
        client_conf(settings)
        | {
            "group.id": STATUS_GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        },
        error_cb=errors,
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if (
            metadata is None
            or not metadata.partitions
            or (metadata.error is not None and metadata.error.code() in _UNKNOWN_TOPIC)
        ):
            raise ConfigError(
                f"capture has not started yet (no control topic {topic}); check "
                "APPLY_KAFKA__CONTROL_TOPIC"
            )
        ends = {}
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            ends[partition] = int(high) if high > low else 0
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(ends)])
        return _read_to_end(consumer, topic, ends, time.monotonic() + timeout_s)
    except KafkaException as exc:
        consumer.poll(0)  # serves the error callback: a refused login says so
        errors.check()
        raise TransientError(f"cannot read the control topic {topic}: {exc}") from exc
    finally:
        consumer.close()


def _read_to_end(
    consumer: Consumer, topic: str, ends: dict[int, int], deadline: float
) -> dict[str, ApplyTableStatus]:
    statuses: dict[str, ApplyTableStatus] = {}
    at_end = {p for p, end in ends.items() if end == 0}
    while len(at_end) < len(ends):
        if time.monotonic() > deadline:
            raise TransientError(f"the control topic {topic} could not be read to its end in time")
        for message in consumer.consume(1000, timeout=0.1):
            error = message.error()
            partition = message.partition() or 0
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                    continue
                raise TransientError(f"control topic read failed: {error.str()}")
            if (message.offset() or 0) + 1 >= ends[partition]:
                at_end.add(partition)
            key, value = message.key(), message.value()
            if key is None or value is None:
                continue
            try:
                decoded = decode_control(key, value)
            except ControlMessageError as exc:
                raise ConfigError(str(exc)) from exc
            if isinstance(decoded, ApplyTableStatus):
                statuses[decoded.table] = decoded
    return statuses
