"""Operator commands: see each table's state, request a resync.

Both work on the control topic only (``python -m capture status`` / ``resync``), so they
run anywhere the brokers are reachable, with the capture service up or down. ``status``
only reads: it never creates the control topic (a missing one means capture never
started); ``resync`` writes, so it creates it.

A resync writes the ``pending`` state for the table. The capture service reads table
states when it starts, so the resync takes effect at its next start (restart it, or
let the request wait for a planned restart): the table is snapshotted again from
scratch, starting with a TRUNCATE record so the lake drops whatever it held, and then
streams. Restart-based on purpose: an errored table may have no codec left in the
running service (its Relation could not be mapped), and a fresh session gets every
Relation message again.
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import Producer

from capture.errors import ConfigError, TransientError
from capture.publish.control import ControlReader
from capture.publish.publisher import Topics, producer_conf
from capture.settings import CaptureSettings
from capture.source.setup import TableRef
from capture.stream.table_flow import now_micros
from schemas.control import TableState, TableStatus
from schemas.lsn import format_lsn


def table_statuses(settings: CaptureSettings) -> list[TableStatus]:
    """The last state of every table of the configured slot, by table name. Only reads:
    a missing control topic raises
    :class:`~capture.publish.control.ControlTopicMissingError` and is not created."""
    control = ControlReader(settings.kafka, None)
    try:
        state = control.load(settings.postgres.slot)
    finally:
        control.close()
    return [state.tables[t] for t in sorted(state.tables)]


def format_statuses(statuses: Sequence[TableStatus]) -> str:
    if not statuses:
        return "no table states recorded for this slot yet (has capture started?)"
    width = max(len(s.table) for s in statuses)
    lines = [f"{'table':<{width}}  {'state':<9}  snapshot_lsn  message"]
    for s in statuses:
        lsn = "-" if s.snapshot_lsn is None else format_lsn(s.snapshot_lsn)
        lines.append(f"{s.table:<{width}}  {s.state.value:<9}  {lsn:<12}  {s.message or ''}")
    return "\n".join(lines)


def request_resync(settings: CaptureSettings, tables: Sequence[str]) -> list[TableStatus]:
    """Mark ``tables`` pending, so the next start snapshots them again."""
    if not tables:
        raise ConfigError("name at least one schema-qualified table to resync")
    requests = [
        TableStatus(
            slot=settings.postgres.slot,
            table=TableRef.parse(t).qualified,
            state=TableState.PENDING,
            snapshot_lsn=None,
            message="resync requested",
            updated_at=now_micros(),
        )
        for t in tables
    ]
    Topics(settings.kafka).ensure(settings.kafka.control_topic, compacted=True)
    # The service's producer settings, partitioner included: a status key must land in
    # the partition the service writes it to, or the newest write would not win.
    producer = Producer(producer_conf(settings.kafka))
    failures: list[str] = []
    for request in requests:
        producer.produce(
            settings.kafka.control_topic,
            request.value(),
            request.key(),
            on_delivery=lambda err, _msg: failures.append(err.str()) if err else None,
        )
    if producer.flush(30) or failures:
        raise TransientError(f"resync request not written: {failures or 'timed out'}")
    return requests
