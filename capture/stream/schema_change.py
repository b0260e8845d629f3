"""Which schema changes leave the lake behind without a single change on the stream.

Some DDL changes the value of every existing row and writes no logical change for any
of them (docs/capture.md, schema changes):

- ``ADD COLUMN c ... DEFAULT <constant>``: since PostgreSQL 11 the default is stored once
  in the catalog (``pg_attribute.atthasmissing`` / ``attmissingval``) and every existing
  row reads it, while the WAL holds nothing per row;
- ``ADD COLUMN c ... DEFAULT <volatile>`` (``random()``, ``clock_timestamp()``) or
  ``GENERATED ... AS IDENTITY``: the table is rewritten with a value per row, and
  logical decoding does not decode a rewrite.

The stream announces the new column only with the next Relation message of the table,
sent before its next change. So when a Relation adds columns, capture reads the catalog
for them (:func:`read_added_columns`); if one of them has a default or identity
(:func:`resync_reason`, pure), the rows that existed before hold values the stream never
carried, and the table is resynced online (:meth:`capture.stream.table_flow.TableFlow.resync`).
A column added without a default needs nothing: old rows are null at the source and in
the lake alike.

A change of the publication's row filter or column list for a table (PostgreSQL 15+,
:mod:`capture.source.publication`) leaves the lake behind the same way: rows that match
a new filter and no change since never arrive, rows that stopped matching stay, a column
newly listed is null in every row written before, one left out keeps its old values.
pgoutput sends the table's Relation again before its next change (the publication
change invalidates the table's entry), so at every Relation capture reads the table's
entry and compares it with the one its rows were taken under, kept in the table's
status (:func:`publication_change_reason`, pure); any difference resyncs the table
online, and the new snapshot copies under the new entry. A table whose entry changed
while capture was stopped is found at the start (and at its first Relation).

Invariants:

- Only a Relation that *adds* columns triggers the catalog read of its columns, so a
  Relation sent again unchanged (a new session, ``VACUUM FULL``, ``CLUSTER``) costs one
  read of the table's publication entry and never resyncs unless that entry changed: a
  rewrite that keeps every value must not cause endless resyncs.
- The catalog is read now, not as of the DDL: a column the catalog no longer has (it
  was dropped again, or renamed) cannot be checked and is resynced, the safe side.
- A rewrite that changes no column the Relation shows (``ALTER COLUMN c TYPE int USING c +
  1`` on an int column) is not detected: nothing in the stream tells it from a ``VACUUM
  FULL``, which also changes ``pg_class.relfilenode``; such a table needs
  ``python -m capture resync``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from capture.errors import TransientError
from capture.pgoutput import Relation
from schemas.control import PublicationFilter

Connection = psycopg.Connection[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class AddedColumn:
    """What the catalog says about a column a Relation added."""

    has_missing: bool
    """``atthasmissing``: existing rows read a default stored in the catalog."""
    has_default: bool
    """``atthasdef``: a default expression (a volatile one rewrote the table)."""
    identity: bool
    """``attidentity``: an identity column, filled for every row by a rewrite."""


def added_columns(previous: Relation, current: Relation) -> tuple[str, ...]:
    """Names of the columns ``current`` has and ``previous`` had not, in order."""
    known = {column.name for column in previous.columns}
    return tuple(column.name for column in current.columns if column.name not in known)


def resync_reason(
    previous: Relation, current: Relation, catalog: Mapping[str, AddedColumn]
) -> str | None:
    """Why the table must be resynced after ``previous`` became ``current``, or None.
    ``catalog`` describes the added columns; one it lacks cannot be checked and counts
    as filled."""
    filled = [
        name
        for name in added_columns(previous, current)
        if (found := catalog.get(name)) is None
        or found.has_missing
        or found.has_default
        or found.identity
    ]
    if not filled:
        return None
    plural = "s" if len(filled) > 1 else ""
    return (
        f"column{plural} {', '.join(filled)} added with a default: rows that existed "
        "before hold values the stream never carried, so the table is snapshotted again"
    )


def read_added_columns(
    conn: Connection, relation: Relation, names: Sequence[str]
) -> dict[str, AddedColumn]:
    """The catalog entries of ``relation``'s columns ``names`` (those it still has)."""
    if not names:
        return {}
    try:
        rows = conn.execute(
            "SELECT attname, atthasmissing, atthasdef, attidentity <> '' "
            "FROM pg_attribute WHERE attrelid = %s AND attname = ANY(%s) "
            "AND attnum > 0 AND NOT attisdropped",
            [relation.oid, list(names)],
        ).fetchall()
    except psycopg.OperationalError as exc:
        raise TransientError(f"cannot read the catalog after a schema change: {exc}") from exc
    return {
        str(name): AddedColumn(bool(missing), bool(default), bool(identity))
        for name, missing, default, identity in rows
    }


def resync_reason_after(conn: Connection, previous: Relation, current: Relation) -> str | None:
    """:func:`resync_reason` for a Relation that changed, reading the catalog only when
    columns were added."""
    added = added_columns(previous, current)
    if not added:
        return None
    return resync_reason(previous, current, read_added_columns(conn, current, added))


def publication_change_reason(
    recorded: PublicationFilter | None, current: PublicationFilter
) -> str | None:
    """Why the table must be resynced when the publication now lets ``current`` through
    and its rows were taken under ``recorded`` (None: not known, nothing to compare),
    or None."""
    if recorded is None or recorded == current:
        return None
    changed = []
    if recorded.row_filter != current.row_filter:
        changed.append("row filter")
    if recorded.columns != current.columns:
        changed.append("column list")
    return (
        f"the publication's {' and '.join(changed)} changed ({recorded.describe()} -> "
        f"{current.describe()}): rows and columns already published follow the old one, "
        "so the table is snapshotted again"
    )
