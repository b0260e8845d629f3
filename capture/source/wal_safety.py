"""WAL safety: how much WAL the slot keeps on the source, and whether it is still whole.

The slot moves only as far as the lake has applied (:mod:`capture.in_flight`), so while
apply is down, or slow, PostgreSQL keeps every WAL segment since then. Without a cap
(``max_slot_wal_keep_size = -1``, the default) that fills the source's disk; with one,
the server *invalidates* the slot once it would keep more, and the slot's
``wal_status`` becomes ``lost``: it can never stream again, and the changes in the
missing WAL reach the lake only through a fresh snapshot.

Rules (https://www.postgresql.org/docs/current/view-pg-replication-slots.html):

- At start, ``max_slot_wal_keep_size = -1`` is a loud warning naming the setting: a
  full disk stops the whole database, an invalidated slot only this pipeline.
- Every ``wal.check_interval_s``, on a connection of its own (so a slow catalog read
  never stalls the replication loop): retained WAL (``pg_current_wal_lsn() -
  restart_lsn``), ``wal_status`` and ``safe_wal_size`` go to the metrics; retained WAL
  above ``wal.warn_retained_bytes`` is a warning each check.
- ``wal_status = 'lost'`` is a :class:`SlotLostError` (a ConfigError: retrying cannot
  help), at start and during the run; the message names the resync procedure.

Reading the view is a pure function of one row (:func:`assess`); only :class:`WalWatch`
does I/O, in its own daemon thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from capture.errors import ConfigError, slot_resync
from capture.metrics import CaptureMetrics

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]

LOST = "lost"
RECOMMENDED_KEEP_SIZE = "max_slot_wal_keep_size"


class SlotLostError(ConfigError):
    """The slot's WAL is gone (``wal_status = 'lost'``): only a resync recovers."""


_CAUSES = {
    None: "PostgreSQL removed WAL it still needed, because the slot kept more than "
    "max_slot_wal_keep_size while apply was behind",
    "wal_removed": "PostgreSQL removed WAL it still needed, because the slot kept more than "
    "max_slot_wal_keep_size while apply was behind",
    "idle_timeout": "no capture streamed from it for longer than "
    "idle_replication_slot_timeout (PostgreSQL 18), so the server invalidated it",
}
"""The cause a slot's ``invalidation_reason`` (PostgreSQL 17+; None before) names."""


def slot_lost_error(slot: str, reason: str | None = None) -> SlotLostError:
    """The error for a lost slot, naming the cause ``reason`` gives (the slot's
    ``invalidation_reason``; None where the server has no such column)."""
    cause = _CAUSES.get(reason, f"the server invalidated it (invalidation_reason = {reason})")
    return SlotLostError(
        f"replication slot {slot} was invalidated (wal_status = 'lost'): {cause}. The changes "
        f"in its WAL cannot be streamed any more. Resync the pipeline: {slot_resync(slot)}"
    )


@dataclass(frozen=True, slots=True)
class SlotWal:
    """One reading of ``pg_replication_slots`` for the slot."""

    retained_bytes: int | None
    """``pg_current_wal_lsn() - restart_lsn``; None when the slot has no restart LSN."""
    wal_status: str | None
    """``reserved``, ``extended``, ``unreserved`` or ``lost`` (None before PostgreSQL 13)."""
    safe_wal_size: int | None
    """Bytes that can still be written before the slot is in danger of being lost; None
    when ``max_slot_wal_keep_size`` is unlimited."""
    invalidation_reason: str | None = None
    """Why the server invalidated the slot (PostgreSQL 17+): ``wal_removed``,
    ``idle_timeout`` (18), ...; None while it is valid, or before 17."""


@dataclass(frozen=True, slots=True)
class Assessment:
    lost: bool
    over_threshold: bool


def assess(reading: SlotWal, warn_retained_bytes: int) -> Assessment:
    """What one reading means: lost, and/or over the warning threshold (0: never warn)."""
    over = (
        warn_retained_bytes > 0
        and reading.retained_bytes is not None
        and reading.retained_bytes > warn_retained_bytes
    )
    return Assessment(lost=reading.wal_status == LOST, over_threshold=over)


