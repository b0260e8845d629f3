"""The PostgreSQL side of verify: verify points, table shapes, bucket and key queries.

A **verify point** is the consistent point ``C`` of a temporary logical slot created with
``EXPORT_SNAPSHOT`` on a replication connection
(https://www.postgresql.org/docs/current/protocol-replication.html): a second, ordinary
connection imports the snapshot (``REPEATABLE READ``, ``SET TRANSACTION SNAPSHOT``) and
then sees exactly the transactions whose commit record starts before ``C``, which is
how capture's own snapshots are tied to the stream (:mod:`capture.snapshot.run`). The
replication connection stays open while the snapshot is used; the temporary slot goes
with it.

Both connections carry capture's session settings
(:data:`capture.rows.typemap.SESSION_SETTINGS`), so text-form values print exactly as capture
sent them; ``search_path`` is ``pg_catalog``, so every name here is qualified.

Only aggregates and the keys of differing buckets leave the server: the row texts and
their md5 are computed in SQL (:mod:`pipeline.verify.canonical`). psycopg errors are
translated to :mod:`capture.errors` classes at this boundary.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from capture.errors import ConfigError, TransientError
from capture.pgoutput import ReplicaIdentity
from capture.rows.describe import describe_columns
from capture.rows.type_catalog import load_types
from capture.rows.typemap import SESSION_SETTINGS, libpq_options
from capture.snapshot.run import relation_from_catalog
from capture.source.publication import read_filter
from capture.source.setup import TableRef
from pipeline.verify.canonical import (
    SOURCE_ALIAS,
    CanonColumn,
    source_bucket,
    source_md5,
    source_row,
    source_value60,
)
from pipeline.verify.compare import BucketStats, SourceRow
from schemas.column_type import AvroKind
from schemas.lsn import Lsn, format_lsn, parse_lsn

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]


class VerifyPointTimeoutError(TransientError):
    """The pipeline's slot did not reach the verify point in time."""


@dataclass(frozen=True, slots=True)
class TableShape:
    """What verify compares of one source table at a verify point."""

    table: TableRef
    columns: tuple[CanonColumn, ...]
    """The published columns, in table order."""
    key: tuple[str, ...]
    """Key columns as capture keys the table (every column for a keyless table)."""
    keyless: bool
    """No primary key or replica identity index: rows are compared as a multiset."""
    notes: tuple[str, ...] = ()
    """Columns left out of the comparison, and why."""
    row_filter: str | None = None
    """The publication's row filter for the table (PostgreSQL 15+): only the rows it
    lets through reach the lake, so only those are compared."""

    @property
    def key_columns(self) -> tuple[CanonColumn, ...]:
        return tuple(column for column in self.columns if column.name in self.key)


def connect(dsn: str, password: str | None, *, replication: bool = False) -> Connection:
    """A connection with capture's session settings."""
    try:
        if replication:
            return psycopg.connect(
                dsn,
                password=password,
                autocommit=True,
                replication="database",
                options=libpq_options(SESSION_SETTINGS),
            )
        return psycopg.connect(dsn, password=password, options=libpq_options(SESSION_SETTINGS))
    except psycopg.OperationalError as exc:
        raise ConfigError(
            f"verify cannot connect to PostgreSQL: {exc}: check CAPTURE_POSTGRES__DSN and "
            "CAPTURE_POSTGRES__PASSWORD"
        ) from exc


@dataclass(frozen=True, slots=True)
class VerifyPoint:
    lsn: Lsn
    """The consistent point C: the snapshot holds exactly the commits before it."""
    connection: Connection
    """In a REPEATABLE READ transaction on the snapshot."""


@contextmanager
def verify_point(dsn: str, password: str | None) -> Iterator[VerifyPoint]:
    """A fresh verify point, its snapshot imported; slot and snapshot end on exit."""
    slot = f"verify_{os.getpid()}_{uuid.uuid4().hex[:12]}"
    with connect(dsn, password, replication=True) as replication, connect(dsn, password) as conn:
        try:
            row = replication.execute(
                sql.SQL(
                    "CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT"
                ).format(sql.Identifier(slot))
            ).fetchone()
            if row is None:
                raise TransientError("CREATE_REPLICATION_SLOT returned no consistent point")
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(str(row[2]))))
        except psycopg.errors.ConfigurationLimitExceeded as exc:
            raise ConfigError(
                f"verify needs one more replication slot and WAL sender while it runs: "
                f"{exc.diag.message_primary}; raise max_replication_slots and max_wal_senders"
            ) from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(
                f"verify may not create a replication slot: {exc.diag.message_primary}; run it "
                "with capture's role (REPLICATION)"
            ) from exc
        except psycopg.Error as exc:
            raise TransientError(f"verify could not take a snapshot: {exc}") from exc
        point = parse_lsn(str(row[1]))
        log.info("verify point %s", format_lsn(point))
        try:
            yield VerifyPoint(point, conn)
        finally:
            conn.rollback()


