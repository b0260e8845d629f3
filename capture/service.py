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
- Metrics and health (:mod:`capture.metrics`, :mod:`runtime.telemetry`) are updated
  from this loop without slowing it: plain attribute writes per transaction, the rest
  once per status interval; the slot's retained WAL is read by :mod:`capture.source.wal_safety`
  on a connection and thread of its own, and a lost slot found there ends the attempt
  here with its resync procedure.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

import psycopg
from pydantic import SecretStr

from capture.errors import ConfigError, PipelineError, TransientError
from capture.in_flight import ProgressBook
from capture.metrics import CaptureMetrics
from capture.pgoutput import Relation
from capture.publish.control import ControlReader, ControlState
from capture.publish.publisher import ChangePublisher, Topics
from capture.publish.schema_registration import Framer, framer_for
from capture.records import OutgoingRecord, SchemaRecord
from capture.rows.type_catalog import load_array_dimensions, load_types
from capture.rows.typemap import SESSION_SETTINGS, ColumnMapping, libpq_options, map_column
from capture.settings import CaptureSettings
from capture.snapshot.run import SnapshotRun
from capture.source.connection import with_dead_peer_detection
from capture.source.credentials import connection_error, source_password
from capture.source.setup import (
    SlotState,
    check_server,
    check_tables,
    ensure_publication,
    ensure_slot,
    find_slot,
    key_by_primary_key,
    resolve_tables,
)
from capture.source.wal_safety import (
    WalWatch,
    check,
    read_keep_size,
    read_slot_wal,
    warn_if_unlimited,
)
from capture.stream import lane as stream_lane
from capture.stream.change_stream import (
    ChangeFailed,
    ChangeStream,
    RelationChanged,
    TransactionCommitted,
    TransactionStarted,
)
from capture.stream.copy_data import PrimaryKeepalive, parse_copy_data
from capture.stream.lane import StreamLane
from capture.stream.replication import Frame, ReplicationStream
from capture.stream.schema_change import added_columns, read_added_columns, resync_reason
from capture.stream.table_flow import TableFlow, now_micros
from capture.stream.table_states import TableStates
from runtime.telemetry import Health
from schemas.control import SnapshotResume, TableState, TableStatus
from schemas.lsn import Lsn, format_lsn

log = logging.getLogger(__name__)
_READ_TIMEOUT_S = 0.1
_POLL_INTERVAL_S = 0.005
_BURST_FRAMES = 128
"""Frames handled back to back before the loop's periodic checks run."""
_LANE_BUDGET = 512
"""Frames the stream lane takes in one call: the loop's periodic checks (reports,
control messages, status updates) run between calls, and the in-flight bound is
checked per call, so it may be passed by up to this many records."""


def check_slot_history(
    slot: SlotState | None, state: ControlState, slot_name: str, topic_prefix: str
) -> None:
    """Refuse to stream when the slot's position cannot be trusted.

    - The slot is missing but the lake has applied records of our topics: it was dropped
      (and would be recreated at the current WAL position), so every change since the
      lake's last applied transaction would be skipped.
    - The slot is ahead of capture's last checkpoint: someone advanced it, and WAL in
      between may never have reached Kafka.
    """
    applied = sorted(state.applied_topics(topic_prefix))
    if slot is None and applied:
        raise ConfigError(
            f"replication slot {slot_name} does not exist, but the control topic shows "
            f"applied changes for {', '.join(applied)}: the slot was dropped, and a new one "
            "would silently skip every change made since. Resync: stop apply, delete those "
            "Delta tables and their checkpoints, delete the change and control topics, then "
            "start capture again with CAPTURE_SNAPSHOT_MODE=initial, which snapshots every "
            "table anew (docs/capture.md)"
        )
    if (
        slot is not None
        and state.checkpoint is not None
        and slot.confirmed_flush > state.checkpoint
    ):
        raise ConfigError(
            f"replication slot {slot_name} is at {format_lsn(slot.confirmed_flush)}, past the "
            f"{format_lsn(state.checkpoint)} capture last confirmed: someone else advanced it "
            "and changes in between may be lost. Resync as for a dropped slot (docs/capture.md)"
        )


