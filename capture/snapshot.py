"""Snapshot runs: copy tables consistently with the stream, in a worker thread.

A run snapshots a set of tables at one consistent point:

1. ``CREATE_REPLICATION_SLOT <tmp> TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT`` on a
   replication connection returns a consistent point ``C`` and an exported snapshot
   that sees exactly the transactions whose commit record starts before ``C``
   (https://www.postgresql.org/docs/current/protocol-replication.html). The temporary
   slot is never streamed; it exists only to tie the snapshot to an LSN, the way
   pg_duckpipe snapshots a table added later, so it works the same for the first start
   and for a table added while the main slot streams.
2. A ``REPEATABLE READ READ ONLY`` transaction imports it (``SET TRANSACTION SNAPSHOT``);
   then the replication connection is closed (the import keeps the snapshot alive, and
   the temporary slot goes away with its connection).
3. Per table, in that transaction: the table's columns are read from the catalog as a
   pgoutput Relation would list them (so the writer schema matches the stream's), a
   TRUNCATE record first unless the table was never captured before, then every row
   as a ``READ`` record, streamed
   with ``COPY (SELECT ...) TO STDOUT`` in text form and parsed by the stream's own
   parsers (:mod:`capture.copy_text`).

Positions: every record of the run carries commit LSN and change LSN ``C - 1`` (see
:mod:`capture.table_states` for why), ordinal 0 for the TRUNCATE and 1.. for the rows,
xid 0 (no transaction produced them) and the time the run started as commit time. The
leading TRUNCATE makes the lake table equal to the snapshot when it may hold rows
already (a resync, or a snapshot cut short and taken again): it erases only rows
positioned before it. A table captured for the first time gets none: nothing of it can
be in Kafka, because its state is flushed to the control topic before its first
snapshot record is produced.

The worker only reads PostgreSQL and encodes; it hands items to the capture loop
through a bounded queue, so publishing and every book update stay in the loop's thread
and a full queue (backpressure) simply stops the COPY.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from capture.change_stream import OutgoingRecord, SchemaRecord, TableCodec
from capture.copy_text import CopyRows
from capture.errors import ConfigError, PipelineError, TableError, TransientError
from capture.metrics import CaptureMetrics
from capture.pgoutput import Relation, RelationColumn, ReplicaIdentity
from capture.schema_registration import Framer, single_object
from capture.source import key_by_primary_key
from capture.typemap import SESSION_SETTINGS, ColumnMapping, libpq_options
from schemas.change_record import Change
from schemas.errors import ChangeEncodingError
from schemas.headers import change_headers
from schemas.lsn import Lsn, parse_lsn
from schemas.operation import Operation
from schemas.schema_topic import table_schema_messages

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]
DescribeWith = Callable[[Connection, Relation], Sequence[ColumnMapping]]
"""Column mappings of a relation, read through the given connection."""

_BATCH_ROWS = 500


@dataclass(frozen=True, slots=True)
class SnapshotTaken:
    """The run's consistent point is known: held changes at or below ``snapshot_lsn``
    are in the snapshot."""

    tables: tuple[str, ...]
    snapshot_lsn: Lsn


@dataclass(frozen=True, slots=True)
class SnapshotRecords:
    table: str
    schemas: tuple[SchemaRecord, ...]
    records: tuple[OutgoingRecord, ...]


@dataclass(frozen=True, slots=True)
class TableCopied:
    table: str
    rows: int


@dataclass(frozen=True, slots=True)
class TableFailed:
    """A definite problem with one table (e.g. a value the contract cannot carry); the
    run goes on with the others."""

    error: TableError


@dataclass(frozen=True, slots=True)
class RunFailed:
    """The run cannot go on (connection lost...): the capture attempt ends with it."""

    error: PipelineError


@dataclass(frozen=True, slots=True)
class RunFinished:
    pass


SnapshotItem = SnapshotTaken | SnapshotRecords | TableCopied | TableFailed | RunFailed | RunFinished


def relation_from_catalog(conn: Connection, table: str) -> Relation:
    """``table`` as a pgoutput Relation message would describe it: the same columns in
    the same order (no dropped or generated ones), keyed as the stream keys it: the
    replica identity index's columns, and under ``REPLICA IDENTITY FULL`` the primary key
    (every column without one; :func:`capture.source.key_by_primary_key`)."""
    schema, _, name = table.partition(".")
    row = conn.execute(
        "SELECT c.oid, c.relreplident FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        [schema, name],
    ).fetchone()
    if row is None:
        raise TableError(table, "was dropped before its snapshot")
    oid, identity = int(row[0]), ReplicaIdentity(str(row[1]))
    columns = conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, "
        "  %s OR a.attnum = ANY(COALESCE(("
        "    SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = a.attrelid AND "
        "    CASE %s WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident "
        "    ELSE false END), '{}')) "
        "FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 "
        "AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
        [identity is ReplicaIdentity.FULL, identity.value, oid],
    ).fetchall()
    # Then the stream's own rule for REPLICA IDENTITY FULL (the primary key, if any).
    return key_by_primary_key(
        conn,
        Relation(
            xid=None,
            oid=oid,
            namespace=schema,
            name=name,
            replica_identity=identity,
            columns=tuple(
                RelationColumn(is_key=bool(k), name=str(n), type_oid=int(t), type_modifier=int(m))
                for n, t, m, k in columns
            ),
        ),
    )


class SnapshotRun:
    """One run over ``tables``, in a daemon thread; results arrive on :attr:`items`."""

    def __init__(
        self,
        *,
        dsn: str,
        password: str | None,
        slot: str,
        tables: Sequence[str],
        truncate: Collection[str],
        describe: DescribeWith,
        topic_prefix: str,
        queue_size: int = 64,
        metrics: CaptureMetrics | None = None,
        progress_interval_s: float = 30.0,
        framer: Framer = single_object,
    ) -> None:
        self.tables = tuple(tables)
        self._framer = framer
        self._metrics = metrics
        self._progress_interval_s = progress_interval_s
        self._truncate = frozenset(truncate)
        self.items: queue.Queue[SnapshotItem] = queue.Queue(queue_size)
        self._dsn = dsn
        self._password = password
        # Temporary slot names must be unique among live slots, not over time.
        self._temp_slot = f"{slot[:40]}_snap_{os.getpid()}_{threading.get_ident() % 10_000}"
        self._describe = describe
        self._prefix = topic_prefix
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snapshot", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self, timeout_s: float = 10.0) -> None:
        """Stop copying (the capture attempt is ending); waits briefly for the thread."""
        self._cancel.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self.items.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout_s)

    def _put(self, item: SnapshotItem) -> None:
        while not self._cancel.is_set():
            try:
                self.items.put(item, timeout=0.1)
            except queue.Full:
                continue
            return
        raise _CancelledError

    def _run(self) -> None:
        try:
            with self._connect(replication=False) as conn:
                snapshot_lsn = self._import_snapshot(conn)
                self._put(SnapshotTaken(self.tables, snapshot_lsn))
                started = time.time_ns() // 1000
                for table in self.tables:
                    try:
                        rows = self._copy(conn, table, snapshot_lsn, started)
                    except TableError as exc:
                        self._put(TableFailed(exc))
                    except ChangeEncodingError as exc:
                        self._put(TableFailed(TableError(table, str(exc))))
                    else:
                        self._put(TableCopied(table, rows))
                conn.rollback()
            self._put(RunFinished())
        except _CancelledError:
            return
        except PipelineError as exc:
            self._put_final(RunFailed(exc))
        except psycopg.Error as exc:
            self._put_final(RunFailed(TransientError(f"snapshot failed: {exc}")))

    def _put_final(self, item: SnapshotItem) -> None:
        with contextlib.suppress(_CancelledError):  # the loop is gone and will not read it
            self._put(item)

    def _connect(self, *, replication: bool) -> Connection:
        try:
            if replication:
                return psycopg.connect(
                    self._dsn,
                    password=self._password,
                    autocommit=True,
                    replication="database",
                    options=libpq_options(SESSION_SETTINGS),
                )
            return psycopg.connect(
                self._dsn, password=self._password, options=libpq_options(SESSION_SETTINGS)
            )
        except psycopg.OperationalError as exc:
            raise TransientError(f"snapshot cannot connect to PostgreSQL: {exc}") from exc

    def _import_snapshot(self, conn: Connection) -> Lsn:
        """Open ``conn``'s transaction on a fresh exported snapshot; its position."""
        with self._connect(replication=True) as replication:
            try:
                row = replication.execute(
                    sql.SQL(
                        "CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT"
                    ).format(sql.Identifier(self._temp_slot))
                ).fetchone()
            except psycopg.errors.ConfigurationLimitExceeded as exc:
                raise ConfigError(
                    f"a snapshot needs one more replication slot and WAL sender for a moment: "
                    f"{exc.diag.message_primary}; raise max_replication_slots and "
                    "max_wal_senders by one"
                ) from exc
            if row is None:
                raise TransientError("CREATE_REPLICATION_SLOT returned no consistent point")
            consistent_point, snapshot_name = parse_lsn(str(row[1])), str(row[2])
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        log.info("snapshot of %s at %s", ", ".join(self.tables), row[1])
        return Lsn(consistent_point - 1)

    def _copy(self, conn: Connection, table: str, snapshot_lsn: Lsn, started: int) -> int:
        relation = relation_from_catalog(conn, table)
        codec = TableCodec(relation, self._describe(conn, relation), self._prefix, self._framer)
        schemas = tuple(SchemaRecord(m.key, m.value) for m in table_schema_messages(codec.schemas))
        fingerprint = codec.schemas.value_fingerprint

        def record(op: Operation, ordinal: int, after: dict[str, Any] | None) -> OutgoingRecord:
            change = Change(
                op=op,
                commit_lsn=snapshot_lsn,
                change_lsn=snapshot_lsn,
                xid=0,
                commit_ts=started,
                ordinal=ordinal,
                after=after,
            )
            return OutgoingRecord(
                codec.topic,
                codec.encoder.encode_key(change),
                codec.encoder.encode_value(change),
                change_headers(change, fingerprint),
                table,
            )

        batch = [record(Operation.TRUNCATE, 0, None)] if table in self._truncate else []
        ordinal = 0
        progress = _Progress(
            table, _row_estimate(conn, relation.oid), self._metrics, self._progress_interval_s
        )
        parser = CopyRows(len(relation.columns))
        query = sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(
            sql.SQL(", ").join(sql.Identifier(c.name) for c in relation.columns),
            sql.Identifier(relation.namespace, relation.name),
        )
        failure: TableError | None = None
        with conn.cursor().copy(query) as copy:
            for chunk in copy:
                if self._cancel.is_set():
                    raise _CancelledError
                if failure is not None:
                    # Read the COPY to its end: leaving it early would abort the
                    # transaction the other tables of the run are read in.
                    continue
                try:
                    for data in parser.feed(bytes(chunk)):
                        after, _ = codec.row(data)
                        ordinal += 1
                        batch.append(record(Operation.READ, ordinal, after))
                except ChangeEncodingError as exc:
                    failure = TableError(table, str(exc))
                except TableError as exc:
                    failure = exc
                if len(batch) >= _BATCH_ROWS and failure is None:
                    self._put(SnapshotRecords(table, schemas, tuple(batch)))
                    batch = []
                    progress.rows(ordinal)
        if failure is not None:
            raise failure
        parser.finish()
        if batch:
            self._put(SnapshotRecords(table, schemas, tuple(batch)))
        progress.rows(ordinal)
        return ordinal


