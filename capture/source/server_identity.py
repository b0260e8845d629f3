"""Whether the server capture reaches is the one its slot checkpoint was taken on.

An LSN is a place in one server's WAL, and everything capture and apply keep is made
of LSNs: the slot checkpoint on the control topic, the applied position apply's replay
filter drops records at or below (docs/apply.md, why a replay is safe). They mean
something only on the server that wrote that WAL, or on one that shares its history up
to them. So every slot checkpoint records the server it was taken on
(:class:`~schemas.control.ServerIdentity`: ``IDENTIFY_SYSTEM``'s system identifier and
timeline, https://www.postgresql.org/docs/current/protocol-replication.html), and at
every start :func:`check_same_server` compares it with the server reached now, before
the slot is adopted or created:

- **Another system identifier**: another database cluster. A cluster made by
  ``initdb`` at the same address, a logical dump restored into a new cluster, or a
  ``pg_upgrade`` (its new cluster is made by ``initdb`` and keeps that identifier, even
  when it carries caught-up slots over from 17 on). A slot of the same name there
  has positions that say nothing about what the lake holds: a new cluster starts its WAL
  low, so its changes would sit below the lake's applied positions and be dropped as
  replays, or the slot's position merely looks plausible. Refused, with the resync.
- **The same cluster on an older timeline** than the checkpoint's: a server the cluster
  failed over *from* (an old primary started again), whose WAL after the fork is not the
  source's. Refused.
- **A newer timeline** (a promoted standby, or a point-in-time recovery): the server's
  WAL is the checkpoint's up to the point where the new timeline forked from the
  checkpoint's (read from the timeline history, ``TIMELINE_HISTORY``) and different
  after it. If the newest position the pipeline holds (the checkpoint, or the newest
  commit LSN apply applied: :meth:`~capture.publish.control.ControlState.newest_position`)
  is past that fork, the lake holds changes the source no longer has, and the new
  timeline's changes at those LSNs would be dropped as replays: refused. Before the
  fork it is the failover capture supports (docs/capture.md, a primary that fails over),
  logged as a warning and streamed on from. With ``synchronized_standby_slots`` on the
  old primary this is always the case, since capture was sent nothing the standby had
  not flushed; without it, this check catches a failover that lost what capture had
  already confirmed. It cannot see records in Kafka that apply has not applied yet:
  those are what ``synchronized_standby_slots`` is for.
- **No identity recorded** (no checkpoint yet, or one from a version that did not
  record it): nothing to compare; the next checkpoint records it.

Whatever was recorded (short of another cluster), a server whose WAL ends
(``IDENTIFY_SYSTEM``'s ``xlogpos``, the flushed end) before the newest position the
pipeline holds is refused as well: a healthy server's WAL only grows, and everything the
pipeline holds was flushed before it was sent. Such a server was restored from a backup
or a disk snapshot without the WAL after it, on the same timeline, and its new changes
would reuse positions the lake already holds.

The slot checks (:func:`capture.source.setup.check_slot_history`) cover what the
identity cannot: a slot dropped, advanced, or missing after a failover with no
synchronized copy (before PostgreSQL 17 there are none).

The replication connection that streams is opened after these checks; with a multi-host
DSN it could reach another server than the one checked (a failover in between), so
:class:`~capture.stream.replication.ReplicationStream` identifies it again and ends the
attempt, to be retried from the start, when it differs.

Reading is :func:`read_source_server` (one short replication connection); parsing the
history and comparing are pure functions.
"""

from __future__ import annotations

import logging
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import sql

from capture.errors import ConfigError, TransientError
from capture.source.credentials import connection_error
from schemas.control import ServerIdentity
from schemas.lsn import Lsn, format_lsn, parse_lsn

log = logging.getLogger(__name__)

ReplicationConnection = psycopg.Connection[tuple[Any, ...]]

RESYNC = (
    "Resync: stop apply, delete the Delta tables and their checkpoints, delete the change "
    "and control topics, drop the slot on this server if it has one, then start capture "
    "again with CAPTURE_SNAPSHOT_MODE=initial, which snapshots every table anew "
    "(docs/capture.md, the server capture checks)"
)


@dataclass(frozen=True, slots=True)
class TimelineSwitch:
    """One line of a timeline history file: ``timeline`` ended at ``switchpoint``, where
    the next one began."""

    timeline: int
    switchpoint: Lsn


@dataclass(frozen=True, slots=True)
class SourceServer:
    """The server reached now: who it is, where its WAL ends, and how its current
    timeline came to be."""

    identity: ServerIdentity
    wal_end: Lsn
    """The end of its flushed WAL when it was identified."""
    history: tuple[TimelineSwitch, ...] = ()
    """Every timeline before the current one, oldest first; read only when the timeline
    moved on since the recorded one (:func:`read_source_server`), empty otherwise."""


def identify(conn: ReplicationConnection) -> SourceServer:
    """``IDENTIFY_SYSTEM`` on a replication connection (no history)."""
    row = conn.execute("IDENTIFY_SYSTEM").fetchone()
    if row is None:
        raise TransientError("IDENTIFY_SYSTEM returned no row")
    return SourceServer(ServerIdentity(int(row[0]), int(row[1])), parse_lsn(str(row[2])))


def parse_timeline_history(text: str) -> tuple[TimelineSwitch, ...]:
    """A timeline history file (``<parent timeline> <switchpoint> <reason>`` per line,
    ``#`` comments), as ``TIMELINE_HISTORY`` returns it. Split on ``\n`` alone: the
    reason can quote a restore point's name, which may hold any character."""
    switches = []
    for line in text.split("\n"):
        fields = line.split(maxsplit=2)
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) < 2 or not fields[0].isdigit():
            raise ValueError(f"not a timeline history line: {line!r}")
        switches.append(TimelineSwitch(int(fields[0]), parse_lsn(fields[1])))
    return tuple(switches)


