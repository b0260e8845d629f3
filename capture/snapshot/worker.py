"""Reading snapshot chunks: the COPY of one chunk, in the run's thread or in worker
processes that each import the run's exported snapshot.

Reading a chunk (:func:`read_chunk`) is the same wherever it runs: ``COPY (SELECT cols
FROM t WHERE ctid ...) TO STDOUT`` in text form, each row parsed by the stream's own
parsers (:mod:`capture.snapshot.copy_text`) and encoded by a :class:`TableCodec`, as ``READ``
records at the snapshot's position with the chunk's ordinals
(:func:`capture.snapshot.chunks.chunk_ordinal`).

Workers are processes, not threads: parsing and encoding a row is Python code (about
28 µs of CPU), and threads would take turns on the GIL. They are started with the
``spawn`` method: the capture process runs librdkafka's threads, and a forked copy of a
process with threads may inherit locks held by threads that do not exist in the copy.

A worker (:func:`worker_main`):

1. opens its own connection and, in a ``REPEATABLE READ READ ONLY`` transaction, imports
   the run's exported snapshot (``SET TRANSACTION SNAPSHOT``), so every chunk is read at
   the run's one consistent point; then says :class:`WorkerReady`;
2. reads the chunks it is given, one at a time, sending their records back in batches
   (:class:`ChunkRows`, keys and values only: every record of a snapshot has the same
   headers) and then :class:`ChunkRead`; a value the contract cannot carry fails the
   chunk's table only (:class:`ChunkFailed`), and the worker goes on with other chunks;
3. ends on ``None`` or when the run's end of its pipe closes (the capture process is
   gone: no worker outlives it); any other failure (a lost connection) is sent as
   :class:`WorkerFailed` before it ends.

The pipe to a worker is a socket pair: its kernel buffer holds about a batch, so a worker
whose records are not taken waits, and memory stays bounded. Nothing in a worker
touches Kafka, the schema registry or the capture's books: the run that owns the
workers turns batches into records for the capture loop.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from psycopg import sql

from capture.errors import (
    ConfigError,
    PipelineError,
    ProtocolError,
    TableError,
    TransientError,
)
from capture.pgoutput import Relation
from capture.rows.codec import TableCodec
from capture.rows.typemap import SESSION_SETTINGS, ColumnMapping, libpq_options
from capture.snapshot.chunks import CHUNK_ORDINALS, Chunk
from capture.snapshot.copy_text import CopyRows
from schemas.change_record import RecordFraming
from schemas.errors import ChangeEncodingError
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.single_object import Fingerprint

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]
DescribeWith = Callable[[Connection, Relation], Sequence[ColumnMapping]]
"""Column mappings of a relation, read through the given connection. Handed to worker
processes: it must be a module-level function."""
Emit = Callable[[list[bytes], list[bytes]], None]
"""Takes one batch of a chunk's records: their keys and values."""

BATCH_ROWS = 500
_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True, slots=True)
class SnapshotPoint:
    """Where every record of a run sits: commit and change LSN, commit time."""

    lsn: Lsn
    commit_ts: int


@dataclass(frozen=True, slots=True)
class TableJob:
    """What a worker needs to encode one table's rows as the run does: the relation as
    the run read it, and the record headers the run's framer gave (a registry framer's
    ids, so a worker never talks to the registry)."""

    relation: Relation
    topic_prefix: str
    framing: RecordFraming
    value_fingerprint: Fingerprint
    point: SnapshotPoint
    """Where the table's records sit: the run's point, or, for a resumed snapshot, the
    position its first chunks were published at."""
    compiled_rows: bool = True
    """Encode rows with the compiled encoder where it applies (the capture setting)."""
    row_filter: str | None = None
    """The publication's row filter for the table (:mod:`capture.source.publication`):
    only the rows it lets through are copied."""


@dataclass(frozen=True, slots=True)
class ChunkTask:
    chunk: Chunk
    job: TableJob


@dataclass(frozen=True, slots=True)
class WorkerReady:
    pass


@dataclass(frozen=True, slots=True)
class ChunkRows:
    chunk: Chunk
    keys: list[bytes]
    values: list[bytes]


@dataclass(frozen=True, slots=True)
class ChunkRead:
    chunk: Chunk
    rows: int


@dataclass(frozen=True, slots=True)
class ChunkFailed:
    """The chunk's table cannot be captured (:class:`TableError`'s message)."""

    chunk: Chunk
    message: str


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    """The worker cannot go on; ``config`` when the message says what to change."""

    message: str
    config: bool = False