def _row_estimate(conn: Connection, oid: int) -> int | None:
    """The planner's row count of the table (``pg_class.reltuples``), None when the
    table was never vacuumed or analyzed (-1 since PostgreSQL 14)."""
    row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = %s", [oid]).fetchone()
    if row is None or row[0] is None or float(row[0]) < 0:
        return None
    return int(float(row[0]))


class _Progress:
    """Rows copied of one table: the metrics at every batch, a log line every
    ``interval_s`` (rows, estimate, rate) so a long snapshot is never silent."""

    def __init__(
        self,
        table: str,
        estimate: int | None,
        metrics: CaptureMetrics | None,
        interval_s: float,
    ) -> None:
        self._table = table
        self._estimate = estimate
        self._metrics = metrics
        self._interval_s = interval_s
        self._started = self._last_line = time.monotonic()
        if metrics is not None:
            metrics.snapshot_rows.labels(table).set(0)
            metrics.snapshot_rows_estimate.labels(table).set(-1 if estimate is None else estimate)

    def rows(self, done: int) -> None:
        if self._metrics is not None:
            self._metrics.snapshot_rows.labels(self._table).set(done)
        now = time.monotonic()
        if now - self._last_line < self._interval_s:
            return
        self._last_line = now
        rate = done / max(now - self._started, 1e-9)
        if self._estimate:
            log.info(
                "snapshot of %s: %d of about %d rows (%.0f%%), %.0f rows/s",
                self._table,
                done,
                self._estimate,
                100.0 * done / self._estimate,
                rate,
                extra={"table": self._table},
            )
        else:
            log.info(
                "snapshot of %s: %d rows (no estimate: the table was never analyzed), %.0f rows/s",
                self._table,
                done,
                rate,
                extra={"table": self._table},
            )


class _CancelledError(Exception):
    """The capture loop cancelled the run."""