def wait_for_slot(
    dsn: str,
    password: str | None,
    slot: str,
    point: Lsn,
    timeout_s: float,
    *,
    poll_s: float = 0.2,
) -> Lsn:
    """Wait until ``slot`` has confirmed ``point``: then the lake holds every change
    committed before it (docs/architecture.md, LSN bookkeeping). Its confirmed LSN."""
    deadline = time.monotonic() + timeout_s
    with connect(dsn, password) as conn:
        conn.autocommit = True
        while True:
            try:
                row = conn.execute(
                    "SELECT confirmed_flush_lsn::text FROM pg_catalog.pg_replication_slots "
                    "WHERE slot_name = %s",
                    [slot],
                ).fetchone()
            except psycopg.Error as exc:
                raise TransientError(f"reading slot {slot} failed: {exc}") from exc
            if row is None:
                raise ConfigError(
                    f"replication slot {slot} does not exist: is CAPTURE_POSTGRES__SLOT right, "
                    "and has capture ever run?"
                )
            confirmed = parse_lsn(str(row[0])) if row[0] is not None else Lsn(0)
            if confirmed >= point:
                return confirmed
            if time.monotonic() >= deadline:
                raise VerifyPointTimeoutError(
                    f"slot {slot} confirmed {format_lsn(confirmed)} and did not reach the verify "
                    f"point {format_lsn(point)} within {timeout_s:g} s: is capture running, and "
                    "apply? is a table still being snapshotted (python -m pipeline status)? "
                    "Try again, or give more --timeout"
                )
            time.sleep(poll_s)


def publication_tables(
    conn: Connection, publication: str
) -> dict[TableRef, tuple[str, ...] | None]:
    """The publication's tables and their published columns (None: all columns)."""
    try:
        exists = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = %s", [publication]
        ).fetchone()
        if exists is None:
            raise ConfigError(
                f"publication {publication} does not exist: check CAPTURE_POSTGRES__PUBLICATION"
            )
        with_columns = conn.info.server_version >= 150000
        columns = "attnames::text[]" if with_columns else "NULL::text[]"
        rows = conn.execute(
            sql.SQL(
                "SELECT schemaname::text, tablename::text, {} "
                "FROM pg_catalog.pg_publication_tables WHERE pubname = %s"
            ).format(sql.SQL(columns)),
            [publication],
        ).fetchall()
    except psycopg.Error as exc:
        raise TransientError(f"reading publication {publication} failed: {exc}") from exc
    return {
        TableRef(str(schema), str(name)): None if names is None else tuple(names)
        for schema, name, names in rows
    }


def _output_functions(conn: Connection, oids: Sequence[int]) -> dict[int, tuple[str, str]]:
    rows = conn.execute(
        "SELECT t.oid::int8, n.nspname::text, p.proname::text FROM pg_catalog.pg_type t "
        "JOIN pg_catalog.pg_proc p ON p.oid = t.typoutput "
        "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE t.oid = ANY(%s)",
        [list(oids)],
    ).fetchall()
    return {int(oid): (str(schema), str(name)) for oid, schema, name in rows}


def describe_table(
    conn: Connection,
    table: TableRef,
    published: Sequence[str] | None,
    publication: str | None = None,
) -> TableShape:
    """The table's columns as capture publishes them (its own catalog reading and type
    mapping), each with the output function of its scalar type, and the row filter
    ``publication`` has for it (read in the verify point's snapshot, as capture's own
    snapshot reads it)."""
    try:
        row_filter = (
            None
            if publication is None
            else read_filter(conn, publication, table.qualified).row_filter
        )
        relation = relation_from_catalog(conn, table.qualified)
        mappings = describe_columns(conn, relation)
        types = load_types(conn, [c.type_oid for c in relation.columns])
        scalars: dict[str, int] = {}
        for column in relation.columns:
            oid = column.type_oid
            # Down to the scalar: through domains and array elements.
            while (found := types.get(oid)) is not None and (
                found.base_oid is not None or found.element_oid is not None
            ):
                oid = found.base_oid if found.base_oid is not None else found.element_oid  # type: ignore[assignment]
            scalars[column.name] = oid
        outputs = _output_functions(conn, sorted(set(scalars.values())))
        dimensions = {
            str(name): int(dims)
            for name, dims in conn.execute(
                "SELECT attname::text, attndims FROM pg_catalog.pg_attribute "
                "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
                [relation.oid],
            ).fetchall()
        }
    except psycopg.Error as exc:
        raise TransientError(f"reading the columns of {table.qualified} failed: {exc}") from exc
    columns: list[CanonColumn] = []
    notes: list[str] = []
    for column, mapping in zip(relation.columns, mappings, strict=True):
        if published is not None and column.name not in published:
            continue
        canon = CanonColumn(column.name, mapping.column_type, outputs.get(scalars[column.name]))
        declared = max(dimensions.get(column.name, 1), 1)
        if canon.dimensions and canon.dimensions != declared:
            notes.append(
                f"column {column.name} ({mapping.pg_type_name}) holds arrays of arrays: not "
                "compared"
            )
            continue
        if canon.scalar.kind is AvroKind.STRING and canon.output_function is None:
            notes.append(f"column {column.name}: its type has no output function: not compared")
            continue
        columns.append(canon)
    key = tuple(c.name for c in relation.columns if c.is_key)
    # REPLICA IDENTITY FULL without a primary key: capture keys by the whole row.
    keyless = (
        len(key) == len(relation.columns) and relation.replica_identity is ReplicaIdentity.FULL
    )
    if keyless:
        key = tuple(c.name for c in columns)
    return TableShape(table, tuple(columns), key, keyless, tuple(notes), row_filter)


