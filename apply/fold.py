"""Fold a table's change log into the table: one MERGE of every change logged since the
last fold (:mod:`apply.change_log`, docs/lake-change-log.md).

A fold of ``schema.table``:

1. reads the log's newest applied state; its ``log_seq`` is the newest append, S;
2. reads the table's newest applied state; its ``log_seq`` is the last fold's watermark,
   W (none: never folded). Nothing to do when W >= S;
3. builds the MERGE source from the log rows with a sequence in ``(W, S]`` exactly as a
   batch builds it from its records (:func:`apply.merge.merge_source`: latest change
   per key), and MERGEs it with the position guard, so a change already in the table is
   never taken back;
4. commits, in the MERGE's commit, the log's state with ``log_seq`` S: the table's
   state then says what the table holds, as it does without a log, and the next fold
   starts after S. The commit's ``txnAppId`` is the query's with ``:fold`` appended and
   its ``txnVersion`` is S, so a fold repeated after a crash commits nothing;
5. trims the log up to W, the previous fold's watermark, not S: a reader of the
   freshest view that read the table just before this fold still finds this fold's
   rows in the log. (Before a batch that cannot go to the log, the fold trims up to S
   instead and leaves the log empty, :mod:`apply.batch`.)

Who folds: :class:`Folds` keeps, per table, a lock and the time of its last fold. The
table's batch task holds the lock while it changes the table itself (creates it, adds
columns, or takes a batch the log cannot take), and every commit to the log (an append,
a trim) is made under the log's own lock (:meth:`Folds.log_lock`). :class:`FoldTimer`,
a driver thread, folds every table whose log has rows and whose last fold is
``every_s`` old, taking the lock only when it is free, so a fold never races the
table's own batch and a quiet table's last changes still reach the table when no batch
comes. A fold that fails is
logged and retried on the next tick: the log keeps its rows, and the view stays right.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Protocol

from pyspark.sql import SparkSession

from apply.change_log import LOG_UPKEEP, change_log_path, trim, unfolded
from apply.delta_schema import ColumnPlan, read_existing_table
from apply.errors import ConfigError
from apply.history import TableHistory, read_history
from apply.known_tables import KnownTable, KnownTables
from apply.merge import merge_into, merge_source
from apply.positions import encode_state
from apply.table_lock import TABLE_LOCKS, TableLock
from apply.table_pool import POOL_PROPERTY, table_session
from apply.tables import TableId, table_path
from apply.upkeep import TableUpkeep

log = logging.getLogger(__name__)

FOLD_SUFFIX = ":fold"
FOLD_POOL = "fold"
"""The FAIR scheduler pool of the folds' Spark jobs: one pool beside the batch's
per-table pools, so a fold takes a share of the cores, not all of them."""
TABLE_UPKEEP = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END"})
"""Operations of the upkeep commits on a table (:mod:`apply.upkeep`): they change
neither its applied state nor its columns."""


def fold_app_id(app_id: str) -> str:
    """The ``txnAppId`` of the folds of a query's logs."""
    return app_id + FOLD_SUFFIX


@dataclass(frozen=True, slots=True)
class FoldResult:
    table: str
    through_seq: int
    """Every change logged up to this sequence is in the table."""
    version_before: int
    """The table's version before the fold."""
    version: int
    """The table's version after the fold."""
    source_rows: int
    duration_s: float
    commit_ts: int | None
    """Commit time of the newest source transaction the table now holds (µs)."""


class FoldObserver(Protocol):
    """Told of every fold the timer ran (:class:`apply.metrics.ApplyMetrics`)."""

    def fold(
        self, table: str, result: FoldResult | None, duration_s: float, *, failed: bool
    ) -> None:
        """``result`` None: nothing was left to fold, or the fold failed."""


