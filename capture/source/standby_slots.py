"""``synchronized_standby_slots``: the setting that can stall capture with no error of
its own (PostgreSQL 17+).

On a primary, a logical walsender streaming a *failover* slot (capture's, from 17 on)
sends no change before every physical slot named in ``synchronized_standby_slots`` has
flushed it (``StandbySlotsHaveCaughtup`` in the server's slot.c). A name the server
cannot wait for makes it wait forever: no such slot, a logical slot, or an invalidated
one. The only trace is a warning a second in the server's log (``replication slot "…"
specified in parameter "synchronized_standby_slots" does not exist``); capture connects,
streams nothing, and the lag grows. The setting is checked against existing slots only
when it is set on a running server, so it goes wrong without notice when the slot is
dropped afterwards, when the server starts with it in its configuration, and above all
on a promoted standby that inherited it from its primary through the base backup: the
physical slot it names lives on the old primary.

So at every start, on 17+ and on a primary, with capture's slot a failover slot (or about
to be created as one), :func:`check_standby_slots` refuses to stream when a named slot
is one of those three, with the fix: ``ALTER SYSTEM RESET synchronized_standby_slots;
SELECT pg_reload_conf();`` (or naming a physical slot of a standby that exists). A
refusal rather than a warning: nothing could stream until someone acts, and a refusal
says so where capture's operators look, once, with the statement to run.

A named slot that exists and is valid but has no walsender (its standby is down or
restarting) is only a warning: the primary waits for that standby on purpose (a change
capture published must not be lost in a failover to it), and streams again by itself
once the standby is back. If the standby is gone for good, take its slot out of the
setting (docs/operations.md, a primary that fails over).

The setting is read once per start: a slot dropped while capture streams stalls it as
before (the lag alerts catch it).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from capture.errors import ConfigError

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]

SETTING = "synchronized_standby_slots"
FIX = f"ALTER SYSTEM RESET {SETTING}; SELECT pg_reload_conf();"


class StandbySlotState(enum.Enum):
    """What a slot named in the setting is, as the walsender that waits for it sees it."""

    MISSING = "does not exist"
    LOGICAL = "is a logical slot"
    INVALIDATED = "was invalidated"
    INACTIVE = "has no standby connected"
    READY = "is ready"


_STALLS = frozenset(
    {StandbySlotState.MISSING, StandbySlotState.LOGICAL, StandbySlotState.INVALIDATED}
)
"""States a walsender waits in until someone changes the setting or the slot."""


@dataclass(frozen=True, slots=True)
class StandbySlot:
    name: str
    state: StandbySlotState


def parse_slot_names(value: str) -> list[str]:
    """The slot names of a ``synchronized_standby_slots`` value: a comma-separated list
    of identifiers, double-quoted ones taken as written (``""`` for a quote), others
    folded to lower case, as the server's ``SplitIdentifierString`` reads it."""
    names: list[str] = []
    i, end = 0, len(value)
    while True:
        while i < end and value[i].isspace():
            i += 1
        if value.startswith('"', i):
            i += 1
            parts = []
            while True:
                close = value.find('"', i)
                if close < 0:
                    raise ValueError(f"{SETTING} = {value!r} has an unterminated quoted name")
                parts.append(value[i:close])
                i = close + 1
                if not value.startswith('"', i):
                    break
                parts.append('"')  # a doubled quote inside a quoted name is one quote
                i += 1
            names.append("".join(parts))
        else:
            start = i
            while i < end and value[i] != "," and not value[i].isspace():
                i += 1
            names.append(value[start:i].lower())
        while i < end and value[i].isspace():
            i += 1
        if i == end:
            break
        if value[i] != ",":
            raise ValueError(f"{SETTING} = {value!r} is not a comma-separated list of names")
        i += 1
    if "" in names:
        raise ValueError(f"{SETTING} = {value!r} holds an empty name")
    return names


def assess(slots: Sequence[StandbySlot], *, slot: str) -> None:
    """Refuse a setting that stalls capture's slot; warn about a standby that is away."""
    stalling = [s for s in slots if s.state in _STALLS]
    if stalling:
        named = "; ".join(f'"{s.name}" {s.state.value}' for s in stalling)
        raise ConfigError(
            f"{SETTING} names slots the server cannot wait for ({named}), so it would send "
            f"slot {slot} no change, ever: its logical walsender waits for those slots "
            "and only the server log says so. If no standby keeps capture's slot from this "
            f"server, run `{FIX}` (if the setting is in postgresql.conf, remove it there "
            "and reload); otherwise name the physical slot of that standby. A promoted "
            "standby inherits the setting of its old primary (docs/operations.md, a primary "
            "that fails over)"
        )
    for away in (s for s in slots if s.state is StandbySlotState.INACTIVE):
        log.warning(
            "%s names physical slot %s, which has no standby connected: slot %s gets no "
            "change the standby has not flushed, so capture streams nothing new until that "
            "standby is back. If it is gone for good, take its slot out of %s",
            SETTING,
            away.name,
            slot,
            SETTING,
        )


def read_standby_slots(conn: Connection) -> list[StandbySlot]:
    """The slots ``synchronized_standby_slots`` names, each with its state; none on a
    server before 17 (no such setting) or on a standby (which never waits)."""
    if conn.info.server_version < 170000:
        return []
    row = conn.execute(
        "SELECT current_setting('synchronized_standby_slots'), pg_is_in_recovery()"
    ).fetchone()
    if row is None or row[1] or not str(row[0]).strip():
        return []
    return slot_states(conn, parse_slot_names(str(row[0])))


def slot_states(conn: Connection, names: Sequence[str]) -> list[StandbySlot]:
    """Each of ``names`` with its state, as a walsender waiting for it would find it."""
    # invalidation_reason is a column from PostgreSQL 17 on; wal_status = 'lost' is
    # the invalidation of 13 to 16 (the only kind there is for a physical slot).
    invalidated = sql.SQL(
        "invalidation_reason IS NOT NULL OR wal_status = 'lost'"
        if conn.info.server_version >= 170000
        else "wal_status = 'lost'"
    )
    rows = conn.execute(
        sql.SQL(
            "SELECT slot_name, slot_type, active, {} FROM pg_replication_slots "
            "WHERE slot_name = ANY(%s)"
        ).format(invalidated),
        [list(names)],
    ).fetchall()
    found = {str(name): (str(kind), bool(active), bool(lost)) for name, kind, active, lost in rows}
    return [StandbySlot(name, _state(found.get(name))) for name in names]


def _state(found: tuple[str, bool, bool] | None) -> StandbySlotState:
    if found is None:
        return StandbySlotState.MISSING
    kind, active, invalidated = found
    if kind != "physical":
        return StandbySlotState.LOGICAL
    if invalidated:
        return StandbySlotState.INVALIDATED
    return StandbySlotState.READY if active else StandbySlotState.INACTIVE


def waits_for_standbys(conn: Connection, slot: str) -> bool:
    """Whether the walsender of ``slot`` would wait for ``synchronized_standby_slots``:
    a failover slot does (a missing one too: capture creates it so on 17+)."""
    if conn.info.server_version < 170000:
        return False
    row = conn.execute(
        "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    return row is None or bool(row[0])


def check_standby_slots(conn: Connection, slot: str) -> None:
    """:func:`assess` what the server says, for capture's ``slot`` (module docstring)."""
    if waits_for_standbys(conn, slot):
        assess(read_standby_slots(conn), slot=slot)
