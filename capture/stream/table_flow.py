"""Where each decoded record goes, and the snapshot runs that decide it: the capture
loop's per-table side.

:class:`TableFlow` owns the table states (:mod:`capture.stream.table_states`), the held-back
changes (:mod:`capture.snapshot.held_changes`), one pin per table that is not streaming yet
(:meth:`capture.in_flight.ProgressBook.pin`) and the snapshot run in progress
(:mod:`capture.snapshot.run`). The capture loop calls :meth:`TableFlow.route` for every
record it decodes and :meth:`TableFlow.step` between frames; both run in the loop's
thread, so the book and the producer are only ever touched from there.

Per key, records reach the topic in position order: a table's changes are held from
the moment it is pending, its snapshot rows (position ``C - 1``) are produced before any
of them, and held changes go out oldest first, the ones at or below ``C - 1`` dropped
(the snapshot holds them). The table's pin keeps the slot from being confirmed past a
change that is held, so a restart streams every held change again.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from pathlib import Path

from capture.errors import TableError
from capture.in_flight import ProgressBook
from capture.publish.publisher import ChangePublisher
from capture.records import OutgoingRecord, SchemaRecord
from capture.snapshot.held_changes import HeldChanges, HeldFailure
from capture.snapshot.run import (
    ChunkPublished,
    RunFailed,
    SnapshotItem,
    SnapshotRecords,
    SnapshotRun,
    SnapshotTaken,
    TableCopied,
    TableFailed,
)
from capture.stream.change_stream import ChangeFailed, ChangeStream
from capture.stream.schema_change import publication_change_reason
from capture.stream.table_states import Route, TableStates
from schemas.control import PublicationFilter, SnapshotResume, TableState, TableStatus
from schemas.lsn import Lsn

log = logging.getLogger(__name__)

StartRun = Callable[[list[str], list[str], dict[str, tuple[Lsn, SnapshotResume]]], SnapshotRun]
"""Starts a snapshot run over the tables, truncating the second list's first and resuming
the third's (:meth:`TableStates.resume_point`)."""
_ITEMS_PER_STEP = 8
_RELEASE_PER_STEP = 2000


