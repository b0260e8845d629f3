"""Snapshot runs: copy tables consistently with the stream, in chunks, in parallel.

A run snapshots a set of tables at one consistent point:

1. ``CREATE_REPLICATION_SLOT <tmp> TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT`` on a
   replication connection returns a consistent point ``C`` and an exported snapshot
   that sees exactly the transactions whose commit record starts before ``C``
   (https://www.postgresql.org/docs/current/protocol-replication.html). The temporary
   slot is never streamed; it exists only to tie the snapshot to an LSN, the way
   pg_duckpipe snapshots a table added later, so it works the same for the first start
   and for a table added while the main slot streams.
2. The run's thread imports it in a ``REPEATABLE READ READ ONLY`` transaction
   (``SET TRANSACTION SNAPSHOT``) and plans each table there: the publication's row
   filter and column list for it, as of ``C`` (:mod:`capture.source.publication`), its
   columns as a pgoutput Relation would list them (only the published ones, so the
   writer schema matches the stream's), its codec, and its chunks
   (:mod:`capture.snapshot.chunks`: ``ctid`` block ranges).
3. With more than one worker and more than one chunk, worker processes
   (:mod:`capture.snapshot.worker`) each import the same snapshot; the replication
   connection stays open until every one has (an exported snapshot lives only as long
   as the transaction that exported it), then closes, and the temporary slot with it.
4. The chunks of every table form one queue, one table's chunk after another's in turn;
   each chunk is a ``COPY (SELECT ... WHERE ctid ... AND (<row filter>)) TO STDOUT`` in
   text form (the server filters the stream, never a ``COPY``), parsed
   by the stream's own parsers (:mod:`capture.snapshot.copy_text`). At most one chunk per
   worker is in flight; each table's records are published in chunk order
   (:class:`~capture.snapshot.chunks.ChunkSequencer`), so records of a later chunk that
   arrive early are held, at most ``workers`` chunks' worth. With one worker, or a run
   of one chunk, the run's thread reads the chunks itself, in the same order.

Positions: every record of the run carries commit LSN and change LSN ``C - 1`` (see
:mod:`capture.stream.table_states` for why), ordinal 0 for the TRUNCATE and
``chunk * 2**32 + i`` for row ``i`` (from 1) of a chunk: unique, increasing in publish
order, not consecutive, and the same however many workers read them. xid is 0 (no
transaction produced them) and the time the run started is the commit time. The
leading TRUNCATE makes the lake table equal to the snapshot when it may hold rows
already (a resync, or a snapshot cut short and taken again): it erases only rows
positioned before it. A table captured for the first time gets none: nothing of it can
be in Kafka, because its state is flushed to the control topic before its first
snapshot record is produced.

The run only reads PostgreSQL and encodes; it hands items to the capture loop through a
bounded queue, so publishing and every book update stay in the loop's thread and a full
queue (backpressure) stops the run's thread, then the workers, whose pipes fill. A
table's ``TableCopied`` follows its last published record. A value the contract cannot
carry fails its table only; a lost connection or worker fails the run (``RunFailed``),
and the run's end -- finished, failed or cancelled -- stops every worker.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from capture.errors import ConfigError, PipelineError, TableError, TransientError
from capture.metrics import CaptureMetrics
from capture.pgoutput import Relation, RelationColumn, ReplicaIdentity
from capture.publish.schema_registration import Framer, single_object
from capture.records import OutgoingRecord, SchemaRecord
from capture.rows.codec import TableCodec
from capture.snapshot.chunks import (
    TID_RANGE_SCAN_VERSION,
    Chunk,
    ChunkSequencer,
    TableSize,
    dispatch_order,
    plan_chunks,
)
from capture.snapshot.worker import (
    ChunkFailed,
    ChunkRead,
    ChunkRows,
    ChunkTask,
    Connection,
    DescribeWith,
    SnapshotCancelledError,
    SnapshotPoint,
    TableJob,
    WorkerPool,
    WorkerSetup,
    connect,
    import_snapshot,
    read_chunk,
    unexpected_message,
)
from capture.source.publication import column_list_problem, read_filter
from capture.source.setup import key_by_primary_key
from schemas.change_record import Change, RecordFraming, TableSchemas
from schemas.control import PublicationFilter, SnapshotResume
from schemas.errors import ChangeEncodingError
from schemas.headers import Headers, change_headers, record_headers
from schemas.lsn import Lsn, format_lsn, parse_lsn
from schemas.operation import Operation
from schemas.schema_topic import table_schema_messages

__all__ = [
    "ChunkPublished",
    "Connection",
    "DescribeWith",
    "RunFailed",
    "RunFinished",
    "SnapshotItem",
    "SnapshotRecords",
    "SnapshotRun",
    "SnapshotTaken",
    "TableCopied",
    "TableFailed",
    "default_workers",
    "relation_from_catalog",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SnapshotTaken:
    """The run's consistent point is known: held changes at or below ``snapshot_lsn``
    are in the snapshot. ``publications``: the row filter and column list each planned
    table's rows are copied under (:mod:`capture.source.publication`)."""

    tables: tuple[str, ...]
    snapshot_lsn: Lsn
    publications: Mapping[str, PublicationFilter] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SnapshotRecords:
    """A batch of one table's snapshot records, in order: ``keys[i]`` and ``values[i]``,
    all on ``topic`` with ``headers`` (a batch shares them: one operation, one
    position, one writer schema). Kept as parallel lists, not records, because the loop
    produces them one by one and the objects would be built only to be taken apart."""

    table: str
    schemas: tuple[SchemaRecord, ...]
    topic: str
    headers: Headers
    keys: list[bytes]
    """A list, as the compiled partitioner reads it (capture/publish/partitioning.py)."""
    values: Sequence[bytes]

    @property
    def records(self) -> tuple[OutgoingRecord, ...]:
        """The batch as whole records."""
        return tuple(
            OutgoingRecord(self.topic, key, value, self.headers, self.table)
            for key, value in zip(self.keys, self.values, strict=True)
        )