def read_keep_size(conn: Connection) -> int:
    """``max_slot_wal_keep_size`` in bytes; -1 when unlimited."""
    row = conn.execute(
        "SELECT setting::bigint * CASE unit WHEN 'MB' THEN 1048576 WHEN 'kB' THEN 1024 "
        "ELSE 1 END, setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'"
    ).fetchone()
    if row is None:
        return -1  # before PostgreSQL 13 there is no cap at all
    return -1 if int(row[1]) < 0 else int(row[0])


def warn_if_unlimited(keep_size: int) -> None:
    if keep_size < 0:
        log.warning(
            "max_slot_wal_keep_size is -1 (unlimited): while apply is down or behind, the "
            "slot keeps WAL on the source until its disk is full, which stops the whole "
            "database. Set max_slot_wal_keep_size (e.g. ALTER SYSTEM SET "
            "max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf();) to what the disk "
            "can spare; docs/operations.md, WAL safety, says how to size it"
        )


def report_keep_size(conn: Connection, metrics: CaptureMetrics) -> None:
    """``max_slot_wal_keep_size`` to the metrics, with the warning when it is unlimited."""
    keep_size = read_keep_size(conn)
    metrics.keep_size.set(keep_size)
    warn_if_unlimited(keep_size)


def read_slot_wal(conn: Connection, slot: str) -> SlotWal | None:
    """The slot's WAL facts, or None when the slot does not exist."""
    # invalidation_reason is a column from PostgreSQL 17 on.
    reason = sql.SQL("invalidation_reason" if conn.info.server_version >= 170000 else "NULL")
    row = conn.execute(
        sql.SQL(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
            "wal_status, safe_wal_size, {} FROM pg_replication_slots WHERE slot_name = %s"
        ).format(reason),
        [slot],
    ).fetchone()
    if row is None:
        return None
    retained, status, safe, why = row
    return SlotWal(
        retained_bytes=None if retained is None else int(retained),
        wal_status=None if status is None else str(status),
        safe_wal_size=None if safe is None else int(safe),
        invalidation_reason=None if why is None else str(why),
    )


def check(
    reading: SlotWal | None,
    *,
    slot: str,
    warn_retained_bytes: int,
    metrics: CaptureMetrics,
) -> None:
    """Publish one reading to the metrics, warn when over the threshold; raise
    :class:`SlotLostError` when the slot is lost."""
    if reading is None:
        return
    found = assess(reading, warn_retained_bytes)
    metrics.slot_wal(reading.retained_bytes, reading.wal_status, reading.safe_wal_size)
    if found.over_threshold:
        log.warning(
            "slot %s retains %d bytes of WAL, over the %d-byte warning threshold "
            "(CAPTURE_WAL__WARN_RETAINED_BYTES): apply is down or behind, or capture cannot "
            "confirm; safe_wal_size %s",
            slot,
            reading.retained_bytes,
            warn_retained_bytes,
            "unlimited" if reading.safe_wal_size is None else f"{reading.safe_wal_size} bytes",
        )
    if found.lost:
        raise slot_lost_error(slot, reading.invalidation_reason)


class WalWatch:
    """Reads the slot's WAL facts every ``interval_s`` on a connection of its own.

    A failure to read is logged and retried at the next interval (the replication loop
    notices a dead server by itself); a lost slot is kept in :attr:`failure` for the
    loop to raise, since an exception in this thread would reach nobody."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        *,
        slot: str,
        interval_s: float,
        warn_retained_bytes: int,
        metrics: CaptureMetrics,
    ) -> None:
        self._connect = connect
        self._slot = slot
        self._interval_s = interval_s
        self._warn = warn_retained_bytes
        self._metrics = metrics
        self._stop = threading.Event()
        self._conn: Connection | None = None
        self.failure: SlotLostError | None = None
        self._thread = threading.Thread(target=self._run, name="wal-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval_s):
                self.check_once()
        finally:
            if self._conn is not None:
                self._conn.close()

    def check_once(self) -> None:
        """One reading; public so a test can take one without waiting."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            reading = read_slot_wal(self._conn, self._slot)
        except psycopg.Error as exc:
            log.warning("cannot read the slot's retained WAL, trying again later: %s", exc)
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return
        try:
            check(reading, slot=self._slot, warn_retained_bytes=self._warn, metrics=self._metrics)
        except SlotLostError as exc:
            self.failure = exc
