"""The replication loop: one attempt's streaming, from the slot to Kafka and back.

:class:`ReplicationLoop` reads frames from the replication connection (through the
compiled stream where it runs, :mod:`capture.stream.compiled_stream`), hands them to the
change stream, routes the records per table (:mod:`capture.stream.table_flow`), serves
the producer's delivery reports and the control topic, and confirms to the server what
the in-flight book allows (:mod:`capture.in_flight`).

The loop is single-threaded on purpose: the in-flight book is touched by delivery
reports (served inside ``producer.poll``), control-topic messages and the stream, and one
thread makes every update to it ordered without locks.

Loop invariants:

- Status updates go out at least every ``status_interval_s`` and at once when the server
  asks, also while reading is paused by backpressure, so the server never times us out.
- ``flush`` in a status update is always :attr:`ProgressBook.confirmable`, and never
  ahead of the slot checkpoint on the control topic (written first, write-ahead).
- On stop: no more reading, the producer is flushed, one last status update is sent.
- Metrics and health (:mod:`capture.metrics`, :mod:`runtime.telemetry`) are updated
  from this loop without slowing it: plain attribute writes per transaction, the rest
  once per status interval; the slot's retained WAL is read by
  :mod:`capture.source.wal_safety` on a connection and thread of its own, and a lost slot
  found there ends the attempt here with its resync procedure.
- With ``CAPTURE_STREAMING``, transactions in progress are encoded and spooled as their
  blocks come (:mod:`capture.stream.in_progress`) and replayed at their Stream Commit
  through the path an unstreamed transaction takes; the change stream knows the
  transaction's table versions from the commit until the replay's last frame is handled
  (:meth:`ReplicationLoop._replay_done`). While a replay is under way the socket is not
  read (the transactions after it stay behind it, in commit order) and the replay is
  paused at the in-flight bound like reading is. While any streamed transaction is
  open, a keepalive's ``wal_end`` is not confirmable (docs/streaming.md). The spools
  belong to this attempt: a new one starts with none, as the server streams every open
  transaction again from its start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psycopg

from capture.errors import TransientError
from capture.in_flight import ProgressBook
from capture.metrics import CaptureMetrics
from capture.publish.control import ControlReader
from capture.publish.publisher import ChangePublisher, Topics
from capture.publish.schema_registration import Framer
from capture.records import OutgoingRecord, SchemaRecord
from capture.rows.describe import describe_columns
from capture.rows.typemap import SESSION_SETTINGS
from capture.settings import CaptureSettings
from capture.snapshot.run import SnapshotRun
from capture.source.publication import read_filter
from capture.source.setup import (
    check_tables,
    ensure_publication,
    key_by_primary_key,
    resolve_tables,
)
from capture.source.wal_safety import WalWatch
from capture.stream import compiled_stream
from capture.stream.change_stream import (
    ChangeFailed,
    ChangeStream,
    Output,
    RelationChanged,
    RelationReceived,
    TransactionCommitted,
    TransactionStarted,
)
from capture.stream.compiled_stream import CompiledStream
from capture.stream.copy_data import PrimaryKeepalive, parse_copy_data
from capture.stream.in_progress import InProgressTransactions, StreamedReplay
from capture.stream.replication import Frame, ReplicationStream
from capture.stream.schema_change import resync_reason_after
from capture.stream.table_flow import TableFlow
from capture.stream.table_states import TableStates
from runtime.telemetry import Health
from schemas.control import (
    PublicationFilter,
    ServerIdentity,
    SnapshotResume,
    TableState,
    TableStatus,
)
from schemas.lsn import Lsn, format_lsn

if TYPE_CHECKING:
    from capture_native import SpoolReplay

log = logging.getLogger(__name__)
_READ_TIMEOUT_S = 0.1
_POLL_INTERVAL_S = 0.005
_BURST_FRAMES = 128
"""Frames handled back to back before the loop's periodic checks run."""
_REPLAY_BURST = 512
"""Changes of a streamed transaction's replay handled back to back (the in-flight bound
is checked after each)."""
_COMPILED_BUDGET = 512
"""Frames the compiled stream takes in one call: the loop's periodic checks (reports,
control messages, status updates) run between calls, and the in-flight bound is
checked per call, so it may be passed by up to this many records."""