def describe_columns(
    conn: psycopg.Connection[tuple[object, ...]], relation: Relation
) -> Sequence[ColumnMapping]:
    """The contract type and parser of each column of ``relation``, from the catalog."""
    types = load_types(conn, [c.type_oid for c in relation.columns])
    dims = load_array_dimensions(conn, relation.oid)
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


def _resync_reason(
    catalog: psycopg.Connection[tuple[object, ...]], changed: RelationChanged
) -> str | None:
    """Why a table whose Relation changed must be snapshotted again, if it must
    (:mod:`capture.stream.schema_change`); the catalog is read only when columns were added."""
    added = added_columns(changed.previous, changed.current)
    if not added:
        return None
    return resync_reason(
        changed.previous, changed.current, read_added_columns(catalog, changed.current, added)
    )


class CaptureService:
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
        self._errored_tables: set[str] = set()

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
            if isinstance(exc, TransientError):
                self.health.transient_failure(str(exc))
            raise
        finally:
            self.metrics.book = None

    @functools.cached_property
    def _source_password(self) -> SecretStr | None:
        """Read once, at the first attempt: a missing file stops the service there."""
        return source_password(self._settings.postgres)

    def _attempt(self) -> None:
        settings = self._settings
        secret = self._source_password
        password = secret.get_secret_value() if secret is not None else None
        dsn = with_dead_peer_detection(settings.postgres.dsn)
        try:
            catalog = psycopg.connect(
                dsn,
                password=password,
                autocommit=True,
                options=libpq_options(SESSION_SETTINGS),
            )
        except psycopg.OperationalError as exc:
            raise connection_error(exc) from exc
        with catalog:
            check_server(catalog)
            if not self._keep_size_checked:
                keep_size = read_keep_size(catalog)
                self.metrics.keep_size.set(keep_size)
                warn_if_unlimited(keep_size)
                self._keep_size_checked = True
            tables = resolve_tables(catalog, settings.postgres.tables, settings.postgres.schemas)
            problems = check_tables(catalog, tables)
            for table, problem in problems.items():
                log.error("table not captured: %s", problem, extra={"table": table.qualified})
            capturable = [t for t in tables if t not in problems]
            if not capturable:
                raise ConfigError("no table can be captured; see the errors above")
            ensure_publication(catalog, settings.postgres.publication, capturable)
            topics = Topics(settings.kafka)
            control = ControlReader(settings.kafka, topics)
            try:
                state = control.load(settings.postgres.slot)
                check_slot_history(
                    find_slot(catalog, settings.postgres.slot),
                    state,
                    settings.postgres.slot,
                    settings.kafka.topic_prefix,
                )
                slot = ensure_slot(catalog, settings.postgres.slot)
                # A lost slot fails START_REPLICATION with a server error that looks
                # transient; said here, with the resync, it is not retried forever.
                check(
                    read_slot_wal(catalog, slot.name),
                    slot=slot.name,
                    warn_retained_bytes=settings.wal.warn_retained_bytes,
                    metrics=self.metrics,
                )
                states = TableStates(
                    settings.postgres.slot,
                    state.tables,
                    snapshot_new=settings.snapshot_mode == "initial",
                    clock=now_micros,
                )
                statuses = states.add(t.qualified for t in capturable)
                for table, problem in problems.items():
                    if table.qualified not in states or (
                        states.state(table.qualified) is not TableState.ERRORED
                    ):
                        statuses.append(states.errored(table.qualified, str(problem)))
                log.info(
                    "streaming slot %s from %s (%d tables; %d to snapshot)",
                    slot.name,
                    format_lsn(slot.confirmed_flush),
                    len(capturable),
                    len(states.in_state(TableState.PENDING)),
                )
                book = ProgressBook(
                    slot.confirmed_flush,
                    pins_paced_by_lake=self._settings.snapshot_pace == "lake",
                )
                for (topic, partition), next_offset in state.applied.items():
                    book.applied(topic, partition, next_offset)
                self.metrics.book = book
                self.metrics.position.confirmed_lsn = slot.confirmed_flush
                self.metrics.position.received_lsn = max(
                    self.metrics.position.received_lsn, slot.confirmed_flush
                )
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
                    metrics=self.metrics,
                )
                watch.start()
                try:
                    self._stream(
                        catalog,
                        dsn,
                        password,
                        book=book,
                        topics=topics,
                        control=control,
                        states=states,
                        statuses=statuses,
                        watch=watch,
                    )
                finally:
                    watch.close()
            finally:
                control.close()

    def _stream(
        self,
        catalog: psycopg.Connection[tuple[object, ...]],
        dsn: str,
        password: str | None,
        *,
        book: ProgressBook,
        topics: Topics,
        control: ControlReader,
        states: TableStates,
        statuses: list[TableStatus],
        watch: WalWatch,
    ) -> None:
        settings = self._settings
        metrics = self.metrics
        position = metrics.position
        start = book.confirmable
        publisher = ChangePublisher(
            settings.kafka,
            book,
            topics,
            start=start,
            metrics=metrics,
            compiled=settings.compiled_producer,
        )
        slot_name = settings.postgres.slot
        for status in statuses:
            publisher.publish_status(status)

        def confirm(reply_requested: bool = False) -> None:
            # Write-ahead: the checkpoint reaches Kafka before the slot may pass it.
            publisher.checkpoint(slot_name, book.confirmable)
            publisher.poll(0)
            confirmed = min(book.confirmable, publisher.durable_checkpoint)
            stream.send_status(confirmed, reply_requested=reply_requested)
            position.confirmed_lsn = confirmed

        def start_run(
            tables: list[str], truncate: list[str], resume: dict[str, tuple[Lsn, SnapshotResume]]
        ) -> SnapshotRun:
            run = SnapshotRun(
                dsn=dsn,
                password=password,
                slot=slot_name,
                tables=tables,
                truncate=truncate,
                describe=describe_columns,
                topic_prefix=settings.kafka.topic_prefix,
                metrics=metrics,
                progress_interval_s=settings.log.progress_interval_s,
                framer=self._framer,
                workers=settings.snapshot_workers,
                chunk_rows=settings.snapshot_chunk_rows,
                resume=resume,
                compiled_rows=settings.compiled_rows,
            )
            run.start()
            return run

        changes = ChangeStream(
            lambda relation: describe_columns(catalog, relation),
            settings.kafka.topic_prefix,
            settings.tombstones,
            rekey=lambda relation: key_by_primary_key(catalog, relation),
            decoded=metrics.decoded,
            framer=self._framer,
            compiled_rows=settings.compiled_rows,
        )
        flow = TableFlow(
            states,
            book=book,
            publisher=publisher,
            changes=changes,
            start_run=start_run,
            spool_dir=settings.spool_dir,
        )
        stream = ReplicationStream.start(
            dsn,
            password=password,
            slot=settings.postgres.slot,
            publication=settings.postgres.publication,
            start_lsn=start,
            settings=SESSION_SETTINGS,
            silence_timeout_s=settings.postgres.silence_timeout_s,
        )
        self.health.connected()
        position.stream_started = time.monotonic()
        position.last_keepalive = None
        progress = _ProgressLine(metrics, settings.log.progress_interval_s)
        last_status = 0.0
        last_refresh = time.monotonic()
        commit_lsn = start
        lane = self._lane(publisher, book, changes, states, stream)
        log.info(
            "streamed changes go %s",
            "through the compiled stream lane" if lane is not None else "through the Python loop",
        )
        if lane is not None:
            lane.stop_at(self._stop_at)

            def lane_committed(end_lsn: Lsn) -> None:
                position.received_lsn = end_lsn
                if self._stop_at is not None and end_lsn >= self._stop_at and not flow.busy:
                    self._stop.set()

            lane.on_commit = lane_committed
        reply = False

        def handle(frame: Frame) -> None:
            nonlocal reply, commit_lsn
            if lane is not None:
                # The lane may have begun the open transaction.
                open_transaction = changes.transaction()
                if open_transaction is not None:
                    commit_lsn = open_transaction[0]
            if isinstance(frame, PrimaryKeepalive):
                book.keepalive(frame.wal_end)
                reply = reply or frame.reply_requested
                position.last_keepalive = time.monotonic()
                if not book.in_transaction and frame.wal_end > position.received_lsn:
                    # Between transactions the server has decoded this far.
                    position.received_lsn = frame.wal_end
                if (
                    self._stop_at is not None
                    and frame.wal_end >= self._stop_at
                    and not book.in_transaction
                    and not flow.busy
                ):
                    # Between transactions the server has decoded past the target, so
                    # nothing before it is left to receive.
                    self._stop.set()
                return
            for out in changes.handle_frame(frame.payload, frame.wal_start):
                if isinstance(out, OutgoingRecord):
                    flow.route(out, commit_lsn)
                elif isinstance(out, SchemaRecord):
                    publisher.publish_schema(out)
                elif isinstance(out, TransactionStarted):
                    commit_lsn = out.commit_lsn
                    book.begin(out.commit_lsn)
                elif isinstance(out, ChangeFailed):
                    flow.route_failure(out, commit_lsn)
                elif isinstance(out, RelationChanged):
                    reason = _resync_reason(catalog, out)
                    if reason is not None:
                        flow.resync(out.table, reason, commit_lsn)
                elif isinstance(out, TransactionCommitted):
                    book.commit(out.end_lsn)
                    position.received_lsn = out.end_lsn
                    if self._stop_at is not None and out.end_lsn >= self._stop_at and not flow.busy:
                        self._stop.set()

        def over_bound() -> bool:
            return (
                book.in_flight_records >= settings.max_in_flight_records
                or book.in_flight_bytes >= settings.max_in_flight_bytes
            )

        try:
            last_poll = 0.0
            while not self._stop.is_set():
                reply = False
                paused = over_bound()
                # Snapshot rows or held changes waiting: poll the socket, don't wait on it.
                timeout = 0.0 if flow.ready else _READ_TIMEOUT_S
                if paused:
                    publisher.poll(_READ_TIMEOUT_S)
                    idle = True
                elif lane is not None:
                    idle = self._lane_burst(lane, stream, publisher, timeout, handle, over_bound)
                else:
                    frame = stream.read(timeout)
                    idle = frame is None
                    # Frames already received are handled in a burst, the loop's periodic
                    # checks below once per burst: per frame they cost a good part of what
                    # handling a small change does. A burst is short (a few milliseconds),
                    # ends as soon as nothing is buffered, and stops where the loop would.
                    burst = _BURST_FRAMES
                    while frame is not None:
                        handle(frame)
                        burst -= 1
                        if burst == 0 or self._stop.is_set() or over_bound():
                            break
                        frame = stream.read_buffered()
                now = time.monotonic()
                # Delivery reports and control messages are served every few milliseconds,
                # not per frame: at full speed a frame is a few microseconds of work, and
                # polling both clients per frame cost more than decoding it.
                if idle or now - last_poll >= _POLL_INTERVAL_S:
                    if lane is not None:
                        lane.count()
                    publisher.poll(0)
                    control.poll(book)
                    if not paused:
                        flow.step()
                    last_poll = now
                if (
                    settings.postgres.schemas
                    and settings.table_refresh_s > 0
                    and now - last_refresh >= settings.table_refresh_s
                ):
                    self._add_new_tables(catalog, flow)
                    last_refresh = now
                if reply or now - last_status >= settings.status_interval_s:
                    confirm()
                    last_status = now
                    self._observe(states, watch)
                    progress.maybe_log(now)
            # Graceful stop: everything produced is delivered, then one last update.
            if lane is not None:
                lane.count()
            flow.close()
            publisher.flush()
            control.poll(book)
            publisher.checkpoint(slot_name, book.confirmable)
            publisher.flush()
            confirm()
            log.info(
                "stopped at confirmed %s",
                format_lsn(min(book.confirmable, publisher.durable_checkpoint)),
            )
        finally:
            flow.close()
            stream.close()

    def _lane(
        self,
        publisher: ChangePublisher,
        book: ProgressBook,
        changes: ChangeStream,
        states: TableStates,
        stream: ReplicationStream,
    ) -> StreamLane | None:
        """The stream lane, where it can run (:mod:`capture.stream.lane`)."""
        settings = self._settings
        producer = publisher.compiled_producer
        connection = stream.connection_pointer
        if not (
            settings.compiled_stream
            and settings.compiled_rows
            and producer is not None
            and connection is not None
            and stream_lane.libpq() is not None
        ):
            return None
        return StreamLane(
            producer,
            connection,
            book,
            changes,
            states,
            publisher.ensure_topic,
            self.metrics,
        )

    def _lane_burst(  # noqa: PLR0917 -- the loop's parts a burst uses
        self,
        lane: StreamLane,
        stream: ReplicationStream,
        publisher: ChangePublisher,
        timeout: float,
        handle: Callable[[Frame], None],
        over_bound: Callable[[], bool],
    ) -> bool:
        """One burst through the stream lane: the frames libpq holds (waiting up to
        ``timeout`` for some if it holds none), the lane's up to its budget, the others
        handled by ``handle``, at most a burst of those. True when nothing came."""
        waited = False
        took = False
        python_frames = 0
        while True:
            status, raw, taken = lane.read(_LANE_BUDGET)
            if taken or raw is not None:
                took = True
                stream.heard()
            if status == stream_lane.FRAME and raw is not None:
                lane.to_python()
                handle(parse_copy_data(raw))
                lane.from_python()
                python_frames += 1
                if python_frames >= _BURST_FRAMES or self._stop.is_set() or over_bound():
                    return False
            elif status == stream_lane.EMPTY:
                if took or waited:
                    return not took
                waited = True
                if not stream.wait(timeout):
                    return True
            elif status == stream_lane.FULL:
                # The producer's queue is full: its reports make room.
                publisher.poll(_READ_TIMEOUT_S)
                return False
            elif status == stream_lane.LIMIT:
                return False
            else:
                raise stream.broken(ended=status == stream_lane.ENDED)

    def _observe(self, states: TableStates, watch: WalWatch) -> None:
        """Once per status interval: table states to the metrics (a table newly errored
        counts as an error of its kind), and a lost slot the WAL watch found."""
        current = {table: state for state in TableState for table in states.in_state(state)}
        self.metrics.table_states(current)
        errored = {t for t, s in current.items() if s is TableState.ERRORED}
        for _ in errored - self._errored_tables:
            self.metrics.errors.labels("TableError").inc()
        self._errored_tables = errored
        if watch.failure is not None:
            raise watch.failure

    def _add_new_tables(
        self, catalog: psycopg.Connection[tuple[object, ...]], flow: TableFlow
    ) -> None:
        """Tables created in a captured schema since the start join the capture: held
        and pinned first, then added to the publication, then snapshotted."""
        postgres = self._settings.postgres
        try:
            found = resolve_tables(catalog, [], postgres.schemas)
            new = [t for t in found if not flow.known(t.qualified)]
            if not new:
                return
            problems = check_tables(catalog, new)
        except psycopg.OperationalError as exc:
            raise TransientError(f"cannot look for new tables: {exc}") from exc
        for table, problem in problems.items():
            flow.errored(table.qualified, str(problem))
        capturable = [t for t in new if t not in problems]
        if capturable:
            log.info("new tables: %s", ", ".join(t.qualified for t in capturable))
            flow.add_tables([t.qualified for t in capturable])
            ensure_publication(catalog, postgres.publication, capturable)


