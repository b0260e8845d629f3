"""The capture service: one attempt wires the source (:mod:`capture.source`), the control
topic (:mod:`capture.publish.control`) and the in-flight book (:mod:`capture.in_flight`)
to the replication loop (:mod:`capture.stream.loop`), and classifies what ends it.

An attempt sets up the source, reads the control topic, adopts the slot, then streams
until stopped or failed; :mod:`capture.__main__` retries a transient failure with
backoff (:mod:`runtime.retry`), each retry a fresh attempt from the slot's confirmed LSN.
The order is what makes a start safe: the slot's position is trusted only once the
control topic is read and the server is identified (:func:`capture.source.setup.adopt_slot`,
:mod:`capture.source.server_identity`), and the book starts where the slot is, with the
applied offsets the control topic holds.

With ``CAPTURE_STREAMING`` on, a streamed transaction whose spool would pass
``CAPTURE_STREAMING_SPOOL_MAX_BYTES`` does not stop the service: the attempt ends as a
transient failure and the service goes on without streaming (:meth:`CaptureService.run`),
so the server spills that transaction as it did before streaming existed and sends it
whole at its commit. Nothing of it was published (a streamed transaction is published
at its commit only), and the slot was not confirmed past it, so the next attempt
decodes it again from its first change. Streaming resumes at the service's next start.
"""

from __future__ import annotations

import functools
import logging
import threading

import psycopg
from pydantic import SecretStr

from capture.errors import PipelineError, TransientError
from capture.in_flight import ProgressBook
from capture.metrics import CaptureMetrics
from capture.publish.control import ControlReader, ControlState
from capture.publish.publisher import Topics
from capture.publish.schema_registration import Framer, framer_for
from capture.settings import CaptureSettings
from capture.source.connection import with_dead_peer_detection
from capture.source.credentials import source_password
from capture.source.server_identity import read_source_server
from capture.source.setup import (
    SlotState,
    adopt_slot,
    capturable_tables,
    check_server,
    connect_catalog,
)
from capture.source.wal_safety import WalWatch, report_keep_size
from capture.stream.loop import ReplicationLoop
from capture.stream.streamed_transactions import StreamedTransactionTooLargeError
from capture.stream.table_flow import now_micros
from capture.stream.table_states import TableStates
from runtime.telemetry import Health
from schemas.control import TableState
from schemas.lsn import Lsn, format_lsn

log = logging.getLogger(__name__)