def fold_table(
    spark: SparkSession,
    *,
    lake_root: str,
    table: TableId,
    default_app_id: str,
    empty_log: bool = False,
    known: KnownTables | None = None,
    log_lock: AbstractContextManager[object] | None = None,
) -> FoldResult | None:
    """Fold the log of ``table`` into the table (module docstring); None when the table
    holds every logged change already. ``empty_log``: trim every folded row, not only
    the previous fold's. ``known``: what the job last wrote to the table and its log
    (:mod:`apply.known_tables`), read instead of Delta while nothing else committed.
    ``log_lock``: held around the trim, the fold's only commit to the log
    (:meth:`Folds.log_lock`)."""
    trimming = log_lock if log_lock is not None else nullcontext()
    started = time.monotonic()
    name = str(table)
    path = table_path(lake_root, table)
    log_path = change_log_path(lake_root, table)
    known_log = known.current(spark, log_path, passing=LOG_UPKEEP) if known else None
    log_history = known_log.history if known_log else read_history(spark, log_path, name)
    logged = None if log_history is None else log_history.state
    if logged is None or logged.log_seq is None:
        return None
    through = logged.log_seq
    known_table = known.current(spark, path, passing=TABLE_UPKEEP) if known else None
    history = known_table.history if known_table else read_history(spark, path, name)
    if history is None:
        return None  # a log is only written after its table exists: nothing to fold into
    watermark = None if history.state is None else history.state.log_seq
    if watermark is not None and watermark >= through:
        if empty_log:
            with trimming:
                trim(spark, log_path, through)
        return None
    existing = known_table.existing if known_table else read_existing_table(spark, path, table)
    assert existing is not None  # read_history found the table
    plan = ColumnPlan(
        columns=existing.columns, added=(), key_columns=existing.key_columns, create=False
    )
    rows = unfolded(spark, log_path, plan.columns, after_seq=watermark, through_seq=through)
    source = merge_source(
        rows,
        previous=None,
        topic="",
        plan=plan,
        erased_before=None,
        unchanged_columns=frozenset(),
    )
    app_id = fold_app_id(logged.txn_app_id or default_app_id)
    with TABLE_LOCKS.held(path):  # taken again when the caller holds it (reentrant)
        outcome = merge_into(
            spark,
            path=path,
            table=name,
            source=source,
            plan=plan,
            truncate=None,
            version_before=history.version,
            app_id=app_id,
            batch_id=through,
            metadata=encode_state(replace(logged, log_seq=through)),
        )
    if known is not None:
        if outcome.committed:
            folded = replace(logged, log_seq=through)
            known.remember(path, KnownTable(TableHistory(outcome.version, folded), existing))
        else:
            known.forget(path)
    if not outcome.committed:
        raise ConfigError(
            f"table {name}: the fold of its change log up to sequence {through} was skipped "
            f"as written before, but the table holds the log only up to {watermark}: the "
            f"change log at {log_path} was recreated; resync the table: python -m capture "
            f"resync {name}, then restart capture"
        )
    trim_through = through if empty_log else watermark
    if trim_through is not None:
        with trimming:
            trim(spark, log_path, trim_through)
    result = FoldResult(
        table=name,
        through_seq=through,
        version_before=history.version,
        version=outcome.version,
        source_rows=int(outcome.metrics.get("numSourceRows", "0")),
        duration_s=time.monotonic() - started,
        commit_ts=logged.commit_ts,
    )
    log.info(
        "fold of %s: log up to sequence %d merged, %d rows, table version %d, %.2fs",
        name,
        through,
        result.source_rows,
        result.version,
        result.duration_s,
    )
    return result


class Folds:
    """Per table: the lock its direct batches and its folds share, what was appended to
    its log and what a fold took of it, and when it was last folded.

    A batch appends while the table may be being folded, so "folded" must not forget an
    append the fold did not read: appends are counted, a fold notes the count before it
    reads the log (:meth:`mark`) and clears only that many (:meth:`folded`)."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._guard = threading.Lock()
        self._last_fold: dict[TableId, float] = {}
        self._appends: dict[TableId, int] = {}
        self._folded: dict[TableId, int] = {}

    @staticmethod
    def lock(path: str) -> TableLock:
        """The lock of the table at ``path``, which its direct batches and its folds
        share: the table's lock (:mod:`apply.table_lock`)."""
        return TABLE_LOCKS.lock(path)

    @staticmethod
    def log_lock(path: str) -> TableLock:
        """The lock every commit to the change log at ``path`` is made under: a batch's
        append, from the JVM or the driver, and a fold's trim; the log's own table lock
        (:mod:`apply.table_lock`). The fold's MERGE into the table (the long part) holds
        only :meth:`lock`, so an append waits at most for a trim."""
        return TABLE_LOCKS.lock(path)

    def appended(self, table: TableId) -> None:
        """The table's log got rows the table may lack."""
        with self._guard:
            self._appends[table] = self._appends.get(table, 0) + 1

    def mark(self, table: TableId) -> int:
        """The appends so far: call it before a fold reads the log."""
        with self._guard:
            return self._appends.get(table, 0)

    def folded(self, table: TableId, mark: int) -> None:
        """The table holds every change its log had at ``mark`` (:meth:`mark`)."""
        with self._guard:
            self._folded[table] = max(self._folded.get(table, 0), mark)
            self._last_fold[table] = self._clock()

    def due(self, *, every: bool = False) -> list[TableId]:
        """Tables with appends no fold took yet whose last fold in this run is
        ``every_s`` old (or that were not folded in this run); ``every``: all tables
        with such appends."""
        now = self._clock()
        with self._guard:
            return sorted(
                table
                for table, appends in self._appends.items()
                if appends > self._folded.get(table, 0)
                and (every or now - self._last_fold.get(table, float("-inf")) >= self.every_s)
            )