class TableFlow:
    def __init__(
        self,
        states: TableStates,
        *,
        book: ProgressBook,
        publisher: ChangePublisher,
        changes: ChangeStream,
        start_run: StartRun,
        spool_dir: Path | None,
    ) -> None:
        self._states = states
        self._book = book
        self._publisher = publisher
        self._changes = changes
        self._start_run = start_run
        self._spool_dir = spool_dir
        self._held: dict[str, HeldChanges] = {}
        self._pins: dict[str, int] = {}
        self._published_schemas: set[bytes] = set()
        self._run: SnapshotRun | None = None
        self._recheck: dict[str, tuple[Lsn, str]] = {}
        """Resyncs asked for while a run held the table pending: (commit LSN, reason)."""
        self._published_recheck: dict[str, tuple[Lsn, PublicationFilter]] = {}
        """Publication entries read while a run held the table pending: (commit LSN,
        entry), compared with the run's once its consistent point is known."""
        for table in states.in_state(TableState.PENDING):
            self._hold(table)
        for table, message in states.errors().items():
            changes.error_table(table, TableError(table, message))
        # A change that cannot be encoded may be one a snapshot already holds (the stream
        # can lag behind the snapshot), so :meth:`route_failure` decides, not the stream.
        changes.defer_errors = True

    # -- the hot path ----------------------------------------------------------------------

    def route(self, record: OutgoingRecord, commit_lsn: Lsn) -> None:
        """Publish, hold back or drop one streamed record of the open transaction."""
        table = record.table
        if table not in self._states:
            self._discover(table)
        route = self._states.route(table, commit_lsn)
        if route is Route.PUBLISH:
            self._publisher.publish(record)
        elif route is Route.HOLD:
            self._held[table].hold(commit_lsn, record)

    def route_failure(self, failed: ChangeFailed, commit_lsn: Lsn) -> None:
        """A change that could not be encoded errors its table only if it is newer than
        the table's snapshot (for a held table: once the snapshot position is known)."""
        if failed.table not in self._states:
            self._discover(failed.table)
        route = self._states.route(failed.table, commit_lsn)
        if route is Route.HOLD:
            self._held[failed.table].hold_failure(
                commit_lsn, HeldFailure(failed.table, str(failed.error))
            )
        elif route is Route.PUBLISH:
            self._errored(failed.table, str(failed.error))

    def add_tables(self, tables: list[str]) -> None:
        """Tables to capture from now on, e.g. created since the start in a captured
        schema. Call before they join the publication, so their first change is held."""
        for table in tables:
            if table not in self._states:
                self._discover(table)

    def resync(self, table: str, reason: str, commit_lsn: Lsn) -> None:
        """Snapshot ``table`` again while everything keeps streaming, because of a change
        of the open transaction (committing at ``commit_lsn``) that filled its rows
        without a logical change (:mod:`capture.stream.schema_change`): from now on its changes
        are held and pin the book, the next run snapshots it starting with a TRUNCATE,
        then the held changes follow, as for a table added while running."""
        state = self._states.state(table)
        if state is TableState.ERRORED:
            return  # a resync of its own is needed anyway
        if state is TableState.PENDING:
            if self._run is not None and table in self._run.tables:
                # The run's consistent point is not known yet: decided when it is.
                self._recheck[table] = (commit_lsn, reason)
            return  # not snapshotted yet: the snapshot will read the new catalog
        snapshot_lsn = self._states.snapshot_lsn(table)
        if (
            state is not TableState.STREAMING
            and snapshot_lsn is not None
            and commit_lsn <= snapshot_lsn
        ):
            return  # the running snapshot sees this transaction, so the change too
        log.warning("table %s is resynced while running: %s", table, reason)
        self._publish_status(self._states.resync(table, reason))
        self._hold(table)

    def publication_seen(self, table: str, published: PublicationFilter, commit_lsn: Lsn) -> None:
        """The publication lets ``published`` through of ``table`` now (read at a Relation
        of the open transaction, committing at ``commit_lsn``, or at the start). A table
        whose rows were taken under another row filter or column list is resynced
        (:func:`~capture.stream.schema_change.publication_change_reason`); a pending table
        whose snapshot was to resume under the old one starts it again from scratch; a
        streaming table whose entry was not known yet records this one (one snapshotted
        by an earlier version, which copied every row and column, is resynced if the
        entry has a filter or a list)."""
        states = self._states
        if table not in states or states.state(table) is TableState.ERRORED:
            return
        state, recorded = states.state(table), states.published(table)
        if state is TableState.PENDING and self._run is not None and table in self._run.tables:
            # The run read the entry at a consistent point not known yet: decided then.
            self._published_recheck[table] = (commit_lsn, published)
            return
        resumes = state is TableState.PENDING and states.resume_point(table) is not None
        if recorded is None:
            if state is not TableState.STREAMING and not resumes:
                return  # its coming snapshot records the entry it copies under
            if states.snapshot_lsn(table) is None or published == PublicationFilter():
                if state is TableState.STREAMING:
                    self._publish_status(states.published_seen(table, published))
                return
            # Snapshotted (in part) by a version that copied every row and column.
            recorded = PublicationFilter()
        reason = publication_change_reason(recorded, published)
        if reason is None:
            return
        if state is TableState.PENDING:
            if resumes:
                log.warning("table %s is snapshotted again from scratch: %s", table, reason)
                self._publish_status(states.restart_snapshot(table, reason))
            return  # not snapshotted yet: its snapshot will read the new entry
        self.resync(table, reason, commit_lsn)

    def known(self, table: str) -> bool:
        return table in self._states

    def to_compare(self) -> list[str]:
        """The tables whose publication entry matters before their next snapshot: the
        streaming ones, and the pending ones whose snapshot resumes (:meth:`publication_seen`)."""
        states = self._states
        pending = states.in_state(TableState.PENDING)
        resumed = [t for t in pending if states.resume_point(t) is not None]
        return states.in_state(TableState.STREAMING) + resumed

    def errored(self, table: str, message: str) -> None:
        """A table found unfit for capture (e.g. no replica identity)."""
        if table not in self._states:
            self._states.discover(table)
        self._errored(table, message)

    # -- between frames --------------------------------------------------------------------

    def step(self) -> None:
        """A bounded slice of snapshot and catch-up work; call when not paused."""
        self._report_stream_errors()
        if not self._held and self._run is None:
            return  # every table streams or is errored: nothing to snapshot or release
        if self._run is None:
            pending = self._states.in_state(TableState.PENDING)
            if pending:
                truncate = [t for t in pending if self._states.needs_truncate(t)]
                resume = {
                    t: point for t in pending if (point := self._states.resume_point(t)) is not None
                }
                self._run = self._start_run(pending, truncate, resume)
        if self._run is not None:
            for _ in range(_ITEMS_PER_STEP):
                try:
                    item = self._run.items.get_nowait()
                except queue.Empty:
                    break
                self._handle(item)
                if self._run is None:
                    break
        for table in self._states.in_state(TableState.CATCH_UP):
            self._catch_up(table)

    @property
    def ready(self) -> bool:
        """Whether :meth:`step` has work it can do right now (snapshot rows waiting, or
        held changes to release): the loop should not wait for WAL meanwhile."""
        # Checked once per frame: answered without scanning the tables in the usual case
        # (nothing held back, so nothing pending or catching up).
        if self._run is not None and not self._run.items.empty():
            return True
        if not self._held:
            return False
        return any(t in self._held for t in self._states.in_state(TableState.CATCH_UP))

    @property
    def busy(self) -> bool:
        """Whether snapshot or catch-up work is left."""
        return self._run is not None or bool(self._held)

    def close(self) -> None:
        if self._run is not None:
            self._run.cancel()
            self._run = None
        for spool in self._held.values():
            spool.close()
        self._held.clear()

    # -- internals -------------------------------------------------------------------------

    def _handle(self, item: SnapshotItem) -> None:
        states = self._states
        if isinstance(item, SnapshotRecords):
            if states.state(item.table) is not TableState.SNAPSHOT:
                return  # the table errored meanwhile: its snapshot no longer matters
            for schema in item.schemas:
                if schema.key not in self._published_schemas:
                    self._publish_schema(schema)
            self._publisher.publish_batch(
                item.topic,
                item.table,
                item.headers,
                item.keys,
                item.values,
                pin=self._pins[item.table],
            )
        elif isinstance(item, SnapshotTaken):
            for table in item.tables:
                if states.state(table) is TableState.PENDING:
                    self._publish_status(
                        states.snapshot_started(
                            table, item.snapshot_lsn, item.publications.get(table)
                        )
                    )
            for table in item.tables:
                recheck = self._recheck.pop(table, None)
                if recheck is not None and states.state(table) is TableState.SNAPSHOT:
                    self.resync(table, recheck[1], recheck[0])
                seen = self._published_recheck.pop(table, None)
                if seen is not None and states.state(table) is TableState.SNAPSHOT:
                    self.publication_seen(table, seen[1], seen[0])
            # Durable before the first snapshot record: a table with no status never had
            # one produced, which is what lets its first snapshot skip the TRUNCATE.
            self._publisher.flush()
        elif isinstance(item, ChunkPublished):
            if states.state(item.table) is TableState.SNAPSHOT:
                # Durable only after the chunks' records: a restart skips what it names.
                self._publisher.flush()
                self._publish_status(states.chunk_published(item.table, item.resume))
                # And before any record of a later chunk: then only the chunk it names
                # can be in Kafka in part, and the resumed rows sort after all of it.
                self._publisher.flush()
        elif isinstance(item, TableCopied):
            if states.state(item.table) is TableState.SNAPSHOT:
                # Catch-up may only be persisted once every snapshot row is in Kafka:
                # a restart treats the table as snapshotted from then on.
                self._publisher.flush()
                self._publish_status(states.snapshot_done(item.table))
                log.info("snapshot of %s: %d rows published", item.table, item.rows)
        elif isinstance(item, TableFailed):
            self._errored(item.error.table, str(item.error))
        elif isinstance(item, RunFailed):
            raise item.error
        else:
            self._run = None
            self._recheck.clear()
            self._published_recheck.clear()

    def _catch_up(self, table: str) -> None:
        spool = self._held[table]
        snapshot_lsn = self._states.snapshot_lsn(table)
        pin = self._pins[table]
        for commit_lsn, record in spool.release(_RELEASE_PER_STEP):
            if snapshot_lsn is not None and commit_lsn <= snapshot_lsn:
                continue  # the snapshot holds its effect
            if isinstance(record, HeldFailure):
                self._errored(table, record.message)
                return
            self._publisher.publish(record, pin=pin)
        if not spool:
            spool.close()
            del self._held[table]
            self._book.seal(self._pins.pop(table))
            self._publish_status(self._states.caught_up(table))
            log.info("table %s is streaming", table)

    def _discover(self, table: str) -> None:
        """A table first met in the stream (e.g. created in a captured schema)."""
        self._publish_status(self._states.discover(table))
        if self._states.state(table) is TableState.PENDING:
            self._hold(table)

    def _hold(self, table: str) -> None:
        if table not in self._held:
            self._held[table] = HeldChanges(self._spool_dir)
            self._pins[table] = self._book.pin()

    def _errored(self, table: str, message: str) -> None:
        if self._states.state(table) is TableState.ERRORED:
            return
        status = self._states.errored(table, message)
        log.error("table errored: %s", status.message)
        self._publish_status(status)
        # Durable at once: from here on the table's changes are skipped and the slot moves
        # past them, so a restart must find the table errored, never streaming again.
        self._publisher.flush()
        self._changes.error_table(table, TableError(table, status.message or message))
        spool = self._held.pop(table, None)
        if spool is not None:
            spool.close()
        pin = self._pins.pop(table, None)
        if pin is not None:
            self._book.unpin(pin)

    def _report_stream_errors(self) -> None:
        for table, error in list(self._changes.errored.items()):
            if table not in self._states:
                self._states.discover(table)  # errored before its first record
            if self._states.state(table) is not TableState.ERRORED:
                self._errored(table, str(error))

    def _publish_status(self, status: TableStatus) -> None:
        self._publisher.publish_status(status)

    def _publish_schema(self, schema: SchemaRecord) -> None:
        self._publisher.publish_schema(schema)
        self._published_schemas.add(schema.key)


def now_micros() -> int:
    return time.time_ns() // 1000