class _ProgressLine:
    """A log line every ``interval_s``: rates since the last line, LSNs and the lag
    between what capture received and what the lake holds (confirmed)."""

    def __init__(self, metrics: CaptureMetrics, interval_s: float) -> None:
        self._metrics = metrics
        self._interval_s = interval_s
        self._last = time.monotonic()
        self._decoded = metrics.decoded.total()
        self._produced = metrics.produced.total()

    def maybe_log(self, now: float) -> None:
        elapsed = now - self._last
        if elapsed < self._interval_s:
            return
        metrics = self._metrics
        decoded, produced = metrics.decoded.total(), metrics.produced.total()
        position = metrics.position
        book = metrics.book
        log.info(
            "progress: %.0f changes/s decoded, %.0f records/s produced, received %s, "
            "confirmed %s, lag %d bytes, in flight %d records (%d bytes)",
            (decoded - self._decoded) / elapsed,
            (produced - self._produced) / elapsed,
            format_lsn(Lsn(position.received_lsn)),
            format_lsn(Lsn(position.confirmed_lsn)),
            max(0, position.received_lsn - position.confirmed_lsn),
            0 if book is None else book.in_flight_records,
            0 if book is None else book.in_flight_bytes,
            extra={"lsn": format_lsn(Lsn(position.confirmed_lsn))},
        )
        self._last, self._decoded, self._produced = now, decoded, produced