def timeline_history(conn: ReplicationConnection, timeline: int) -> tuple[TimelineSwitch, ...]:
    """The history of ``timeline`` (none for timeline 1, which has no history file)."""
    if timeline <= 1:
        return ()
    row = conn.execute(
        sql.SQL("TIMELINE_HISTORY {}").format(sql.SQL(str(int(timeline))))
    ).fetchone()
    if row is None:
        raise TransientError(f"TIMELINE_HISTORY {timeline} returned no row")
    content = row[1]
    text = bytes(content).decode() if isinstance(content, bytes | memoryview) else str(content)
    return parse_timeline_history(text)


def read_source_server(
    dsn: str, password: str | None, *, recorded: ServerIdentity | None
) -> SourceServer:
    """Identify the server ``dsn`` reaches, on a replication connection of its own (the
    role needs nothing beyond the right to replicate, which capture needs anyway), with
    the history of its timeline when :func:`check_same_server` will need it: the same
    cluster as ``recorded``, on a newer timeline."""
    try:
        conn = psycopg.connect(dsn, password=password, autocommit=True, replication="database")
    except psycopg.OperationalError as exc:
        raise connection_error(exc) from exc
    with closing(conn):
        server = identify(conn)
        identity = server.identity
        moved_on = (
            recorded is not None
            and recorded.system_identifier == identity.system_identifier
            and recorded.timeline < identity.timeline
        )
        if not moved_on:
            return server
        try:
            history = timeline_history(conn, identity.timeline)
        except (psycopg.Error, ValueError) as exc:
            raise ConfigError(
                f"cannot read the history of timeline {identity.timeline} on the source "
                f"({exc}), so capture cannot tell where it forked from the timeline its "
                "checkpoint was taken on: the timeline history file is missing from the "
                "server's pg_wal (restore it from the WAL archive and start capture again)"
            ) from exc
    return replace(server, history=history)


def check_same_server(
    server: SourceServer,
    recorded: ServerIdentity | None,
    *,
    position: Lsn | None,
    slot: str,
) -> None:
    """Refuse a server where the pipeline's positions do not mean what they meant when
    ``recorded`` was taken (the module docstring says when). ``position``: the newest LSN
    the pipeline holds (:meth:`~capture.publish.control.ControlState.newest_position`)."""
    current = server.identity
    if recorded is not None and current.system_identifier != recorded.system_identifier:
        raise ConfigError(
            f"capture last streamed slot {slot} from the database cluster with system "
            f"identifier {recorded.system_identifier}, but the server it reaches now is "
            f"another cluster, system identifier {current.system_identifier} (a new "
            "initdb at the same address, a dump restored into a new cluster, a pg_upgrade): "
            "its WAL positions have nothing to do with what the lake holds, and streaming "
            "from them would skip changes or drop them as replays. If this is the wrong "
            "server, point CAPTURE_POSTGRES__DSN back at the cluster it was. " + RESYNC
        )
    if position is not None and position > server.wal_end:
        raise ConfigError(
            f"the source's WAL ends at {format_lsn(server.wal_end)}, before "
            f"{format_lsn(position)}, the newest position the pipeline holds for slot "
            f"{slot}: the server was restored from a backup or a disk snapshot without the "
            "WAL that followed, and its new changes would reuse positions the lake "
            "already holds (apply would drop them as replays). If this is the wrong server, "
            "point CAPTURE_POSTGRES__DSN back at the right one. " + RESYNC
        )
    if recorded is None or current.timeline == recorded.timeline:
        return
    if current.timeline < recorded.timeline:
        raise ConfigError(
            f"the source is on timeline {current.timeline}, but capture last streamed slot "
            f"{slot} from timeline {recorded.timeline} of the same cluster: this server is "
            "one the cluster failed over from (an old primary started again?), and its WAL "
            "after the fork is not the source's. Point CAPTURE_POSTGRES__DSN at the current "
            "primary, and rebuild this server as its standby (docs/operations.md, a primary "
            "that fails over)"
        )
    fork = next((s.switchpoint for s in server.history if s.timeline == recorded.timeline), None)
    if fork is None:
        raise ConfigError(
            f"the source is on timeline {current.timeline}, which does not descend from "
            f"timeline {recorded.timeline} where capture last streamed slot {slot}: the "
            "cluster branched (a point-in-time recovery from an older backup?), and the WAL "
            "of this branch is not the one the lake was built from. " + RESYNC
        )
    if position is not None and position > fork:
        raise ConfigError(
            f"the source is on timeline {current.timeline}, which forked from timeline "
            f"{recorded.timeline} at {format_lsn(fork)}, but the pipeline already holds "
            f"changes up to {format_lsn(position)} of the old timeline: the server lost "
            "them in the failover (or the recovery), and its new changes at those positions "
            "would be dropped as replays. On the old primary, synchronized_standby_slots "
            "keeps this from happening (docs/capture.md, a primary that fails over). " + RESYNC
        )
    log.warning(
        "the source moved from timeline %d to %d at %s (a failover or a point-in-time "
        "recovery); the pipeline's position %s is before the fork, so slot %s streams on",
        recorded.timeline,
        current.timeline,
        format_lsn(fork),
        "(none)" if position is None else format_lsn(position),
        slot,
    )
