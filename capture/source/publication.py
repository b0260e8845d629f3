"""What the publication lets through of a table: its row filter and column list
(PostgreSQL 15+, https://www.postgresql.org/docs/current/logical-replication-row-filter.html
and logical-replication-col-lists.html).

pgoutput applies both to the stream by itself: a change whose row does not match the
filter is not sent (an UPDATE that moves a row out of the filter arrives as a DELETE,
one that moves it in as an INSERT), and Relation messages and tuples carry only the
listed columns. A ``COPY`` is not filtered, so the snapshot reads the table's entry here
(:func:`read_filter`) and copies exactly the published rows and columns; the stream's
writer schema and the snapshot's are then the same.

Invariants:

- The entry is read from ``pg_publication_rel`` with plain SQL, so inside a snapshot's
  transaction it is the entry as of the snapshot's consistent point, the one pgoutput
  applies to the changes right after it. (``pg_publication_tables`` reads the catalog
  as it is now.)
- Only a table listed on its own (``FOR TABLE``) can have a filter or a column list;
  a table published by ``FOR ALL TABLES`` or ``FOR TABLES IN SCHEMA`` has none.
- The column list must hold the replica identity's columns, and a table under
  ``REPLICA IDENTITY FULL`` can have no list: PostgreSQL refuses the table's UPDATEs and
  DELETEs otherwise, and capture could not key its rows (:func:`column_list_error`).
"""

from __future__ import annotations

from typing import Any

import psycopg

from capture.errors import TableError
from capture.pgoutput import ReplicaIdentity
from schemas.control import PublicationFilter

Connection = psycopg.Connection[tuple[Any, ...]]

ROW_FILTER_VERSION = 150000
"""Row filters and column lists appeared in PostgreSQL 15."""


def read_filter(conn: Connection, publication: str, table: str) -> PublicationFilter:
    """The row filter and column list ``publication`` has for ``table`` (``schema.name``);
    every row and column when it has none, or the server predates them."""
    if conn.info.server_version < ROW_FILTER_VERSION:
        return PublicationFilter()
    schema, _, name = table.partition(".")
    row = conn.execute(
        "SELECT pg_get_expr(r.prqual, r.prrelid), "
        "  CASE WHEN r.prattrs IS NULL THEN NULL ELSE ARRAY("
        "    SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = r.prrelid "
        "    AND a.attnum = ANY(r.prattrs::int2[]) ORDER BY a.attnum) END "
        "FROM pg_publication_rel r "
        "JOIN pg_publication p ON p.oid = r.prpubid "
        "JOIN pg_class c ON c.oid = r.prrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE p.pubname = %s AND n.nspname = %s AND c.relname = %s",
        [publication, schema, name],
    ).fetchone()
    if row is None:
        return PublicationFilter()
    row_filter, columns = row
    return PublicationFilter(
        None if row_filter is None else str(row_filter),
        None if columns is None else tuple(str(c) for c in columns),
    )


def column_list_problem(conn: Connection, publication: str, table: str) -> TableError | None:
    """What is wrong with ``publication``'s column list for ``table``, if anything
    (:func:`column_list_error`); None without a list."""
    if conn.info.server_version < ROW_FILTER_VERSION:
        return None
    schema, _, name = table.partition(".")
    row = conn.execute(
        "SELECT c.relreplident, ARRAY("
        "  SELECT a.attname::text FROM pg_attribute a "
        "  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "  AND a.attgenerated = '' AND NOT a.attnum = ANY(r.prattrs::int2[]) "
        "  AND a.attnum = ANY(COALESCE(("
        "    SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = c.oid AND "
        "    CASE c.relreplident WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident "
        "    ELSE false END), '{}')) "
        "  ORDER BY a.attnum) "
        "FROM pg_publication_rel r "
        "JOIN pg_publication p ON p.oid = r.prpubid "
        "JOIN pg_class c ON c.oid = r.prrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE p.pubname = %s AND n.nspname = %s AND c.relname = %s AND r.prattrs IS NOT NULL",
        [publication, schema, name],
    ).fetchone()
    if row is None:
        return None
    return column_list_error(
        publication, table, ReplicaIdentity(str(row[0])), tuple(str(c) for c in row[1])
    )


def column_list_error(
    publication: str, table: str, identity: ReplicaIdentity, missing: tuple[str, ...]
) -> TableError | None:
    """The error of a table that ``publication`` lists with a column list, under
    ``identity``, leaving out the identity index's or primary key's columns ``missing``;
    None when PostgreSQL allows its UPDATEs and DELETEs. Under ``REPLICA IDENTITY FULL``
    it allows no column list at all (the old row is every column)."""
    resync = f"then run `python -m capture resync {table}` and restart capture"
    if identity is ReplicaIdentity.FULL:
        return TableError(
            table,
            f"publication {publication} publishes a column list of it, and it has REPLICA "
            "IDENTITY FULL: PostgreSQL refuses its UPDATEs and DELETEs that way. Drop the "
            f"list (`ALTER PUBLICATION {publication} SET TABLE {table}` naming the publication's "
            "other tables too), or give the table a primary key with REPLICA IDENTITY "
            f"DEFAULT; {resync}",
        )
    if not missing:
        return None
    plural = "s" if len(missing) > 1 else ""
    names = ", ".join(missing)
    return TableError(
        table,
        f"publication {publication} publishes a column list without its replica identity "
        f"column{plural} {names}: PostgreSQL refuses the table's UPDATEs and DELETEs that "
        f"way, and capture could not key its rows. Add {names} to the list (`ALTER "
        f"PUBLICATION {publication} SET TABLE {table} (...)` naming them too); {resync}",
    )
