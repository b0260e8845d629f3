"""Source setup: check the server, the role and the tables; create or adopt the
publication and the replication slot. Idempotent, run at every start.

A table that cannot be captured correctly (no primary key and not ``REPLICA IDENTITY
FULL``; or ``REPLICA IDENTITY NOTHING``) is reported on its own with the statement that
fixes it; the other tables keep going. Everything else wrong at this stage (wal_level,
privileges, a missing table, a slot of another plugin or database) is a
:class:`~capture.errors.ConfigError`: starting anyway would capture the wrong thing.

At every attempt the service runs, in this order: :func:`connect_catalog`,
:func:`check_server`, :func:`capturable_tables` (which also publishes them), then, once the
control topic is read, :func:`adopt_slot`, which refuses a server that is not the one the
slot checkpoint was taken on (:mod:`capture.source.server_identity`), a slot whose position
cannot be trusted (:func:`check_slot_history`), a ``synchronized_standby_slots`` that would
stall it (:mod:`capture.source.standby_slots`), and a slot whose WAL is lost
(:mod:`capture.source.wal_safety`).

All SQL identifiers are composed with :mod:`psycopg.sql`, never formatted.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import psycopg
from psycopg import sql

from capture.errors import ConfigError, TableError, TransientError, slot_resync
from capture.metrics import CaptureMetrics
from capture.pgoutput import Relation, ReplicaIdentity
from capture.rows.typemap import SESSION_SETTINGS, libpq_options
from capture.settings import PostgresSettings
from capture.source.credentials import connection_error
from capture.source.publication import column_list_problem
from capture.source.server_identity import SourceServer, check_same_server
from capture.source.standby_slots import check_standby_slots
from capture.source.wal_safety import check, read_slot_wal
from schemas.control import ServerIdentity
from schemas.lsn import Lsn, format_lsn, parse_lsn

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[object, ...]]
PLUGIN = "pgoutput"


@dataclass(frozen=True, slots=True, order=True)
class TableRef:
    schema: str
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def identifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    @classmethod
    def parse(cls, text: str) -> TableRef:
        schema, dot, name = text.partition(".")
        if not dot or not schema or not name:
            raise ConfigError(f"table {text!r} must be schema-qualified, e.g. public.{text}")
        return cls(schema, name)


@dataclass(frozen=True, slots=True)
class SlotState:
    name: str
    created: bool
    confirmed_flush: Lsn
    """Where streaming resumes: the server re-sends every transaction that ends after it."""
    active: bool


@dataclass(frozen=True, slots=True)
class CapturedTables:
    """The tables of an attempt: the ones captured, and the ones that cannot be."""

    capturable: list[TableRef]
    problems: dict[TableRef, TableError]


def connect_catalog(dsn: str, password: str | None) -> Connection:
    """The attempt's ordinary connection to the source, under the session settings the
    parsers rely on (:data:`capture.rows.typemap.SESSION_SETTINGS`); a connection only a
    setting can fix is a :class:`~capture.errors.ConfigError`."""
    try:
        return psycopg.connect(
            dsn,
            password=password,
            autocommit=True,
            options=libpq_options(SESSION_SETTINGS),
        )
    except psycopg.OperationalError as exc:
        raise connection_error(exc) from exc


def capturable_tables(conn: Connection, postgres: PostgresSettings) -> CapturedTables:
    """The configured tables, each checked (also against a column list the publication
    already has for it, :mod:`capture.source.publication`); the capturable ones are added
    to the publication. A table that cannot be captured is logged with its fix and left
    out; none left is a :class:`~capture.errors.ConfigError`."""
    tables = resolve_tables(conn, postgres.tables, postgres.schemas)
    problems = check_tables(conn, tables)
    for table in tables:
        if table in problems:
            continue
        problem = column_list_problem(conn, postgres.publication, table.qualified)
        if problem is not None:
            problems[table] = problem
    for table, problem in problems.items():
        log.error("table not captured: %s", problem, extra={"table": table.qualified})
    capturable = [t for t in tables if t not in problems]
    if not capturable:
        raise ConfigError("no table can be captured; see the errors above")
    ensure_publication(conn, postgres.publication, capturable)
    return CapturedTables(capturable, problems)


def adopt_slot(
    conn: Connection,
    name: str,
    *,
    server: SourceServer,
    recorded: ServerIdentity | None,
    position: Lsn | None,
    checkpoint: Lsn | None,
    applied_topics: Collection[str],
    streamed_tables: Collection[str],
    warn_retained_bytes: int,
    metrics: CaptureMetrics,
) -> SlotState:
    """The slot to stream from, created if missing (only when the control topic holds no
    history of it: :func:`check_slot_history`), once ``server`` (the one reached now) is
    where the control topic's positions mean something (``recorded``: the server of the
    last checkpoint; ``position``: the newest LSN the pipeline holds), the slot's position
    can be trusted, nothing on the server would stall it, and its WAL is whole."""
    check_same_server(server, recorded, position=position, slot=name)
    timeline = server.identity.timeline
    check_slot_history(
        find_slot(conn, name),
        name,
        checkpoint=checkpoint,
        applied_topics=applied_topics,
        streamed_tables=streamed_tables,
        failed_over=recorded is not None and recorded.timeline != timeline,
        same_timeline=recorded is not None and recorded.timeline == timeline,
    )
    check_standby_slots(conn, name)
    slot = ensure_slot(conn, name)
    # A lost slot fails START_REPLICATION with a server error that looks transient;
    # said here, with the resync, it is not retried forever.
    check(
        read_slot_wal(conn, slot.name),
        slot=slot.name,
        warn_retained_bytes=warn_retained_bytes,
        metrics=metrics,
    )
    return slot


def check_slot_history(
    slot: SlotState | None,
    slot_name: str,
    *,
    checkpoint: Lsn | None,
    applied_topics: Collection[str],
    streamed_tables: Collection[str] = (),
    failed_over: bool = False,
    same_timeline: bool = False,
) -> None:
    """Refuse to stream when the slot's position cannot be trusted.

    ``checkpoint`` is the slot checkpoint capture last wrote to the control topic,
    ``applied_topics`` the change topics of this pipeline with applied records there,
    ``streamed_tables`` the tables whose changes capture has taken from the slot (their
    states there: :meth:`~capture.publish.control.ControlState.streamed_tables`), and
    ``failed_over`` whether the server's timeline moved on since that checkpoint (a
    promoted standby: :mod:`capture.source.server_identity`), ``same_timeline`` whether
    the checkpoint recorded this server on the timeline it is on now (neither: no server
    recorded, so a missing slot may have been lost either way).

    A missing slot is created only on a fresh start: no checkpoint, no applied record,
    no table whose changes were taken from it. Anything else on the control topic means
    capture streamed from a slot of this name, and a new one, made at the server's
    current WAL position, would skip every change between where capture was and now.
    Apply would never notice: the records already in Kafka reach the lake, with a gap
    after them. So a missing slot is refused when

    - the lake has applied records of our topics: the slot was dropped, or a promoted
      standby lacks it because it had no failover-ready copy (before PostgreSQL 17 a
      standby keeps no logical slot at all, and from 17 a copy that was not yet
      synchronized, still temporary, is dropped by the promotion);
    - capture checkpointed it, even with nothing applied yet: dropped on the same
      timeline, or missing on a promoted standby (the checkpoint is on the old one);
    - tables were being snapshotted or streamed from it, with no checkpoint yet: a
      checkpoint is written only once the slot can be confirmed past the point where it
      was made (apply applied something, or WAL with nothing for capture went by), so
      a slot dropped soon after capture began leaves only these.

    The fresh start is the resync (docs/operations.md, resync after a lost slot): it
    deletes the control topic with the rest, so the next start finds no history and
    creates the slot, and snapshots every table from there.

    A slot ahead of capture's last checkpoint is refused too: someone advanced it, and
    WAL in between may never have reached Kafka.

    A slot behind the checkpoint is accepted: capture confirms nothing before its
    checkpoint is delivered, so that is a slot whose confirmations never reached the
    server, or a promoted standby's synchronized copy, which trails the primary's. The
    server re-sends what followed, and apply drops what it already has (its replay
    filter: docs/apply.md, why a replay is safe).
    """
    applied = sorted(applied_topics)
    if slot is None and applied:
        held = f"the control topic shows applied changes for {', '.join(applied)}"
        raise ConfigError(_missing_slot(slot_name, held, failed_over, same_timeline))
    if slot is None and checkpoint is not None:
        where = " on the server this one was promoted from" if failed_over else ""
        held = (
            f"capture streamed it up to {format_lsn(checkpoint)}{where} (its last "
            "checkpoint on the control topic)"
        )
        raise ConfigError(_missing_slot(slot_name, held, failed_over, same_timeline))
    streamed = sorted(streamed_tables)
    if slot is None and streamed:
        held = (
            f"capture was taking the changes of {', '.join(streamed)} from it (their "
            "states on the control topic), before its first checkpoint"
        )
        raise ConfigError(_missing_slot(slot_name, held, failed_over, same_timeline))
    if slot is not None and checkpoint is not None and slot.confirmed_flush > checkpoint:
        raise ConfigError(
            f"replication slot {slot_name} is at {format_lsn(slot.confirmed_flush)}, past the "
            f"{format_lsn(checkpoint)} capture last confirmed: someone else advanced it "
            "and changes in between may be lost. Resync the pipeline: "
            f"{slot_resync(slot_name)}"
        )


def _missing_slot(slot_name: str, held: str, failed_over: bool, same_timeline: bool) -> str:
    """Why a missing slot is refused: what the pipeline ``held`` of it, why it is gone,
    and the resync."""
    if failed_over:
        cause = (
            "this server is a promoted standby (its timeline changed since capture's last "
            "checkpoint) with no copy of the slot: before PostgreSQL 17 a standby keeps no "
            "logical slots, and from 17 only a synchronized, failover-ready copy of a "
            "failover slot survives the promotion (docs/capture.md, a primary that fails "
            "over)"
        )
    elif same_timeline:
        cause = (
            "the slot was dropped (this is the server and the timeline capture last "
            "checkpointed it on, so no failover took it)"
        )
    else:
        cause = (
            "the slot was dropped (or, after a failover, the promoted standby had no "
            "failover-ready copy of it, which before PostgreSQL 17 it never has: "
            "docs/operations.md, a primary that fails over)"
        )
    return (
        f"replication slot {slot_name} does not exist, but {held}: {cause}, and a new slot "
        "would silently skip every change made since, so capture makes one only on a fresh "
        f"start, with no history of the slot on the control topic. Resync the pipeline: "
        f"{slot_resync()}"
    )


def check_server(conn: Connection) -> None:
    """wal_level and the role's right to replicate."""
    wal_level = _scalar(conn, "SHOW wal_level")
    if wal_level != "logical":
        raise ConfigError(
            f"wal_level is {wal_level}: set wal_level = logical in postgresql.conf (or "
            "ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL"
        )
    can_replicate = _scalar(
        conn, "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
    )
    if not can_replicate:
        user = _scalar(conn, "SELECT current_user")
        raise ConfigError(
            f"role {user} may not start replication: ALTER ROLE {user} WITH REPLICATION"
        )


