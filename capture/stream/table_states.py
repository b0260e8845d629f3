"""The state of every captured table, and what it means for its streamed changes: pure.

States (:class:`~schemas.control.TableState`) and what moves a table between them:

- ``pending``: known, not snapshotted. New tables start here (``snapshot_mode=initial``),
  ``python -m capture resync`` puts a table back here, and so does a schema change that
  filled existing rows without a logical change (:meth:`TableStates.resync`, online). A
  table found pending at start, or mid-snapshot before its first chunk was in Kafka, is
  snapshotted again from scratch.
- ``snapshot``: a snapshot run copies the table at a consistent point ``C`` of a fresh
  exported snapshot (:mod:`capture.snapshot.run`); its rows are published at position
  ``snapshot_lsn = C - 1``. Each chunk published in full moves its ``resume`` point
  (:meth:`TableStates.chunk_published`); a table found mid-snapshot at start with one
  is pending again but **resumes** there: see below.
- ``catch_up``: every snapshot row is delivered to Kafka; the changes held back during
  the snapshot are being published, oldest first.
- ``streaming``: every change is published as it is decoded.
- ``errored``: not published until an operator fixes the cause and requests a resync.

What happens to a streamed change of a table (:meth:`TableStates.route`):

- ``errored`` -> skipped (the change stream does not even encode it);
- commit LSN ``<= snapshot_lsn`` -> dropped, in every state: the snapshot holds its effect
  (the exported snapshot sees exactly the transactions that commit before ``C``);
- ``pending``, ``snapshot``, ``catch_up`` -> held back, so no change of a key ever reaches
  the topic before that key's snapshot row (which would then overwrite it with older
  data);
- ``streaming`` -> published.

Why ``C - 1``: a transaction whose commit record starts exactly at ``C`` is not in the
snapshot, so its changes (positions ``(C, ordinal)``) must sort after every snapshot row,
and nothing at or below ``C - 1`` is left to stream once the snapshot is taken.

Resuming: the exported snapshot of ``C`` died with the capture, so the chunks left are
read at a new run's point ``C2 > C``, but published at the old position ``C - 1``
(ordinals after those already published), and the held changes are released from
``C - 1`` on as if the snapshot had been at ``C``. A key then gets, in position order:
its row as of ``C`` or ``C2`` (or both, for the chunk cut short), and every change
committed after ``C``. The changes between ``C`` and ``C2`` are already in a row read
at ``C2``; each is a whole row image or a delete (an unchanged TOASTed column keeps
what the row holds, which is newer), so replaying them over it passes through older
states and ends where the source is. The lake is exact once the table streams, as after
any snapshot (docs/capture.md, "Resuming a snapshot").

Statuses are persisted on the control topic (:class:`~schemas.control.TableStatus`) by
the service; this module only decides and returns them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from capture.errors import with_resync_cure
from schemas.control import PublicationFilter, SnapshotResume, TableState, TableStatus
from schemas.lsn import Lsn


class Route(enum.Enum):
    PUBLISH = "publish"
    HOLD = "hold"
    DROP = "drop"
    SKIP = "skip"


_HOLDING = frozenset({TableState.PENDING, TableState.SNAPSHOT, TableState.CATCH_UP})
_RESYNCABLE = frozenset({TableState.SNAPSHOT, TableState.CATCH_UP, TableState.STREAMING})


@dataclass(frozen=True, slots=True)
class _Table:
    state: TableState
    snapshot_lsn: Lsn | None = None
    message: str | None = None
    fresh: bool = False
    """Never snapshotted under this slot: no record of it can be in Kafka yet."""
    resume: SnapshotResume | None = None
    """Pending or in ``snapshot``: where its snapshot goes on (``snapshot_lsn`` is then
    the position its rows keep)."""
    published: PublicationFilter | None = None
    """The publication's row filter and column list its rows were taken under (from its
    snapshot on); None when not known."""


class TableStates:
    """The tables of one slot and their states; every transition returns the status to
    persist."""

    __slots__ = ("_clock", "_slot", "_snapshot_new", "_tables", "version")

    def __init__(
        self,
        slot: str,
        persisted: Mapping[str, TableStatus],
        *,
        snapshot_new: bool,
        clock: Callable[[], int],
    ) -> None:
        """``persisted``: the statuses the control topic holds for ``slot``; ``clock``:
        microseconds since the epoch, for ``updated_at``."""
        self._slot = slot
        self._snapshot_new = snapshot_new
        self._clock = clock
        self._tables: dict[str, _Table] = {}
        self.version = 0
        """Bumped by every transition: the compiled stream re-arms when it moves."""

        for table, status in persisted.items():
            if status.state in (TableState.STREAMING, TableState.CATCH_UP):
                # The snapshot is in Kafka; held-back changes were never confirmed, so the
                # slot streams them again.
                self._tables[table] = _Table(
                    TableState.STREAMING, status.snapshot_lsn, published=status.publication
                )
            elif status.state is TableState.ERRORED:
                self._tables[table] = _Table(TableState.ERRORED, None, status.message)
            elif (
                status.state is TableState.SNAPSHOT
                and status.resume is not None
                and status.snapshot_lsn is not None
            ):
                # Chunks of it are in Kafka: the next run reads the rest.
                self._tables[table] = _Table(
                    TableState.PENDING,
                    status.snapshot_lsn,
                    status.message,
                    resume=status.resume,
                    published=status.publication,
                )
            else:
                # A snapshot cut short before its first chunk is taken again from scratch.
                self._tables[table] = _Table(TableState.PENDING)

    # -- membership ----------------------------------------------------------------------

    def add(self, tables: Iterable[str]) -> list[TableStatus]:
        """Tables captured from now on; returns the statuses of the new ones."""
        return [self.discover(t) for t in tables if t not in self._tables]

    def at_start(self, captured: Iterable[str], problems: Mapping[str, str]) -> list[TableStatus]:
        """The statuses to publish when an attempt starts: every captured table not known
        yet, and every table that cannot be captured (``problems``, table -> why), made
        errored unless it already is."""
        statuses = self.add(captured)
        for table, problem in problems.items():
            if table not in self._tables or self.state(table) is not TableState.ERRORED:
                statuses.append(self.errored(table, problem))
        return statuses

    def discover(self, table: str) -> TableStatus:
        """A table seen for the first time (configured, or first met in the stream)."""
        state = TableState.PENDING if self._snapshot_new else TableState.STREAMING
        return self._set(table, _Table(state, fresh=True))

    def __contains__(self, table: object) -> bool:
        return table in self._tables

    # -- transitions ---------------------------------------------------------------------

    def snapshot_started(
        self, table: str, snapshot_lsn: Lsn, published: PublicationFilter | None = None
    ) -> TableStatus:
        """The run's position is ``snapshot_lsn``, and ``published`` the row filter and
        column list it copies the table under; a resumed table keeps its position, and
        the entry its first chunks were read under if it had one (a different one is
        found at start, :meth:`restart_snapshot`)."""
        current = self._expect(table, TableState.PENDING)
        if current.resume is not None:
            return self._set(
                table,
                replace(
                    current, state=TableState.SNAPSHOT, published=current.published or published
                ),
            )
        return self._set(
            table, _Table(TableState.SNAPSHOT, snapshot_lsn, current.message, published=published)
        )

    def chunk_published(self, table: str, resume: SnapshotResume) -> TableStatus:
        """Every chunk before ``resume.chunk`` is in Kafka."""
        current = self._expect(table, TableState.SNAPSHOT)
        return self._set(table, replace(current, resume=resume))

    def snapshot_done(self, table: str) -> TableStatus:
        current = self._expect(table, TableState.SNAPSHOT)
        return self._set(
            table,
            _Table(
                TableState.CATCH_UP,
                current.snapshot_lsn,
                current.message,
                published=current.published,
            ),
        )

    def caught_up(self, table: str) -> TableStatus:
        current = self._expect(table, TableState.CATCH_UP)
        # The message stays: why the table was last snapshotted (a resync's reason).
        return self._set(
            table,
            _Table(
                TableState.STREAMING,
                current.snapshot_lsn,
                current.message,
                published=current.published,
            ),
        )

    def resync(self, table: str, reason: str) -> TableStatus:
        """Snapshot the table again while running (``reason`` becomes the status message,
        kept until it streams again): from ``streaming``, or from ``snapshot`` or
        ``catch_up`` when the running snapshot may predate the cause. Its changes are held
        from now on, and the new snapshot starts with a TRUNCATE."""
        current = self._tables.get(table)
        if current is None or current.state not in _RESYNCABLE:
            found = "unknown" if current is None else current.state.value
            raise ValueError(f"{table} is {found}: only a captured, snapshotted table resyncs")
        return self._set(table, _Table(TableState.PENDING, None, reason))

    def errored(self, table: str, message: str) -> TableStatus:
        """The table errored: its message says what is wrong and ends with the resync that
        releases it (:func:`~capture.errors.with_resync_cure`)."""
        return self._set(table, _Table(TableState.ERRORED, None, with_resync_cure(table, message)))

    def published_seen(self, table: str, published: PublicationFilter) -> TableStatus:
        """A streaming table whose publication entry was not known (it never had a
        snapshot under this version): ``published`` is the one its rows follow from now."""
        current = self._expect(table, TableState.STREAMING)
        return self._set(table, replace(current, published=published))

    def restart_snapshot(self, table: str, reason: str) -> TableStatus:
        """A pending table whose snapshot was to resume is taken again from scratch,
        starting with a TRUNCATE: its first chunks were read under a publication entry
        that no longer holds."""
        self._expect(table, TableState.PENDING)
        return self._set(table, _Table(TableState.PENDING, None, reason))

    # -- questions -----------------------------------------------------------------------

    def route(self, table: str, commit_lsn: Lsn) -> Route:
        current = self._tables.get(table)
        if current is None:
            raise KeyError(f"{table} is not a captured table; discover it first")
        state = current.state
        if state is TableState.ERRORED:
            return Route.SKIP
        if current.snapshot_lsn is not None and commit_lsn <= current.snapshot_lsn:
            return Route.DROP
        # Identity first: the usual case, per record, without hashing an Enum member
        # (a Python-level __hash__) for the set lookup.
        if state is TableState.STREAMING or state not in _HOLDING:
            return Route.PUBLISH
        return Route.HOLD

    def state(self, table: str) -> TableState:
        return self._tables[table].state

    def snapshot_lsn(self, table: str) -> Lsn | None:
        return self._tables[table].snapshot_lsn

    def needs_truncate(self, table: str) -> bool:
        """Whether the table's snapshot must start with a TRUNCATE: records of an earlier
        snapshot or stream may be in Kafka (a resync, or a snapshot cut short before its
        first chunk was). A resumed snapshot goes on after its TRUNCATE, if it had one."""
        current = self._tables[table]
        return not current.fresh and current.resume is None

    def published(self, table: str) -> PublicationFilter | None:
        """The row filter and column list the table's rows were taken under, if known."""
        return self._tables[table].published

    def resume_point(self, table: str) -> tuple[Lsn, SnapshotResume] | None:
        """A pending table's snapshot position and where its snapshot goes on, if it
        resumes."""
        current = self._tables[table]
        if current.resume is None or current.snapshot_lsn is None:
            return None
        return current.snapshot_lsn, current.resume

    def in_state(self, state: TableState) -> list[str]:
        return sorted(t for t, s in self._tables.items() if s.state is state)

    def errors(self) -> dict[str, str]:
        """Errored tables and why, for the change stream to skip them."""
        return {
            t: s.message or "errored"
            for t, s in self._tables.items()
            if s.state is TableState.ERRORED
        }

    def _expect(self, table: str, state: TableState) -> _Table:
        current = self._tables.get(table)
        if current is None or current.state is not state:
            found = "unknown" if current is None else current.state.value
            raise ValueError(f"{table} is {found}, not {state.value}")
        return current

    def _set(self, table: str, value: _Table) -> TableStatus:
        self._tables[table] = value
        self.version += 1
        return self._status(table, value)

    def _status(self, table: str, value: _Table) -> TableStatus:
        return TableStatus(
            slot=self._slot,
            table=table,
            state=value.state,
            snapshot_lsn=value.snapshot_lsn,
            message=value.message,
            updated_at=self._clock(),
            resume=value.resume if value.state is TableState.SNAPSHOT else None,
            publication=value.published,
        )