WorkerMessage = WorkerReady | ChunkRows | ChunkRead | ChunkFailed | WorkerFailed


class SnapshotCancelledError(Exception):
    """The run was cancelled while a chunk was being read."""


def connect(dsn: str, password: str | None, *, replication: bool = False) -> Connection:
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
        raise TransientError(f"snapshot cannot connect to PostgreSQL: {exc}") from exc


def import_snapshot(conn: Connection, snapshot_name: str) -> None:
    """Open ``conn``'s transaction on the exported snapshot ``snapshot_name``."""
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))


def chunk_query(relation: Relation, chunk: Chunk, row_filter: str | None = None) -> sql.Composed:
    """The COPY of ``chunk``'s rows, columns in the relation's order (the published
    ones: a relation built for a snapshot has only those), and only the rows
    ``row_filter`` lets through.

    ``row_filter`` is an expression the server printed (``pg_get_expr`` of the
    publication's filter, read in the same database), so it goes in as SQL text, in
    parentheses: it names the table's columns unqualified, and an operator or function
    the search path would not find is printed schema-qualified. A row for which it is
    NULL is left out, as pgoutput leaves its changes out."""
    select = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(c.name) for c in relation.columns),
        sql.Identifier(relation.namespace, relation.name),
    )
    conditions: list[sql.Composable] = []
    if row_filter is not None:
        conditions.append(sql.SQL("({})").format(sql.SQL(row_filter)))
    if not chunk.whole_table:
        if chunk.first_block > 0:
            conditions.append(
                sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({chunk.first_block},0)"))
            )
        if chunk.end_block is not None:
            conditions.append(
                sql.SQL("ctid < {}::tid").format(sql.Literal(f"({chunk.end_block},0)"))
            )
    if conditions:
        select = sql.SQL("{} WHERE {}").format(select, sql.SQL(" AND ").join(conditions))
    return sql.SQL("COPY ({}) TO STDOUT").format(select)


def read_chunk(
    conn: Connection,
    codec: TableCodec,
    chunk: Chunk,
    point: SnapshotPoint,
    *,
    emit: Emit,
    cancelled: Callable[[], bool] = lambda: False,
    row_filter: str | None = None,
) -> int:
    """Read ``chunk`` in ``conn``'s transaction, handing its records to ``emit`` in
    batches; the rows read (those ``row_filter`` lets through, :func:`chunk_query`). A
    row the contract cannot carry raises :class:`TableError` once the COPY is read to
    its end (leaving it early would abort the transaction the other chunks are read
    in)."""
    table = codec.table
    encoder = codec.encoder
    parser = CopyRows(len(codec.relation.columns))
    base = chunk.index * CHUNK_ORDINALS
    lsn, commit_ts = point.lsn, point.commit_ts
    compiled = codec.compiled
    head = encoder.value_head(
        op=Operation.READ, commit_lsn=lsn, change_lsn=lsn, xid=0, commit_ts=commit_ts
    )
    keys: list[bytes | None] = []
    values: list[bytes] = []
    lines: list[bytes] = []
    rest = b""
    rows = 0
    failure: TableError | None = None

    def encode_line(line: bytes, ordinal: int) -> tuple[bytes, bytes]:
        """A line the compiled encoder left to the Python path (or every line, without
        one): its key and value."""
        after, _ = codec.row(parser.row(line))
        return encoder.encode_row_key(after), encoder.encode_fields(
            op=Operation.READ,
            commit_lsn=lsn,
            change_lsn=lsn,
            xid=0,
            commit_ts=commit_ts,
            ordinal=ordinal,
            before=None,
            after=after,
            unchanged_columns=(),
            before_key_only=False,
        )

    def encode_lines() -> None:
        """Every complete line buffered so far, appended to ``keys`` and ``values``."""
        nonlocal rest, rows
        data = rest + b"".join(lines)
        lines.clear()
        if compiled is not None:
            first = len(keys)
            records = compiled.encode_copy(data, encoder.key_header, head, base + rows + 1)
            new_keys, new_values, rest = records.keys, records.values, records.rest
            keys.extend(new_keys)
            values.extend(new_values)
            for at in range(first, len(keys)):
                if keys[at] is None:
                    keys[at], values[at] = encode_line(values[at], base + rows + 1 + at - first)
            rows += len(new_keys)
            return
        *complete, rest = data.split(b"\n")
        for line in complete:
            key, value = encode_line(line, base + rows + 1)
            keys.append(key)
            values.append(value)
            rows += 1

    def encoded_or_failure() -> TableError | None:
        """:func:`encode_lines`, or the table's failure: a row the contract cannot carry."""
        try:
            encode_lines()
        except ChangeEncodingError as exc:
            return TableError(table, str(exc))
        except TableError as exc:
            return exc
        return None

    with conn.cursor().copy(chunk_query(codec.relation, chunk, row_filter)) as copy:
        for data in copy:
            if cancelled():
                raise SnapshotCancelledError
            if failure is not None:
                continue
            lines.append(bytes(data))
            if len(lines) < BATCH_ROWS:
                continue
            failure = encoded_or_failure()
            if failure is None:
                _check_ordinals(chunk, rows)
                emit(cast("list[bytes]", keys), values)
                keys, values = [], []
    if failure is None and lines:
        failure = encoded_or_failure()
    if failure is not None:
        raise failure
    if rest:
        raise ProtocolError(f"COPY data ended inside a row ({len(rest)} bytes without a newline)")
    _check_ordinals(chunk, rows)
    if keys:
        emit(cast("list[bytes]", keys), values)
    return rows