@dataclass(frozen=True, slots=True)
class ChunkPublished:
    """Every record of the table's chunks before ``resume.chunk`` was handed to the loop:
    once they are in Kafka, a capture that restarts resumes the table there."""

    table: str
    resume: SnapshotResume


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


SnapshotItem = (
    SnapshotTaken
    | SnapshotRecords
    | ChunkPublished
    | TableCopied
    | TableFailed
    | RunFailed
    | RunFinished
)


def relation_from_catalog(
    conn: Connection, table: str, published: PublicationFilter | None = None
) -> Relation:
    """``table`` as a pgoutput Relation message would describe it: the same columns in
    the same order (no dropped or generated ones; only those of the publication's column
    list, ``published.columns``, when it has one, which may name a stored generated
    column from PostgreSQL 18 on: pgoutput sends it then), keyed as the stream keys it: the
    replica identity index's columns, and under ``REPLICA IDENTITY FULL`` the primary key
    (every column without one; :func:`capture.source.setup.key_by_primary_key`)."""
    schema, _, name = table.partition(".")
    row = conn.execute(
        "SELECT c.oid, c.relreplident FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        [schema, name],
    ).fetchone()
    if row is None:
        raise TableError(table, "was dropped before its snapshot")
    oid, identity = int(row[0]), ReplicaIdentity(str(row[1]))
    listed = None if published is None else published.columns
    columns = conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, "
        "  %s OR a.attnum = ANY(COALESCE(("
        "    SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = a.attrelid AND "
        "    CASE %s WHEN 'd' THEN i.indisprimary WHEN 'i' THEN i.indisreplident "
        "    ELSE false END), '{}')) "
        "FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 "
        "AND NOT a.attisdropped AND (a.attgenerated = '' OR a.attname = ANY(%s)) "
        "ORDER BY a.attnum",
        [identity is ReplicaIdentity.FULL, identity.value, oid, list(listed or ())],
    ).fetchall()
    if listed is not None:
        columns = [c for c in columns if str(c[0]) in listed]
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