class FoldTimer:
    """The driver thread that folds due tables (module docstring)."""

    def __init__(
        self,
        spark: SparkSession,
        folds: Folds,
        *,
        lake_root: str,
        default_app_id: str,
        upkeep: TableUpkeep | None = None,
        observer: FoldObserver | None = None,
        known: KnownTables | None = None,
        parallelism: int = 1,
    ) -> None:
        self._spark = spark
        self._parallelism = max(1, parallelism)
        # Threads kept for the timer's life: each Python thread is a JVM thread of its
        # own (PySpark's pinned threads), so they are not made anew every tick.
        self._pool = (
            ThreadPoolExecutor(max_workers=self._parallelism, thread_name_prefix="apply-fold")
            if self._parallelism > 1
            else None
        )
        self._known = known
        self._upkeep = upkeep
        self._observer = observer
        self._folds = folds
        self._lake_root = lake_root
        self._default_app_id = default_app_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="apply-fold", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the fold under way, if any."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def fold_due(self, *, every: bool = False) -> int:
        """Fold every due table whose lock is free, ``parallelism`` at a time; the
        number folded. ``every``: every table with logged changes, waiting for its lock
        (the last fold of a job whose queries ended).

        Folds of different tables run side by side because a fold of a few rows is
        mostly fixed latency (planning the MERGE, scheduling its jobs, the commit), not
        work for the cores: two at a time on two cores bring each table's turn round
        sooner (docs/lake-change-log.md)."""
        tables = self._folds.due(every=every)
        if self._pool is None or len(tables) <= 1:
            return sum(self._fold(table, every=every) for table in tables)
        return sum(self._pool.map(lambda table: self._fold(table, every=every), tables))

    def _fold(self, table: TableId, *, every: bool) -> int:
        """Fold ``table`` when its lock is free (``every``: waiting for it); 1 when a
        fold committed."""
        if self._stop.is_set() and not every:
            return 0
        lock = self._folds.lock(table_path(self._lake_root, table))
        if not lock.acquire(blocking=every):
            return 0  # its batch is applying it: the next tick folds it
        # Thread-local: the fold's jobs go to the folds' pool; the caller's pool is put
        # back after it.
        context = self._spark.sparkContext
        caller_pool = context.getLocalProperty(POOL_PROPERTY)
        context.setLocalProperty(POOL_PROPERTY, FOLD_POOL)
        started = time.monotonic()
        result = None
        mark = self._folds.mark(table)
        try:
            session = table_session(self._spark)
            result = fold_table(
                session,
                lake_root=self._lake_root,
                table=table,
                default_app_id=self._default_app_id,
                known=self._known,
                log_lock=self._folds.log_lock(change_log_path(self._lake_root, table)),
            )
            self._folds.folded(table, mark)
            if result is not None and self._upkeep is not None:
                self._upkeep.after_commit(
                    session,
                    table=result.table,
                    path=table_path(self._lake_root, table),
                    version_before=result.version_before,
                    version_after=result.version,
                )
        except Exception:
            # Kept in the log; the view is still right and the next tick retries.
            log.exception("fold of %s failed; retried on the next tick", table)
            if self._observer is not None:
                self._observer.fold(str(table), None, time.monotonic() - started, failed=True)
            return 0
        finally:
            context.setLocalProperty(POOL_PROPERTY, caller_pool)  # type: ignore[arg-type]
            lock.release()
        if self._observer is not None:
            self._observer.fold(str(table), result, time.monotonic() - started, failed=False)
        return 0 if result is None else 1

    def _run(self) -> None:
        tick = max(0.2, min(1.0, self._folds.every_s / 4))
        while not self._stop.wait(tick):
            self.fold_due()


__all__ = [
    "FOLD_POOL",
    "FOLD_SUFFIX",
    "TABLE_UPKEEP",
    "FoldObserver",
    "FoldResult",
    "FoldTimer",
    "Folds",
    "fold_app_id",
    "fold_table",
]