def resolve_tables(
    conn: Connection, tables: Sequence[str], schemas: Sequence[str]
) -> list[TableRef]:
    """The listed tables plus every ordinary or partitioned table of the listed schemas."""
    if not tables and not schemas:
        raise ConfigError(
            "nothing to capture: set CAPTURE_POSTGRES__TABLES (e.g. '[\"public.orders\"]') "
            "or CAPTURE_POSTGRES__SCHEMAS"
        )
    refs = {TableRef.parse(t) for t in tables}
    for ref in sorted(refs):
        found = conn.execute(
            "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            [ref.schema, ref.name],
        ).fetchone()
        if found is None:
            raise ConfigError(f"table {ref.qualified} does not exist: fix CAPTURE_POSTGRES__TABLES")
        if found[0] not in ("r", "p"):
            raise ConfigError(f"{ref.qualified} is not a table (relkind {found[0]!r})")
    if schemas:
        rows = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') AND NOT c.relispartition",
            [list(schemas)],
        ).fetchall()
        refs |= {TableRef(str(s), str(n)) for s, n in rows}
    return sorted(refs)


def check_tables(conn: Connection, tables: Sequence[TableRef]) -> dict[TableRef, TableError]:
    """Tables that cannot be captured, each with the error that says how to fix it."""
    problems: dict[TableRef, TableError] = {}
    for ref in tables:
        row = conn.execute(
            "SELECT c.relreplident, "
            "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary), "
            "has_table_privilege(c.oid, 'SELECT') "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            [ref.schema, ref.name],
        ).fetchone()
        if row is None:
            problems[ref] = TableError(ref.qualified, "was dropped")
            continue
        identity, has_pk, can_select = ReplicaIdentity(str(row[0])), bool(row[1]), bool(row[2])
        if not can_select:
            problems[ref] = TableError(
                ref.qualified,
                f"the capture role may not read it: GRANT SELECT ON {ref.qualified} TO <role>",
            )
        elif identity is ReplicaIdentity.NOTHING or (
            identity is ReplicaIdentity.DEFAULT and not has_pk
        ):
            problems[ref] = TableError(
                ref.qualified,
                f"has no primary key and REPLICA IDENTITY {identity.name}, so updates and "
                f"deletes cannot name their row: run `ALTER TABLE {ref.qualified} REPLICA "
                "IDENTITY FULL` or add a primary key",
            )
    return problems


