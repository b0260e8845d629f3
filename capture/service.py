"""The capture service: wires source setup, the replication stream, the change stream,
the publisher and the control reader into one loop.

The loop is single-threaded on purpose: the in-flight book is touched by delivery
reports (served inside ``producer.poll``), control-topic messages and the stream, and one
thread makes every update to it ordered without locks.

Loop invariants:
- Status updates go out at least every ``status_interval_s`` and at once when the server
  asks, also while reading is paused by backpressure, so the server never times us out.
- ``flush`` in a status update is always :attr:`ProgressBook.confirmable`.
- On stop: no more reading, the producer is flushed, one last status update is sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import psycopg

from capture.change_stream import (
    ChangeStream,
    OutgoingRecord,
    SchemaRecord,
    TransactionCommitted,
    TransactionStarted,
)
from capture.errors import ConfigError, TransientError
from capture.pgoutput import Relation, decode
from capture.progress import ProgressBook
from capture.publisher import ChangePublisher, ControlReader, Topics
from capture.replication import ReplicationStream
from capture.replication_protocol import PrimaryKeepalive
from capture.settings import CaptureSettings
from capture.source import (
    check_server,
    check_tables,
    ensure_publication,
    ensure_slot,
    resolve_tables,
)
from capture.type_catalog import load_array_dimensions, load_types
from capture.typemap import SESSION_SETTINGS, ColumnMapping, libpq_options, map_column
from schemas.lsn import Lsn, format_lsn

log = logging.getLogger(__name__)
_READ_TIMEOUT_S = 0.1


class CaptureService:
    def __init__(
        self, settings: CaptureSettings, stop: threading.Event, *, stop_at: Lsn | None = None
    ) -> None:
        """``stop_at``: stop by itself once every transaction ending at or before this LSN
        is published and delivered (catch-up runs and benchmarks); None streams forever."""
        self._settings = settings
        self._stop = stop
        self._stop_at = stop_at

    def run(self) -> None:
        """One attempt: set up, stream until stopped; raises on failure."""
        settings = self._settings
        password = (
            settings.postgres.password.get_secret_value() if settings.postgres.password else None
        )
        try:
            catalog = psycopg.connect(
                settings.postgres.dsn,
                password=password,
                autocommit=True,
                options=libpq_options(SESSION_SETTINGS),
            )
        except psycopg.OperationalError as exc:
            raise TransientError(f"cannot connect to PostgreSQL: {exc}") from exc
        with catalog:
            check_server(catalog)
            tables = resolve_tables(catalog, settings.postgres.tables, settings.postgres.schemas)
            problems = check_tables(catalog, tables)
            for table, problem in problems.items():
                log.error("table not captured: %s", problem, extra={"table": table.qualified})
            capturable = [t for t in tables if t not in problems]
            if not capturable:
                raise ConfigError("no table can be captured; see the errors above")
            ensure_publication(catalog, settings.postgres.publication, capturable)
            slot = ensure_slot(catalog, settings.postgres.slot)
            log.info(
                "streaming slot %s from %s (%d tables)",
                slot.name,
                format_lsn(slot.confirmed_flush),
                len(capturable),
            )
            self._stream(catalog, password, slot.confirmed_flush)

    def _stream(
        self, catalog: psycopg.Connection[tuple[object, ...]], password: str | None, start: Lsn
    ) -> None:
        settings = self._settings
        book = ProgressBook(start)
        topics = Topics(settings.kafka)
        publisher = ChangePublisher(settings.kafka, book, topics)
        control = ControlReader(settings.kafka, book, topics)

        def describe(relation: Relation) -> Sequence[ColumnMapping]:
            oids = [c.type_oid for c in relation.columns]
            types = load_types(catalog, oids)
            dims = load_array_dimensions(catalog, relation.oid)
            table = f"{relation.namespace}.{relation.name}"
            return [
                map_column(
                    c.type_oid,
                    c.type_modifier,
                    types,
                    table=table,
                    column=c.name,
                    dimensions=dims.get(c.name, 1),
                )
                for c in relation.columns
            ]

        changes = ChangeStream(describe, settings.kafka.topic_prefix, settings.tombstones)
        stream = ReplicationStream.start(
            settings.postgres.dsn,
            password=password,
            slot=settings.postgres.slot,
            publication=settings.postgres.publication,
            start_lsn=start,
            settings=SESSION_SETTINGS,
        )
        last_status = 0.0
        reported_errors: set[str] = set()
        try:
            while not self._stop.is_set():
                publisher.poll(0)
                control.poll()
                reply = False
                paused = (
                    book.in_flight_records >= settings.max_in_flight_records
                    or book.in_flight_bytes >= settings.max_in_flight_bytes
                )
                frame = None if paused else stream.read(_READ_TIMEOUT_S)
                if paused:
                    publisher.poll(_READ_TIMEOUT_S)
                if isinstance(frame, PrimaryKeepalive):
                    book.keepalive(frame.wal_end)
                    reply = frame.reply_requested
                    if (
                        self._stop_at is not None
                        and frame.wal_end >= self._stop_at
                        and not book.in_transaction
                    ):
                        # Between transactions the server has decoded past the target, so
                        # nothing before it is left to receive.
                        self._stop.set()
                elif frame is not None:
                    message = decode(frame.payload)
                    for out in changes.handle(message, frame.wal_start):
                        if isinstance(out, OutgoingRecord):
                            publisher.publish(out)
                        elif isinstance(out, SchemaRecord):
                            publisher.publish_schema(out)
                        elif isinstance(out, TransactionStarted):
                            book.begin(out.commit_lsn)
                        elif isinstance(out, TransactionCommitted):
                            book.commit(out.end_lsn)
                            if self._stop_at is not None and out.end_lsn >= self._stop_at:
                                self._stop.set()
                    for table in changes.errored.keys() - reported_errors:
                        log.error("table errored: %s", changes.errored[table])
                        reported_errors.add(table)
                now = time.monotonic()
                if reply or now - last_status >= settings.status_interval_s:
                    stream.send_status(book.confirmable)
                    last_status = now
            # Graceful stop: everything produced is delivered, then one last update.
            publisher.flush()
            control.poll()
            stream.send_status(book.confirmable)
            log.info("stopped at confirmed %s", format_lsn(book.confirmable))
        finally:
            control.close()
            stream.close()