class CaptureService:
    """The capture service across its attempts: what outlives one (metrics, health, the
    source password, the record framing) and the classification of a failed one."""

    def __init__(
        self,
        settings: CaptureSettings,
        stop: threading.Event,
        *,
        stop_at: Lsn | None = None,
        metrics: CaptureMetrics | None = None,
        health: Health | None = None,
    ) -> None:
        """``stop_at``: stop by itself once every transaction ending at or before this LSN
        is published and delivered (catch-up runs and benchmarks); None streams forever.
        ``metrics``/``health``: what the endpoint serves (a fresh, unserved pair when
        not given)."""
        self._settings = settings
        self._stop = stop
        self._stop_at = stop_at
        self.metrics = metrics or CaptureMetrics()
        self.health = health or Health(settings.metrics.not_ready_after_s)
        self.metrics.retained_warn.set(settings.wal.warn_retained_bytes)
        self._attempts = 0
        self._keep_size_checked = False

    @functools.cached_property
    def _framer(self) -> Framer:
        """Record headers (CAPTURE_KAFKA__ENCODING); built at the first attempt, where a
        registry password file that cannot be read is a ConfigError."""
        return framer_for(self._settings.kafka)

    def run(self) -> None:
        """One attempt: set up, stream until stopped; raises on failure."""
        if self._attempts:
            self.metrics.reconnects.inc()
        self._attempts += 1
        try:
            try:
                self._attempt()
            except psycopg.OperationalError as exc:
                # A connection lost mid-attempt (a query on the catalog connection while
                # the server shuts down, a reset): transient like a failed connect.
                raise TransientError(f"the connection to the source failed: {exc}") from exc
        except PipelineError as exc:
            self.metrics.errors.labels(type(exc).__name__).inc()
            if isinstance(exc, StreamedTransactionTooLargeError) and self._settings.streaming:
                raise self._stop_streaming(exc) from exc
            if isinstance(exc, TransientError):
                self.health.transient_failure(str(exc))
            raise
        finally:
            self.metrics.book = None

    def _stop_streaming(self, exc: StreamedTransactionTooLargeError) -> TransientError:
        """Go on without streaming (the module's text says why that is safe): the
        failure that ends this attempt, for the retry."""
        self._settings = self._settings.model_copy(update={"streaming": False})
        self.metrics.streaming.set(0)
        failure = TransientError(
            f"streamed transaction {exc.xid} outgrew the spools' limit, "
            f"CAPTURE_STREAMING_SPOOL_MAX_BYTES ({exc.max_bytes} bytes; it held {exc.held}, "
            f"all open streamed transactions {exc.total}): capture goes on without "
            "streaming, so the server spills that transaction and sends it whole at its "
            "commit; streaming resumes when capture restarts. To stream such transactions, "
            "raise CAPTURE_STREAMING_SPOOL_MAX_BYTES and make room for it in CAPTURE_SPOOL_DIR"
        )
        # The retry logs it, as every failure that ends an attempt.
        self.health.transient_failure(str(failure))
        return failure

    @functools.cached_property
    def _source_password(self) -> SecretStr | None:
        """Read once, at the first attempt: a missing file stops the service there."""
        return source_password(self._settings.postgres)

    def _attempt(self) -> None:
        """Set up the source, read the control topic, adopt the slot, stream."""
        settings, metrics = self._settings, self.metrics
        metrics.streaming.set(1 if settings.streaming else 0)
        postgres = settings.postgres
        secret = self._source_password
        password = secret.get_secret_value() if secret is not None else None
        dsn = with_dead_peer_detection(postgres.dsn)
        with connect_catalog(dsn, password) as catalog:
            check_server(catalog)
            if not self._keep_size_checked:
                report_keep_size(catalog, metrics)
                self._keep_size_checked = True
            tables = capturable_tables(catalog, postgres)
            topics = Topics(settings.kafka)
            control = ControlReader(settings.kafka, topics)
            try:
                state = control.load(postgres.slot)
                server = read_source_server(dsn, password, recorded=state.server)
                slot = adopt_slot(
                    catalog,
                    postgres.slot,
                    server=server,
                    recorded=state.server,
                    position=state.newest_position(settings.kafka.topic_prefix),
                    checkpoint=state.checkpoint,
                    applied_topics=state.applied_topics(settings.kafka.topic_prefix),
                    streamed_tables=state.streamed_tables(),
                    warn_retained_bytes=settings.wal.warn_retained_bytes,
                    metrics=metrics,
                )
                states = TableStates(
                    postgres.slot,
                    state.tables,
                    snapshot_new=settings.snapshot_mode == "initial",
                    clock=now_micros,
                )
                statuses = states.at_start(
                    [t.qualified for t in tables.capturable],
                    {t.qualified: str(problem) for t, problem in tables.problems.items()},
                )
                log.info(
                    "streaming slot %s from %s on cluster %d, timeline %d (%d tables; "
                    "%d to snapshot)",
                    slot.name,
                    format_lsn(slot.confirmed_flush),
                    server.identity.system_identifier,
                    server.identity.timeline,
                    len(tables.capturable),
                    len(states.in_state(TableState.PENDING)),
                )
                book = self._book(slot, state)
                watch = WalWatch(
                    # Bounded: a dead network must not hold the attempt's end (close joins).
                    lambda: psycopg.connect(
                        dsn,
                        password=password,
                        autocommit=True,
                        connect_timeout=10,
                    ),
                    slot=slot.name,
                    interval_s=settings.wal.check_interval_s,
                    warn_retained_bytes=settings.wal.warn_retained_bytes,
                    metrics=metrics,
                )
                watch.start()
                try:
                    ReplicationLoop(
                        settings,
                        catalog=catalog,
                        dsn=dsn,
                        password=password,
                        book=book,
                        topics=topics,
                        control=control,
                        states=states,
                        statuses=statuses,
                        watch=watch,
                        framer=self._framer,
                        metrics=metrics,
                        health=self.health,
                        stop=self._stop,
                        stop_at=self._stop_at,
                        server=server.identity,
                    ).run()
                finally:
                    watch.close()
            finally:
                control.close()

    def _book(self, slot: SlotState, state: ControlState) -> ProgressBook:
        """The attempt's in-flight book, starting at the slot's confirmed LSN with the
        applied offsets the control topic holds; the metrics show it from now on."""
        book = ProgressBook(
            slot.confirmed_flush,
            pins_paced_by_lake=self._settings.snapshot_pace == "lake",
        )
        for (topic, partition), next_offset in state.applied.items():
            book.applied(topic, partition, next_offset)
        position = self.metrics.position
        self.metrics.book = book
        position.confirmed_lsn = slot.confirmed_flush
        position.received_lsn = max(position.received_lsn, slot.confirmed_flush)
        return book