def ensure_publication(conn: Connection, name: str, tables: Sequence[TableRef]) -> None:
    """Create the publication for ``tables``, or add the ones an existing one lacks.

    Tables are never removed from an existing publication: it may be shared, and
    dropping a table from capture is an operator's decision. A table it already lists
    keeps its entry as it is, row filter and column list included: those are the
    operator's, and capture copies and streams what they let through
    (:mod:`capture.source.publication`). Tables capture adds get neither.
    """
    exists = conn.execute(
        "SELECT puballtables FROM pg_publication WHERE pubname = %s", [name]
    ).fetchone()
    if exists is None:
        if not tables:
            raise ConfigError("no capturable table left to publish")
        _publication_ddl(
            conn,
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(name), sql.SQL(", ").join(t.identifier for t in tables)
            ),
        )
        return
    _refuse_generated_columns(conn, name)
    if exists[0]:
        return
    published = {
        TableRef(str(s), str(t))
        for s, t in conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", [name]
        ).fetchall()
    }
    missing = [t for t in tables if t not in published]
    if missing:
        _publication_ddl(
            conn,
            sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                sql.Identifier(name), sql.SQL(", ").join(t.identifier for t in missing)
            ),
        )


def _refuse_generated_columns(conn: Connection, name: str) -> None:
    """Refuse a publication that streams generated columns (``publish_generated_columns
    = stored``, PostgreSQL 18+): the snapshot reads only ordinary columns, so its rows
    and the stream's would disagree on the table's columns. Capture creates its own
    publications without the option; this guards one it adopts."""
    if conn.info.server_version < 180000:
        return  # the option does not exist before 18
    row = conn.execute(
        "SELECT pubgencols FROM pg_publication WHERE pubname = %s", [name]
    ).fetchone()
    if row is not None and row[0] not in (None, "n"):
        raise ConfigError(
            f"publication {name} streams generated columns (publish_generated_columns = "
            "stored), which capture's snapshot leaves out: run `ALTER PUBLICATION "
            f'"{name}" SET (publish_generated_columns = none)` and start capture again '
            "(docs/capture.md, PostgreSQL versions)"
        )