def _hashed(shape: TableShape) -> sql.Composable:
    """``k`` (key text), ``h`` (row md5) per published row of the table."""
    return sql.SQL("SELECT {key} AS k, {row} AS h FROM {published}").format(
        key=source_row(shape.key_columns),
        row=source_md5(source_row(shape.columns)),
        published=_published_rows(shape),
    )


def _published_rows(shape: TableShape) -> sql.Composable:
    """The table under its alias, with the publication's row filter when it has one. The
    filter is the server's own text (``pg_get_expr``, printed under this session's
    ``search_path``), so it goes in as SQL, as in capture's snapshot
    (:func:`capture.snapshot.worker.chunk_query`)."""
    table = sql.SQL("{} AS {}").format(shape.table.identifier, sql.Identifier(SOURCE_ALIAS))
    if shape.row_filter is None:
        return table
    return sql.SQL("{} WHERE ({})").format(table, sql.SQL(shape.row_filter))


def estimated_rows(conn: Connection, table: TableRef) -> int:
    """The planner's estimate (``reltuples``; -1, never analysed, counts as 0)."""
    try:
        row = conn.execute(
            "SELECT c.reltuples::int8 FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            [table.schema, table.name],
        ).fetchone()
    except psycopg.Error as exc:
        raise TransientError(f"reading the size of {table.qualified} failed: {exc}") from exc
    return max(0, int(row[0])) if row is not None else 0


def bucket_stats(conn: Connection, shape: TableShape, buckets: int) -> dict[int, BucketStats]:
    query = sql.SQL(
        "SELECT b, count(*), sum(v) FROM (SELECT {bucket} AS b, {value} AS v FROM ({hashed}) r) s "
        "GROUP BY b"
    ).format(
        bucket=source_bucket(source_md5(sql.SQL("k")), buckets),
        value=source_value60(sql.SQL("h")),
        hashed=_hashed(shape),
    )
    rows = _fetch(conn, query, [], shape)
    return {int(b): BucketStats(int(n), int(s)) for b, n, s in rows}


def rows_in_buckets(
    conn: Connection, shape: TableShape, buckets: int, chosen: Sequence[int]
) -> dict[str, SourceRow]:
    query = sql.SQL(
        "SELECT k, h, count(*) FROM ({hashed}) r WHERE {bucket} = ANY(%s) GROUP BY k, h"
    ).format(hashed=_hashed(shape), bucket=source_bucket(source_md5(sql.SQL("k")), buckets))
    return _key_rows(_fetch(conn, query, [list(chosen)], shape))


def rows_of_keys(conn: Connection, shape: TableShape, keys: Sequence[str]) -> dict[str, SourceRow]:
    query = sql.SQL("SELECT k, h, count(*) FROM ({hashed}) r WHERE k = ANY(%s) GROUP BY k, h")
    return _key_rows(_fetch(conn, query.format(hashed=_hashed(shape)), [list(keys)], shape))


def row_count(conn: Connection, shape: TableShape, sample: int) -> tuple[int, list[str]]:
    """Rows of the table, and up to ``sample`` of their keys (smallest first)."""
    count_query = sql.SQL("SELECT count(*) FROM {}").format(_published_rows(shape))
    count = int(_fetch(conn, count_query, [], shape)[0][0])
    keys_query = sql.SQL("SELECT k FROM ({hashed}) r ORDER BY k LIMIT %s").format(
        hashed=_hashed(shape)
    )
    return count, [str(row[0]) for row in _fetch(conn, keys_query, [sample], shape)]


def _key_rows(rows: Sequence[tuple[Any, ...]]) -> dict[str, SourceRow]:
    return {str(k): SourceRow(str(h), int(n)) for k, h, n in rows}


def _fetch(
    conn: Connection, query: sql.Composed, params: Sequence[Any], shape: TableShape
) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(query, params).fetchall()
    except psycopg.Error as exc:
        raise TransientError(f"verify query on {shape.table.qualified} failed: {exc}") from exc