def _check_ordinals(chunk: Chunk, rows: int) -> None:
    if rows >= CHUNK_ORDINALS:
        raise TableError(
            chunk.table,
            f"chunk {chunk.index} of its snapshot holds more than {CHUNK_ORDINALS - 1} rows; "
            "lower CAPTURE_SNAPSHOT_CHUNK_ROWS",
        )


def table_message(error: TableError) -> str:
    """``error``'s message without the ``table X:`` its string starts with."""
    return str(error).removeprefix(f"table {error.table}: ")


# -- in the worker process ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSetup:
    """A worker's arguments (pickled to it by ``spawn``, never on a command line)."""

    dsn: str
    password: str | None
    snapshot_name: str
    describe: DescribeWith


def worker_main(pipe: multiprocessing.connection.Connection, setup: WorkerSetup) -> None:
    """A worker process's body; see the module docstring."""
    # Ctrl-C reaches the whole process group: the run stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(EOFError, BrokenPipeError, ConnectionResetError):
        try:
            with connect(setup.dsn, setup.password) as conn:
                import_snapshot(conn, setup.snapshot_name)
                pipe.send(WorkerReady())
                _serve(pipe, conn, setup.describe)
        except ConfigError as exc:
            pipe.send(WorkerFailed(str(exc), config=True))
        except PipelineError as exc:
            pipe.send(WorkerFailed(str(exc)))
        except psycopg.Error as exc:
            pipe.send(WorkerFailed(f"snapshot worker lost PostgreSQL: {exc}"))
        except Exception as exc:  # reported to the run, which fails with it
            pipe.send(WorkerFailed(f"snapshot worker failed: {type(exc).__name__}: {exc}"))


def _serve(
    pipe: multiprocessing.connection.Connection,
    conn: Connection,
    describe: DescribeWith,
) -> None:
    codecs: dict[str, TableCodec] = {}
    while True:
        task: ChunkTask | None = pipe.recv()
        if task is None:
            return
        chunk = task.chunk

        def emit(keys: list[bytes], values: list[bytes], chunk: Chunk = chunk) -> None:
            pipe.send(ChunkRows(chunk, keys, values))

        try:
            codec = codecs.get(chunk.table)
            if codec is None:
                codec = codecs[chunk.table] = _codec(conn, task.job, describe)
            rows = read_chunk(
                conn, codec, chunk, task.job.point, emit=emit, row_filter=task.job.row_filter
            )
        except ChangeEncodingError as exc:
            pipe.send(ChunkFailed(chunk, str(exc)))
        except TableError as exc:
            pipe.send(ChunkFailed(chunk, table_message(exc)))
        else:
            pipe.send(ChunkRead(chunk, rows))


def _codec(conn: Connection, job: TableJob, describe: DescribeWith) -> TableCodec:
    """The run's codec of the table, rebuilt here from the same catalog (the same
    snapshot) and the run's headers."""
    framing = job.framing
    codec = TableCodec(
        job.relation,
        describe(conn, job.relation),
        job.topic_prefix,
        lambda schemas, topic: framing,
        compiled=job.compiled_rows,
    )
    if codec.schemas.value_fingerprint != job.value_fingerprint:
        raise TableError(
            codec.table,
            "a snapshot worker read a different writer schema than the run in the same "
            "snapshot; restart capture",
        )
    return codec