def _publication_ddl(conn: Connection, statement: sql.Composed) -> None:
    """Run ``statement``; a role that may not is told what its DBA must run instead
    (docs/security.md, a least-privilege role)."""
    try:
        conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege as exc:
        text = statement.as_string(conn)
        raise ConfigError(
            f"capture's role may not run `{text}` ({exc.diag.message_primary}): have the "
            "publication's owner or a superuser run it once, then start capture again "
            "(docs/security.md)"
        ) from exc


def find_slot(conn: Connection, name: str) -> SlotState | None:
    """The slot ``name`` if it exists (checked like :func:`ensure_slot`), else None."""
    return None if _slot_row(conn, name) is None else ensure_slot(conn, name)


def ensure_slot(conn: Connection, name: str) -> SlotState:
    """Adopt the logical slot ``name``, or create it (streaming then starts at its
    consistent point). From PostgreSQL 17 a new slot is a failover slot: a standby with
    ``sync_replication_slots`` keeps a copy a promoted standby streams on from
    (docs/capture.md, PostgreSQL versions); an adopted slot keeps what it was made with."""
    created = False
    row = _slot_row(conn, name)
    if row is None:
        # temporary = false, two_phase = false, failover = true (17+ only).
        create = (
            "SELECT pg_create_logical_replication_slot(%s, %s, false, false, true)"
            if conn.info.server_version >= 170000
            else "SELECT pg_create_logical_replication_slot(%s, %s)"
        )
        try:
            conn.execute(create, [name, PLUGIN])
        except psycopg.errors.DuplicateObject:
            pass  # created concurrently: adopt it like any existing slot
        except psycopg.errors.ConfigurationLimitExceeded as exc:
            raise ConfigError(
                f"cannot create replication slot {name}: {exc.diag.message_primary}; raise "
                "max_replication_slots or drop unused slots"
            ) from exc
        else:
            created = True
        row = _slot_row(conn, name)
        if row is None:
            raise TransientError(f"replication slot {name} vanished right after creation")
    plugin, slot_type, same_db, confirmed, active = row
    if slot_type != "logical" or plugin != PLUGIN:
        raise ConfigError(
            f"replication slot {name} exists but is a {slot_type} slot for {plugin!r}: "
            "choose another CAPTURE_POSTGRES__SLOT or drop it"
        )
    if not same_db:
        raise ConfigError(
            f"replication slot {name} belongs to another database: point "
            "CAPTURE_POSTGRES__DSN at that database or choose another slot name"
        )
    return SlotState(name, created, parse_lsn(str(confirmed)), bool(active))