@dataclass(slots=True)
class _Table:
    """One table of the run, as planned in the run's transaction."""

    name: str
    codec: TableCodec
    job: TableJob
    schemas: tuple[SchemaRecord, ...]
    headers: Headers
    chunks: tuple[Chunk, ...]
    progress: _Progress
    point: SnapshotPoint
    """Where its records sit (:attr:`TableJob.point`)."""
    published: PublicationFilter
    """The row filter and column list its rows are copied under."""
    rows: int = 0


_CGROUP_CPU_LIMITS = (
    # cgroup v2: "<quota> <period>" or "max <period>"
    (Path("/sys/fs/cgroup/cpu.max"), None),
    # cgroup v1: quota and period in two files; quota -1 means no limit
    (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")),
)


def default_workers() -> int:
    """The cores this process may run on: its CPU affinity, and no more than its
    container's CPU limit (a pod limited to 2 CPUs on a 64-core node gets 2, not 64)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    limit = cgroup_cpu_limit()
    return max(1, min(cores or 1, limit if limit is not None else cores or 1))


def cgroup_cpu_limit(
    limits: Sequence[tuple[Path, Path | None]] = _CGROUP_CPU_LIMITS,
) -> int | None:
    """CPUs the cgroup's CFS quota allows, rounded up; None without a limit."""
    for quota_file, period_file in limits:
        try:
            if period_file is None:
                quota_text, period_text = quota_file.read_text().split()[:2]
            else:
                quota_text, period_text = quota_file.read_text(), period_file.read_text()
        except (OSError, ValueError):
            continue
        quota, period = quota_text.strip(), period_text.strip()
        if quota in {"max", "-1"}:
            return None
        try:
            return max(1, math.ceil(int(quota) / int(period)))
        except (ValueError, ZeroDivisionError):
            continue
    return None


class SnapshotRun:
    """One run over ``tables``, coordinated by a daemon thread; results arrive on
    :attr:`items`. ``workers`` processes read the chunks (default: one per core); with
    one, or a run of one chunk, the thread reads them itself."""

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
        workers: int | None = None,
        chunk_rows: int = 100_000,
        resume: Mapping[str, tuple[Lsn, SnapshotResume]] | None = None,
        compiled_rows: bool = True,
        publication: str | None = None,
    ) -> None:
        """``resume``: tables whose snapshot was cut short after some of its chunks were
        published, with their position and where to go on (``truncate`` must not name
        them): their remaining chunks are read at this run's point and published at
        theirs (docs/capture.md, "Resuming a snapshot"). ``compiled_rows``: as
        :attr:`capture.stream.change_stream.ChangeStream.compiled_rows`.
        ``publication``: the stream's publication, whose row filter and column list of
        each table the copy follows (:mod:`capture.source.publication`); None copies
        every row and column."""
        self.tables = tuple(tables)
        self._resume = dict(resume or {})
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
        self._compiled_rows = compiled_rows
        self._publication = publication
        self._workers = default_workers() if workers is None else workers
        if self._workers < 1:
            raise ValueError("a snapshot needs at least one worker")
        self._chunk_rows = chunk_rows
        self._pool: WorkerPool | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snapshot", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self, timeout_s: float = 10.0) -> None:
        """Stop copying (the capture attempt is ending); waits briefly for the thread,
        which stops the workers. Workers it could not stop in time are killed here."""
        self._cancel.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self.items.get_nowait()
            except queue.Empty:
                break
        self._thread.join(max(timeout_s - 1.0, 0.1))
        pool = self._pool
        if pool is not None and self._thread.is_alive():
            pool.kill()

    def _put(self, item: SnapshotItem) -> None:
        while not self._cancel.is_set():
            try:
                self.items.put(item, timeout=0.1)
            except queue.Full:
                continue
            return
        raise SnapshotCancelledError

    def _run(self) -> None:
        try:
            with connect(self._dsn, self._password) as conn:
                exporter = connect(self._dsn, self._password, replication=True)
                with exporter:
                    snapshot_name, snapshot_lsn = self._export(exporter, conn)
                    point = SnapshotPoint(snapshot_lsn, time.time_ns() // 1000)
                    tables, failures = self._plan(conn, point)
                    order = dispatch_order(t.chunks for t in tables.values())
                    workers = min(self._workers, len(order))
                    log.info(
                        "snapshot: %d chunks of about %d rows in %d tables, %s",
                        len(order),
                        self._chunk_rows,
                        len(tables),
                        f"{workers} worker processes" if workers > 1 else "read in one thread",
                    )
                    if workers > 1:
                        setup = WorkerSetup(
                            self._dsn, self._password, snapshot_name, self._describe
                        )
                        self._pool = WorkerPool(workers, setup)
                        # The exported snapshot lives until its connection closes or
                        # runs another command: every worker imports it first.
                        self._pool.wait_ready(self._cancel.is_set)
                # Taken once the rows can flow: the loop marks the tables as in their
                # snapshot now, and their first records follow at once.
                self._put(
                    SnapshotTaken(
                        self.tables,
                        snapshot_lsn,
                        {name: table.published for name, table in tables.items()},
                    )
                )
                for failure in failures:
                    self._put(failure)
                if self._pool is None:
                    self._copy_in_thread(conn, tables, order)
                else:
                    # The workers hold the snapshot now; an idle open transaction here
                    # could only be ended by idle_in_transaction_session_timeout.
                    conn.rollback()
                    self._copy_in_workers(self._pool, tables, order)
                    self._pool.stop(graceful=True)
                conn.rollback()
            self._put(RunFinished())
        except SnapshotCancelledError:
            return
        except PipelineError as exc:
            self._put_final(RunFailed(exc))
        except psycopg.Error as exc:
            self._put_final(RunFailed(TransientError(f"snapshot failed: {exc}")))
        except Exception as exc:
            # A bug: the loop must still hear of it, or it would wait for the run forever.
            log.exception("snapshot run failed unexpectedly")
            self._put_final(
                RunFailed(TransientError(f"snapshot failed unexpectedly: {type(exc).__name__}"))
            )
        finally:
            if self._pool is not None:
                self._pool.stop(graceful=False)

    def _put_final(self, item: SnapshotItem) -> None:
        with contextlib.suppress(SnapshotCancelledError):  # the loop is gone: not read
            self._put(item)

    def _export(self, replication: Connection, conn: Connection) -> tuple[str, Lsn]:
        """Export a snapshot on ``replication`` and open ``conn``'s transaction on it:
        its name and the run's position."""
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
        import_snapshot(conn, snapshot_name)
        log.info("snapshot of %s at %s", ", ".join(self.tables), row[1])
        return snapshot_name, Lsn(consistent_point - 1)

    # -- planning --------------------------------------------------------------------------

    def _plan(
        self, conn: Connection, point: SnapshotPoint
    ) -> tuple[dict[str, _Table], list[TableFailed]]:
        """Each table's codec and chunks; a table that cannot be planned fails alone."""
        tables: dict[str, _Table] = {}
        failures: list[TableFailed] = []
        tid_range_scans = conn.info.server_version >= TID_RANGE_SCAN_VERSION
        for name in self.tables:
            try:
                tables[name] = self._plan_table(conn, name, point, tid_range_scans=tid_range_scans)
            except TableError as exc:
                failures.append(TableFailed(exc))
            except ChangeEncodingError as exc:
                failures.append(TableFailed(TableError(name, str(exc))))
        return tables, failures

    def _plan_table(
        self, conn: Connection, name: str, point: SnapshotPoint, *, tid_range_scans: bool
    ) -> _Table:
        published = PublicationFilter()
        if self._publication is not None:
            # Read in the snapshot: the entry as of its consistent point, the one
            # pgoutput applies to the changes that follow it.
            published = read_filter(conn, self._publication, name)
            problem = column_list_problem(conn, self._publication, name)
            if problem is not None:
                raise problem
        relation = relation_from_catalog(conn, name, published)
        framings: list[RecordFraming] = []

        def framer(schemas: TableSchemas, topic: str) -> RecordFraming:
            framing = self._framer(schemas, topic)
            framings.append(framing)
            return framing

        codec = TableCodec(
            relation,
            self._describe(conn, relation),
            self._prefix,
            framer,
            compiled=self._compiled_rows,
        )
        fingerprint = codec.schemas.value_fingerprint
        size = _table_size(conn, relation.oid)
        resumed = self._resume.get(name)
        estimate = None if size.tuples < 0 else int(size.tuples)
        if resumed is None:
            chunks = plan_chunks(name, size, self._chunk_rows, tid_range_scans=tid_range_scans)
        else:
            lsn, resume = resumed
            point = SnapshotPoint(lsn, point.commit_ts)
            chunks = plan_chunks(
                name, size, self._chunk_rows, tid_range_scans=tid_range_scans, resume=resume
            )
            if estimate is not None and size.blocks > 0:
                estimate = int(estimate * max(size.blocks - resume.block, 0) / size.blocks)
            log.info(
                "snapshot of %s resumes at block %d (chunk %d was cut short), its rows at %s",
                name,
                resume.block,
                resume.chunk,
                format_lsn(lsn),
                extra={"table": name},
            )
        return _Table(
            name=name,
            codec=codec,
            job=TableJob(
                relation,
                self._prefix,
                framings[-1],
                fingerprint,
                point,
                self._compiled_rows,
                published.row_filter,
            ),
            schemas=tuple(
                SchemaRecord(m.key, m.value) for m in table_schema_messages(codec.schemas)
            ),
            headers=record_headers(Operation.READ, point.lsn, point.lsn, fingerprint),
            chunks=chunks,
            progress=_Progress(name, estimate, self._metrics, self._progress_interval_s),
            point=point,
            published=published,
        )

    # -- copying ---------------------------------------------------------------------------

    def _copy_in_thread(
        self,
        conn: Connection,
        tables: dict[str, _Table],
        order: Sequence[Chunk],
    ) -> None:
        """Every chunk read here, one after the other (one worker, or one chunk)."""
        failed: set[str] = set()
        for chunk in order:
            table = tables[chunk.table]
            if table.name in failed:
                continue
            if chunk.index == 0:
                self._begin(table)

            def emit(keys: list[bytes], values: list[bytes], table: _Table = table) -> None:
                self._publish(table, keys, values)

            try:
                read_chunk(
                    conn,
                    table.codec,
                    chunk,
                    table.point,
                    emit=emit,
                    cancelled=self._cancel.is_set,
                    row_filter=table.job.row_filter,
                )
            except TableError as exc:
                failed.add(table.name)
                self._put(TableFailed(exc))
            else:
                if chunk.last:
                    self._finish(table)
                else:
                    self._chunk_published(table, chunk.index + 1)

    def _copy_in_workers(
        self,
        pool: WorkerPool,
        tables: dict[str, _Table],
        order: Sequence[Chunk],
    ) -> None:
        """Chunks read by the workers, at most one per worker in flight, each table's
        published in chunk order (:class:`ChunkSequencer`)."""
        pending = collections.deque(order)
        sequencer: ChunkSequencer[tuple[list[bytes], list[bytes]]] = ChunkSequencer(
            {t.name: t.chunks for t in tables.values()}
        )
        failed: set[str] = set()
        while pending or pool.busy():
            if self._cancel.is_set():
                raise SnapshotCancelledError
            for worker in pool.idle():
                while pending and pending[0].table in failed:
                    pending.popleft()
                if not pending or sequencer.in_flight >= len(pool.workers):
                    break
                chunk = pending.popleft()
                table = tables[chunk.table]
                if chunk.index == 0:
                    self._begin(table)
                sequencer.start(chunk)
                pool.assign(worker, ChunkTask(chunk, table.job))
            for worker, message in pool.receive(pool.workers, timeout_s=0.1):
                if isinstance(message, ChunkRows):
                    table = tables[message.chunk.table]
                    for keys, values in sequencer.add(
                        message.chunk, (message.keys, message.values)
                    ):
                        self._publish(table, keys, values)
                elif isinstance(message, ChunkRead):
                    worker.chunk = None
                    table = tables[message.chunk.table]
                    published = sequencer.done(message.chunk)
                    for index, batches in published.chunks:
                        for keys, values in batches:
                            self._publish(table, keys, values)
                        if index + 1 < message.chunk.count:
                            self._chunk_published(table, index + 1)
                    if published.complete:
                        self._finish(table)
                    for keys, values in published.next_batches:
                        self._publish(table, keys, values)
                elif isinstance(message, ChunkFailed):
                    worker.chunk = None
                    name = message.chunk.table
                    if name not in failed:
                        failed.add(name)
                        sequencer.drop(name)
                        self._put(TableFailed(TableError(name, message.message)))
                else:
                    raise unexpected_message(message)

    def _begin(self, table: _Table) -> None:
        """Before the table's first row: a TRUNCATE when it may hold rows already."""
        if table.name not in self._truncate:
            return
        codec, point = table.codec, table.point
        change = Change(
            op=Operation.TRUNCATE,
            commit_lsn=point.lsn,
            change_lsn=point.lsn,
            xid=0,
            commit_ts=point.commit_ts,
            ordinal=0,
        )
        self._put(
            SnapshotRecords(
                table.name,
                table.schemas,
                codec.topic,
                change_headers(change, codec.schemas.value_fingerprint),
                [codec.encoder.encode_key(change)],
                [codec.encoder.encode_value(change)],
            )
        )

    def _publish(self, table: _Table, keys: list[bytes], values: list[bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError("a batch has one value per key")
        topic, headers, name = table.codec.topic, table.headers, table.name
        self._put(SnapshotRecords(name, table.schemas, topic, headers, keys, values))
        table.rows += len(keys)
        table.progress.rows(table.rows)

    def _chunk_published(self, table: _Table, next_chunk: int) -> None:
        """Every chunk of ``table`` before ``next_chunk`` was handed to the loop."""
        chunk = table.chunks[next_chunk - table.chunks[0].index]
        self._put(ChunkPublished(table.name, SnapshotResume(next_chunk, chunk.first_block)))

    def _finish(self, table: _Table) -> None:
        table.progress.rows(table.rows)
        self._put(TableCopied(table.name, table.rows))


def _table_size(conn: Connection, oid: int) -> TableSize:
    """The table's blocks now and its planner statistics, for :func:`plan_chunks`."""
    row = conn.execute(
        "SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint, "
        "c.relpages, c.reltuples FROM pg_class c WHERE c.oid = %s",
        [oid],
    ).fetchone()
    if row is None:
        return TableSize(blocks=0, pages=0, tuples=-1)
    blocks, pages, tuples = row
    return TableSize(
        blocks=int(blocks or 0), pages=int(pages or 0), tuples=-1.0 if tuples is None else tuples
    )


class _Progress:
    """Rows published of one table: the metrics at every batch, a log line every
    ``interval_s`` (rows, estimate, rate, time left) so a long snapshot is never silent.
    The rate is over the time since the run planned the table: its chunks share the
    workers with the other tables of the run, so the rate and time left are the table's
    as the run goes, not what it would take alone."""

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
            left = max(self._estimate - done, 0)
            log.info(
                "snapshot of %s: %d of about %d rows (%.0f%%), %.0f rows/s, about %s left",
                self._table,
                done,
                self._estimate,
                100.0 * done / self._estimate,
                rate,
                format_duration(left / rate) if rate > 0 else "unknown time",
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


def format_duration(seconds: float) -> str:
    """``seconds`` for a log line: ``45s``, ``3m10s``, ``2h05m``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