# -- in the run's process ----------------------------------------------------------------


@dataclass(slots=True)
class Worker:
    process: multiprocessing.process.BaseProcess
    pipe: multiprocessing.connection.Connection
    chunk: Chunk | None = None
    """The chunk it reads, None when idle."""


class WorkerPool:
    """A run's worker processes, each with its own pipe. Used from the run's thread only,
    except :meth:`kill`, which the capture loop may call when the run does not end."""

    def __init__(
        self,
        count: int,
        setup: WorkerSetup,
    ) -> None:
        self.workers: list[Worker] = []
        try:
            for i in range(count):
                ours, theirs = _SPAWN.Pipe(duplex=True)
                process = _SPAWN.Process(
                    target=worker_main,
                    args=(theirs, setup),
                    name=f"snapshot-worker-{i}",
                    daemon=True,
                )
                process.start()
                # Only the worker holds its end now: when either side goes away, the
                # other reads EOF instead of waiting forever.
                theirs.close()
                self.workers.append(Worker(process, ours))
        except BaseException:
            self.stop(graceful=False)
            raise

    def wait_ready(self, cancelled: Callable[[], bool]) -> None:
        """Until every worker has imported the snapshot (the exporting connection may
        close then); raises what a worker reports instead."""
        waiting = list(self.workers)
        while waiting:
            if cancelled():
                raise SnapshotCancelledError
            for worker, message in self.receive(waiting, timeout_s=0.1):
                if not isinstance(message, WorkerReady):
                    raise unexpected_message(message)
                waiting.remove(worker)

    def idle(self) -> list[Worker]:
        return [w for w in self.workers if w.chunk is None]

    def busy(self) -> list[Worker]:
        return [w for w in self.workers if w.chunk is not None]

    def assign(self, worker: Worker, task: ChunkTask) -> None:
        worker.chunk = task.chunk
        try:
            worker.pipe.send(task)
        except OSError as exc:
            raise TransientError(f"snapshot worker {worker.process.name} is gone") from exc

    def receive(
        self, workers: Sequence[Worker], timeout_s: float
    ) -> list[tuple[Worker, WorkerMessage]]:
        """One message of each of ``workers`` that has one, waiting up to ``timeout_s``
        for the first. A worker that ended without a word is a TransientError (its
        connection or process died: the run is taken again)."""
        by_pipe = {id(w.pipe): w for w in workers}
        by_sentinel = {w.process.sentinel: w for w in workers}
        ready = multiprocessing.connection.wait(
            [w.pipe for w in workers] + list(by_sentinel), timeout_s
        )
        messages: list[tuple[Worker, WorkerMessage]] = []
        ended: list[Worker] = []
        for item in ready:
            if isinstance(item, int):
                ended.append(by_sentinel[item])
                continue
            worker = by_pipe[id(item)]
            try:
                message: WorkerMessage = worker.pipe.recv()
            except (EOFError, OSError):
                ended.append(worker)
                continue
            messages.append((worker, message))
        for worker in ended:
            if not any(w is worker for w, _ in messages) and not worker.pipe.poll():
                worker.process.join(1.0)
                raise TransientError(
                    f"snapshot worker {worker.process.name} ended unexpectedly "
                    f"(exit code {worker.process.exitcode})"
                )
        return messages

    def stop(self, *, graceful: bool, timeout_s: float = 5.0) -> None:
        """End every worker: asked to (idle ones, after a finished run), else terminated;
        killed when that is not enough. No worker survives this call."""
        for worker in self.workers:
            if graceful and worker.chunk is None:
                with contextlib.suppress(OSError):
                    worker.pipe.send(None)
            elif worker.process.is_alive():
                worker.process.terminate()
        for worker in self.workers:
            worker.process.join(timeout_s)
        self.kill()

    def kill(self, timeout_s: float = 1.0) -> None:
        """SIGKILL what is still alive, and reap it (within ``timeout_s`` in all)."""
        for worker in self.workers:
            if worker.process.is_alive():
                worker.process.kill()
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            worker.process.join(max(deadline - time.monotonic(), 0.0))
            worker.pipe.close()


def unexpected_message(message: WorkerMessage) -> PipelineError:
    if isinstance(message, WorkerFailed):
        return ConfigError(message.message) if message.config else TransientError(message.message)
    return TransientError(f"snapshot worker sent {type(message).__name__} out of turn")