def _slot_row(conn: Connection, name: str) -> tuple[object, ...] | None:
    return conn.execute(
        "SELECT plugin, slot_type, database = current_database(), "
        "confirmed_flush_lsn::text, active "
        "FROM pg_replication_slots WHERE slot_name = %s",
        [name],
    ).fetchone()


def _scalar(conn: Connection, query: str) -> object:
    try:
        row = conn.execute(query).fetchone()
    except psycopg.OperationalError as exc:
        raise TransientError(f"postgres query failed: {exc}") from exc
    return None if row is None else row[0]


def key_by_primary_key(conn: Connection, relation: Relation) -> Relation:
    """``relation`` keyed by its primary key when it has ``REPLICA IDENTITY FULL``.

    pgoutput flags every column as part of the replica identity under FULL, which would
    make the whole row the Kafka key: every UPDATE would then look like a key change,
    and compaction would keep every version. FULL is chosen for its old-row images (and
    unchanged-TOAST values), not to change what identifies a row, so a primary key, when
    there is one, stays the key. Without one, the whole row is the key, as sent.
    """
    if relation.replica_identity is not ReplicaIdentity.FULL:
        return relation
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s AND i.indisprimary",
        [relation.oid],
    ).fetchall()
    primary = {str(r[0]) for r in rows}
    if not primary:
        return relation
    return replace(
        relation,
        columns=tuple(replace(c, is_key=c.name in primary) for c in relation.columns),
    )