class ReplicationLoop:
    """One attempt's stream: built on a source that is set up and a book that starts at
    the slot's confirmed LSN; :meth:`run` streams until ``stop`` is set, then stops
    gracefully. The replication connection is opened here and closed by :meth:`run`."""

    def __init__(
        self,
        settings: CaptureSettings,
        *,
        catalog: psycopg.Connection[tuple[object, ...]],
        dsn: str,
        password: str | None,
        book: ProgressBook,
        topics: Topics,
        control: ControlReader,
        states: TableStates,
        statuses: list[TableStatus],
        watch: WalWatch,
        framer: Framer,
        metrics: CaptureMetrics,
        health: Health,
        stop: threading.Event,
        stop_at: Lsn | None,
        server: ServerIdentity | None = None,
    ) -> None:
        """``statuses``: table statuses to publish before streaming; ``stop_at``: set
        ``stop`` once every transaction ending at or before this LSN is received, and no
        snapshot or held change is left (catch-up runs and benchmarks); ``server``: the
        server the attempt checked, which the replication connection must reach and
        every slot checkpoint records (:mod:`capture.source.server_identity`)."""
        self._settings = settings
        self._catalog = catalog
        self._dsn = dsn
        self._password = password
        self._book = book
        self._control = control
        self._states = states
        self._watch = watch
        self._framer = framer
        self._metrics = metrics
        self._position = position = metrics.position
        self._stop = stop
        self._stop_at = stop_at
        self._slot = settings.postgres.slot
        start = book.confirmable
        self._publisher = publisher = ChangePublisher(
            settings.kafka,
            book,
            topics,
            start=start,
            metrics=metrics,
            compiled=settings.compiled_producer,
            server=server,
        )
        for status in statuses:
            publisher.publish_status(status)
        self._changes = changes = ChangeStream(
            lambda relation: describe_columns(catalog, relation),
            settings.kafka.topic_prefix,
            settings.tombstones,
            rekey=lambda relation: key_by_primary_key(catalog, relation),
            decoded=metrics.decoded,
            framer=framer,
            compiled_rows=settings.compiled_rows,
            report_relations=True,
        )
        self._flow = TableFlow(
            states,
            book=book,
            publisher=publisher,
            changes=changes,
            start_run=self._start_run,
            spool_dir=settings.spool_dir,
        )
        # A row filter or column list changed while capture was stopped: found now, not
        # only at the table's next Relation (a table nobody writes to sends none).
        for table in self._flow.to_compare():
            self._flow.publication_seen(table, self._published(table), start)
        self._in_progress = (
            InProgressTransactions(
                settings.streaming_spool_max_bytes, settings.spool_dir, self._changes
            )
            if settings.streaming
            else None
        )
        """The streamed transactions of this attempt (None without streaming); a spool
        file is made only once a block arrives."""
        self._streamed_counted = 0
        """Of :attr:`InProgressTransactions.streamed`, what the metrics counted."""
        self._replay: StreamedReplay | None = None
        """A committed streamed transaction being replayed; the socket waits meanwhile."""
        self._spool: SpoolReplay | None = None
        """The compiled stream's reader of the replay's spool, once it began reading."""
        self._stream = ReplicationStream.start(
            dsn,
            password=password,
            slot=settings.postgres.slot,
            publication=settings.postgres.publication,
            start_lsn=start,
            settings=SESSION_SETTINGS,
            silence_timeout_s=settings.postgres.silence_timeout_s,
            server=server,
            streaming=settings.streaming,
        )
        health.connected()
        position.stream_started = time.monotonic()
        position.last_keepalive = None
        self._progress = _ProgressLine(metrics, settings.log.progress_interval_s)
        self._commit_lsn = start
        """The commit LSN of the transaction being received (from its Begin)."""
        self._reply = False
        """The server asked for a status update in this round of the loop."""
        self._compiled = self._open_compiled_stream()
        log.info(
            "streamed changes go %s",
            "through the compiled stream"
            if self._compiled is not None
            else "through the Python loop",
        )
        if self._compiled is not None:
            self._compiled.stop_at(stop_at)
            self._compiled.on_commit = self._compiled_committed

    def run(self) -> None:
        """Stream until ``stop`` is set; then deliver everything produced and confirm it."""
        settings = self._settings
        stop, book, flow = self._stop, self._book, self._flow
        publisher, control, compiled = self._publisher, self._control, self._compiled
        last_status = 0.0
        last_refresh = time.monotonic()
        try:
            last_poll = 0.0
            while not stop.is_set():
                self._reply = False
                paused = self._over_bound()
                # Snapshot rows or held changes waiting: poll the socket, don't wait on it.
                timeout = 0.0 if flow.ready else _READ_TIMEOUT_S
                if paused:
                    publisher.poll(_READ_TIMEOUT_S)
                    idle = True
                elif self._replay is not None:
                    idle = self._replay_burst(self._replay)
                elif compiled is not None:
                    idle = self._compiled_burst(compiled, timeout)
                else:
                    idle = self._python_burst(timeout)
                now = time.monotonic()
                # Delivery reports and control messages are served every few milliseconds,
                # not per frame: at full speed a frame is a few microseconds of work, and
                # polling both clients per frame cost more than decoding it.
                if idle or now - last_poll >= _POLL_INTERVAL_S:
                    if compiled is not None:
                        compiled.count()
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
                    self._add_new_tables()
                    last_refresh = now
                if self._reply or now - last_status >= settings.status_interval_s:
                    self._confirm()
                    last_status = now
                    self._observe()
                    self._progress.maybe_log(now)
            self._stop_gracefully()
        finally:
            self._close_streamed()
            flow.close()
            self._stream.close()

    def _stop_gracefully(self) -> None:
        """Everything produced is delivered, then one last status update."""
        book, publisher = self._book, self._publisher
        if self._compiled is not None:
            self._compiled.count()
        self._flow.close()
        publisher.flush()
        self._control.poll(book)
        publisher.checkpoint(self._slot, book.confirmable)
        publisher.flush()
        self._confirm()
        log.info(
            "stopped at confirmed %s",
            format_lsn(min(book.confirmable, publisher.durable_checkpoint)),
        )
        in_progress = self._in_progress
        if in_progress is not None and in_progress.streamed:
            log.info(
                "transactions streamed in progress: %d, spools held at most %d bytes; "
                "%d bytes spooled by the compiled stream",
                in_progress.streamed,
                in_progress.peak_bytes,
                in_progress.written_bytes,
            )

    def _close_streamed(self) -> None:
        """Release the replay under way and every spool: nothing of them outlives the
        attempt."""
        self._release_replay()
        self._changes.replayed_codecs = {}
        if self._in_progress is not None:
            self._in_progress.close()
            self._observe_streamed()

    def _confirm(self) -> None:
        """A standby status update with the LSN the book and the checkpoint allow."""
        publisher, book = self._publisher, self._book
        # Write-ahead: the checkpoint reaches Kafka before the slot may pass it.
        publisher.checkpoint(self._slot, book.confirmable)
        publisher.poll(0)
        confirmed = min(book.confirmable, publisher.durable_checkpoint)
        self._stream.send_status(confirmed)
        self._position.confirmed_lsn = confirmed

    def _over_bound(self) -> bool:
        """Whether the in-flight bound is reached, so reading pauses (backpressure)."""
        book, settings = self._book, self._settings
        return (
            book.in_flight_records >= settings.max_in_flight_records
            or book.in_flight_bytes >= settings.max_in_flight_bytes
        )

    def _stop_when_reached(self, lsn: Lsn) -> None:
        """Set ``stop`` once ``lsn``, which the server has sent everything up to, reaches
        ``stop_at`` and no snapshot or held change is left to publish."""
        if self._stop_at is not None and lsn >= self._stop_at and not self._flow.busy:
            self._stop.set()

    # -- frames --------------------------------------------------------------------------

    def _python_burst(self, timeout: float) -> bool:
        """One burst of the Python loop; True when nothing came within ``timeout``.

        Frames already received are handled in a burst, the loop's periodic checks once
        per burst: per frame they cost a good part of what handling a small change does.
        A burst is short (a few milliseconds), ends as soon as nothing is buffered, and
        stops where the loop would, or where a streamed transaction's replay begins."""
        stream = self._stream
        frame = stream.read(timeout)
        idle = frame is None
        burst = _BURST_FRAMES
        while frame is not None:
            self._handle(frame)
            burst -= 1
            if burst == 0 or self._stop.is_set() or self._over_bound() or self._replay is not None:
                break
            frame = stream.read_buffered()
        return idle

    def _handle(self, frame: Frame) -> None:
        """One frame through the Python path."""
        if self._compiled is not None:
            # The compiled stream may have begun the open transaction.
            open_transaction = self._changes.transaction()
            if open_transaction is not None:
                self._commit_lsn = open_transaction[0]
        if isinstance(frame, PrimaryKeepalive):
            self._keepalive(frame)
            return
        in_progress = self._in_progress
        if in_progress is not None and in_progress.takes(frame.payload):
            # A stream block's message, or a streamed transaction's end: spooled or
            # dropped; a commit's replay is drained by run(), under the in-flight bound.
            replay = in_progress.handle(frame.payload, frame.wal_start)
            if replay is not None:
                self._replay = replay
            return
        self._route(self._changes.handle_frame(frame.payload, frame.wal_start))

    def _replay_burst(self, replay: StreamedReplay) -> bool:
        """A burst of a committed streamed transaction's replay, up to the in-flight
        bound: through the compiled stream where it runs, else through the path of an
        unstreamed transaction's frames in Python. Never idle."""
        if self._compiled is not None:
            self._compiled_replay_burst(self._compiled, replay)
            return False
        changes = self._changes
        for _ in range(_REPLAY_BURST):
            frame = next(replay, None)
            if frame is None:
                self._replay_done()
                break
            payload, change_lsn = frame
            self._route(changes.handle_frame(payload, change_lsn))
            if self._stop.is_set() or self._over_bound():
                break
        return False

    def _compiled_replay_burst(self, compiled: CompiledStream, replay: StreamedReplay) -> None:
        """The replay through the compiled stream, which reads the spool itself
        (:meth:`CompiledStream.take_spool`), up to its budget of changes a call, the
        stop and the in-flight bound checked between calls; a message it hands back goes
        through :meth:`_handle`, at most a burst of those, as in :meth:`_compiled_burst`."""
        spool = self._spool
        if spool is None:
            spool = self._spool = compiled.open_spool(replay)
        python_frames = 0
        while not (self._stop.is_set() or self._over_bound()):
            read = compiled.take_spool(spool, _COMPILED_BUDGET)
            if read.stopped == compiled_stream.Stop.FRAME and read.frame is not None:
                compiled.to_python()
                self._handle(parse_copy_data(read.frame))
                compiled.from_python()
                python_frames += 1
                if python_frames >= _BURST_FRAMES:
                    break
            elif read.stopped == compiled_stream.Stop.FULL:
                # The producer's queue is full: its reports make room.
                self._publisher.poll(_READ_TIMEOUT_S)
                break
            elif read.stopped == compiled_stream.Stop.EMPTY:
                self._replay_done()
                break
            else:
                break  # the budget is taken: the loop's periodic checks run

    def _replay_done(self) -> None:
        """The replay ended: its spool is released and the socket is read again. The
        book began and committed the replayed transaction, so the compiled stream goes on
        from there (the next transaction's book id)."""
        self._release_replay()
        self._changes.replayed_codecs = {}
        if self._compiled is not None:
            self._compiled.from_python()

    def _release_replay(self) -> None:
        """The replay's spool file and the compiled stream's reader of it, closed."""
        replay, self._replay = self._replay, None
        if replay is not None:
            replay.close()
        spool, self._spool = self._spool, None
        if spool is not None:
            spool.close()

    def _route(self, outputs: Iterator[Output]) -> None:
        """The change stream's outputs for one frame: records to their tables' flow, the
        transaction's bounds to the book."""
        book, flow = self._book, self._flow
        for out in outputs:
            if isinstance(out, OutgoingRecord):
                flow.route(out, self._commit_lsn)
            elif isinstance(out, SchemaRecord):
                self._publisher.publish_schema(out)
            elif isinstance(out, TransactionStarted):
                self._commit_lsn = out.commit_lsn
                book.begin(out.commit_lsn)
            elif isinstance(out, ChangeFailed):
                flow.route_failure(out, self._commit_lsn)
            elif isinstance(out, RelationChanged):
                reason = resync_reason_after(self._catalog, out.previous, out.current)
                if reason is not None:
                    flow.resync(out.table, reason, self._commit_lsn)
            elif isinstance(out, RelationReceived):
                flow.publication_seen(out.table, self._published(out.table), self._commit_lsn)
            elif isinstance(out, TransactionCommitted):
                book.commit(out.end_lsn)
                self._position.received_lsn = out.end_lsn
                self._stop_when_reached(out.end_lsn)

    def _published(self, table: str) -> PublicationFilter:
        """The publication's row filter and column list for ``table``, as the catalog has
        them now (:mod:`capture.source.publication`)."""
        try:
            return read_filter(self._catalog, self._settings.postgres.publication, table)
        except psycopg.OperationalError as exc:
            raise TransientError(f"cannot read publication of {table}: {exc}") from exc

    def _keepalive(self, frame: PrimaryKeepalive) -> None:
        position = self._position
        self._reply = self._reply or frame.reply_requested
        position.last_keepalive = time.monotonic()
        if self._in_progress is not None and self._in_progress.open:
            # A streamed transaction is open: its first change lies before wal_end, and
            # its commit is still to come (docs/streaming.md, "The in-flight book").
            return
        self._book.keepalive(frame.wal_end)
        if not self._book.in_transaction:
            # Between transactions the server has decoded this far, so nothing before it
            # is left to receive.
            position.received_lsn = max(position.received_lsn, frame.wal_end)
            self._stop_when_reached(frame.wal_end)

    # -- the compiled stream -------------------------------------------------------------

    def _open_compiled_stream(self) -> CompiledStream | None:
        """The compiled stream, where it can run
        (:mod:`capture.stream.compiled_stream`)."""
        settings = self._settings
        producer = self._publisher.compiled_producer
        connection = self._stream.connection_pointer
        if not (
            settings.compiled_stream
            and settings.compiled_rows
            and producer is not None
            and connection is not None
            and compiled_stream.libpq() is not None
        ):
            return None
        return CompiledStream(
            producer,
            connection,
            self._book,
            self._changes,
            self._states,
            self._publisher.ensure_topic,
            self._metrics,
            self._in_progress,
        )

    def _compiled_committed(self, end_lsn: Lsn) -> None:
        self._position.received_lsn = end_lsn
        self._stop_when_reached(end_lsn)

    def _compiled_burst(self, compiled: CompiledStream, timeout: float) -> bool:
        """One burst through the compiled stream: the frames libpq holds (waiting up to
        ``timeout`` for some if it holds none), the compiled stream's up to its budget,
        the others handled by :meth:`_handle`, at most a burst of those. True when
        nothing came."""
        stream = self._stream
        waited = False
        took = False
        python_frames = 0
        while True:
            read = compiled.read(_COMPILED_BUDGET)
            status, raw = read.stopped, read.frame
            if read.taken or raw is not None:
                took = True
                stream.heard()
            if status == compiled_stream.Stop.FRAME and raw is not None:
                compiled.to_python()
                self._handle(parse_copy_data(raw))
                compiled.from_python()
                python_frames += 1
                if (
                    python_frames >= _BURST_FRAMES
                    or self._stop.is_set()
                    or self._over_bound()
                    or self._replay is not None
                ):
                    return False
            elif status == compiled_stream.Stop.EMPTY:
                if took or waited:
                    return not took
                waited = True
                if not stream.wait(timeout):
                    return True
            elif status == compiled_stream.Stop.FULL:
                # The producer's queue is full: its reports make room.
                self._publisher.poll(_READ_TIMEOUT_S)
                return False
            elif status == compiled_stream.Stop.LIMIT:
                return False
            else:
                raise stream.broken(ended=status == compiled_stream.Stop.ENDED)

    # -- tables --------------------------------------------------------------------------

    def _start_run(
        self, tables: list[str], truncate: list[str], resume: dict[str, tuple[Lsn, SnapshotResume]]
    ) -> SnapshotRun:
        """A snapshot run of ``tables``, started (:meth:`TableFlow.step` asks for it)."""
        settings = self._settings
        run = SnapshotRun(
            dsn=self._dsn,
            password=self._password,
            slot=self._slot,
            tables=tables,
            truncate=truncate,
            describe=describe_columns,
            topic_prefix=settings.kafka.topic_prefix,
            metrics=self._metrics,
            progress_interval_s=settings.log.progress_interval_s,
            framer=self._framer,
            workers=settings.snapshot_workers,
            chunk_rows=settings.snapshot_chunk_rows,
            resume=resume,
            compiled_rows=settings.compiled_rows,
            publication=settings.postgres.publication,
        )
        run.start()
        return run

    def _observe(self) -> None:
        """Once per status interval: table states to the metrics, and a lost slot the WAL
        watch found."""
        states = self._states
        self._metrics.table_states(
            {table: state for state in TableState for table in states.in_state(state)}
        )
        self._observe_streamed()
        if self._watch.failure is not None:
            raise self._watch.failure

    def _observe_streamed(self) -> None:
        """The streamed transactions' counts and spools to the metrics (all zero once the
        attempt's spools are released)."""
        in_progress, metrics = self._in_progress, self._metrics
        if in_progress is None:
            return
        streamed = in_progress.streamed
        if streamed > self._streamed_counted:
            metrics.streamed_transactions.inc(streamed - self._streamed_counted)
            self._streamed_counted = streamed
        metrics.streamed_open.set(in_progress.open_transactions)
        metrics.streamed_spool_bytes.set(in_progress.spooled_bytes)

    def _add_new_tables(self) -> None:
        """Tables created in a captured schema since the start join the capture: held
        and pinned first, then added to the publication, then snapshotted."""
        postgres, catalog, flow = self._settings.postgres, self._catalog, self._flow
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
