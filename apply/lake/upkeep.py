"""Table upkeep: apply compacts and vacuums its Delta tables itself, between their MERGEs.

Every MERGE adds files (one per task that wrote rows, about 2-4 here) and deletion
vectors, so a table streamed at a 5 s trigger gathers tens of thousands of small files
a day, and the MERGE's own scans and every reader slow down with its age. So right
after a table's commit in a micro-batch, in the same task, apply may run:

- **compaction** when the table's Delta version passed its turn, every
  ``compact_every_commits``. A table the driver's MERGE writes (no deletion vectors,
  :func:`apply.lake.driver_merge.writable`) is compacted by delta-rs from the driver
  (:func:`compact_from_driver`): files below ``target_file_size_mb`` packed into files
  of about that size. Any other table gets Spark's ``OPTIMIZE``, which rewrites every
  file smaller than its minimum (1 GB) or with more than 5 % of its rows deleted,
  packed up to ``target_file_size_mb``; a rewritten file drops its deletion vector, so
  the same run purges them (a table below the target size ends as one file without
  any). What stays is a file near the target size alone in its bin, with its vector;
  ``REORG TABLE ... APPLY (PURGE)`` is left to the operator, since for changes spread
  over the key space it would rewrite the whole table;
- **vacuum** (Spark's ``VACUUM ... LITE``, or the full listing when the log no longer
  reaches back to the previous vacuum) when the version passed its turn, every
  ``vacuum_every_commits``. Not delta-rs's: its light mode (1.6) finds removed files
  in the snapshot's tombstones, which the protocol lets a checkpoint drop once they
  expire, the moment the files become deletable; LITE reads the commits since the
  previous vacuum. It deletes only files no version within the table's
  ``delta.deletedFileRetentionDuration`` (7 days unless set) still references: a
  reader, ``python -m pipeline verify`` (which reads one fixed version for a round) or
  a restarted apply (which reads the newest version only; the streaming checkpoint
  holds Kafka offsets, no Delta version) never loses a file it reads.

Why these choices:

- **Decided from the version and the table's name alone.** Nothing is kept in memory:
  the window of versions a batch's commits took, ``(before, after]``, says whether a
  turn was passed, so a restarted job behaves exactly like a running one (as the rest
  of the batch does, :mod:`apply.batch`) and deciding costs no read. A table's turns
  are offset by a CRC of its name (:func:`turn_offset`): tables snapshotted together
  and written by every batch share their versions, and without the offset all of them
  took their turn in the same batch, which then waited for all their upkeep (measured
  with eleven tables: a batch of 18 s every 100, against 0.6 to 0.9 s). Every commit counts,
  upkeep's own and schema changes included, and files per commit are bounded by the
  MERGE's tasks, so a table holds the files of at most ``compact_every_commits``
  commits besides its compacted ones. A table with no records in a batch commits
  nothing and costs nothing; a replayed batch commits nothing either.
- **One writer.** Upkeep runs in the table's own task after its commit, so it never
  races the MERGE (no conflict to retry), and with the same session, whose per-commit
  settings (``txnAppId``, ``userMetadata``) are cleared after the MERGE: upkeep commits
  carry no apply metadata, and :mod:`apply.lake.history` passes over them (OPTIMIZE, and the
  ``VACUUM START``/``VACUUM END`` commits Delta logs).
- **Bounded per batch.** At most one compaction and one vacuum per table and batch,
  each over at most ``compact_every_commits`` commits' worth of new files: measured
  here while a test run shared the cores, a Spark OPTIMIZE of 163 small files (60
  MERGEs) took 1.8 s, and a VACUUM LITE 3.8 s where the full listing took 53 s. Other tables
  of the batch go on in parallel (:mod:`apply.batch.table_pool`); the batch ends with its
  slowest table.
- **Not Delta's auto compaction.** ``spark.databricks.delta.autoCompact.enabled`` works
  with this MERGE in Delta 4.4, but as a hook inside the MERGE's commit: the OPTIMIZE
  commit it writes carries the MERGE's ``userMetadata`` (the session's), and it lands
  before :func:`apply.lake.spark_merge.merge_into` reads its own commit back, which then reports
  the OPTIMIZE's metrics as the MERGE's. It also runs whenever 50 small files gather,
  with no bound per batch.
- **A failure defers, never fails.** The batch's rows and state are committed by then;
  a failed OPTIMIZE or VACUUM changed nothing (Delta commits atomically), so it is
  logged and counted, and the table's next turn tries again. Failing the batch would
  not retry it: the replay commits nothing, so it reaches no upkeep.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from delta.tables import DeltaTable as SparkDeltaTable
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from apply.lake.delta_log import local_path
from apply.lake.driver_merge import (
    AFTER_COMMIT,
    DriverMergeUnavailableError,
    exact_instants,
    writable,
)
from apply.lake.driver_store import LOCAL, DriverStore
from apply.lake.legacy_instants import CheckedFiles
from apply.lake.table_lock import TABLE_LOCKS
from apply.settings import UpkeepSettings

log = logging.getLogger(__name__)

MAX_FILE_SIZE_CONF = "spark.databricks.delta.optimize.maxFileSize"
"""Delta's target size for the files OPTIMIZE writes (bytes)."""
_CANNOT_VACUUM_LITE = "DELTA_CANNOT_VACUUM_LITE"


class UpkeepTask(Enum):
    COMPACT = "compact"
    VACUUM = "vacuum"


def turn_offset(table: str, every: int) -> int:
    """Where in every ``every`` versions ``table``'s turn falls: the same for a table
    wherever the job runs (a CRC of its name, not Python's salted ``hash``), and spread
    over tables, so that tables committed by every batch since their snapshot, all at
    the same version, do not all take their turn in one batch (module docstring)."""
    return zlib.crc32(table.encode()) % every if every > 0 else 0


def _passes_turn(before: int, after: int, every: int, offset: int) -> bool:
    """Whether a version ``v`` with ``v + offset`` a multiple of ``every`` lies in
    ``(before, after]``, above 0: version 0, the table's creation, is no one's turn."""
    if every <= 0:
        return False
    return (after + offset) // every > (max(before, 0) + offset) // every


def due(
    settings: UpkeepSettings, version_before: int, version_after: int, table: str = ""
) -> tuple[UpkeepTask, ...]:
    """The upkeep ``table`` is due after its commits took it from ``version_before`` (-1
    for a table created by them) to ``version_after``, in the order to run it: compact
    first, so a vacuum in the same turn meets the files compaction just removed (it keeps
    them for the retention period, like any other). Each table's turns are offset by
    :func:`turn_offset`."""
    if not settings.enabled or version_after <= version_before:
        return ()
    tasks = []
    for task, every in (
        (UpkeepTask.COMPACT, settings.compact_every_commits),
        (UpkeepTask.VACUUM, settings.vacuum_every_commits),
    ):
        if _passes_turn(version_before, version_after, every, turn_offset(table, every)):
            tasks.append(task)
    return tuple(tasks)


@dataclass(frozen=True, slots=True)
class UpkeepRun:
    """One upkeep operation on one table."""

    table: str
    task: UpkeepTask
    duration_s: float
    failed: bool


class UpkeepObserver(Protocol):
    """Where upkeep runs are counted (:class:`apply.metrics.ApplyMetrics`)."""

    def upkeep(self, table: str, operation: str, duration_s: float, *, failed: bool) -> None: ...


def run_tasks(
    table: str,
    tasks: tuple[UpkeepTask, ...],
    run: Callable[[UpkeepTask], str],
    *,
    observer: UpkeepObserver | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[UpkeepRun, ...]:
    """Run each task with ``run`` (which returns what it did, for the log), timing it.
    A Spark or Delta failure is logged and counted, and the rest still run (module
    docstring: a failure defers); anything else is a bug and raises."""
    runs = []
    for task in tasks:
        started = clock()
        try:
            done = run(task)
        except (PySparkException, Py4JError) as exc:
            failed = True
            log.warning("table %s: %s failed, left to its next turn: %s", table, task.value, exc)
        else:
            failed = False
            log.info("table %s: %s %s", table, task.value, done)
        upkeep_run = UpkeepRun(table, task, clock() - started, failed)
        if observer is not None:
            observer.upkeep(table, task.value, upkeep_run.duration_s, failed=failed)
        runs.append(upkeep_run)
    return tuple(runs)


@contextmanager
def _session_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    previous = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def compact(
    spark: SparkSession,
    path: str,
    target_file_size_mb: int,
    store: DriverStore | None = LOCAL,
    *,
    from_driver: bool = True,
    checked: CheckedFiles | None = None,
) -> str:
    """Compact the Delta table at ``path`` (:func:`compact_from_driver` where delta-rs
    writes it and ``from_driver``, else Spark's OPTIMIZE), then clean its expired log
    (:func:`clean_log` through ``store``); what it did, for the log. The caller holds the
    table's lock (:mod:`apply.lake.table_lock`)."""
    TABLE_LOCKS.require(path, "OPTIMIZE")
    target_bytes = target_file_size_mb * 1024 * 1024
    done = None
    if store is not None and from_driver:
        done = compact_from_driver(path, target_bytes, store, checked)
    if done is None:
        done = _optimize_with_spark(spark, path, target_bytes)
    return f"{done}; {clean_log(path, store)}"


def compact_from_driver(
    path: str, target_bytes: int, store: DriverStore, checked: CheckedFiles | None = None
) -> str | None:
    """Compact the table at ``path`` with delta-rs from the driver, when it is a table the
    driver's MERGE writes (:func:`apply.lake.driver_merge.writable`: no deletion vectors,
    no change data feed; :func:`apply.lake.driver_merge.exact_instants`: no INT96
    instants it would change, which Spark's OPTIMIZE in apply's session rewrites as
    INT64); what it did, or None when Spark's OPTIMIZE must do it. Spark's
    OPTIMIZE costs seconds of planning on two cores even when it finds nothing, and
    every table of a batch may be due at once; delta-rs plans from the snapshot in the
    driver, so a table of one file (the driver's copy-on-write MERGE keeps a table
    spread over few files) costs milliseconds. delta-rs packs the files below
    ``target_bytes`` into files of about that size and leaves a file alone in its bin
    as it is; it writes the commit like any OPTIMIZE, without apply's metadata.

    A delta-rs failure leaves the table to Spark's OPTIMIZE: nothing was committed, or
    the compaction was, and Spark's then finds nothing to rewrite."""
    try:
        table = DeltaTable(store.location(path), storage_options=dict(store.options))
        writable(table)
        exact_instants(table, store.options, checked)
        metrics = table.optimize.compact(
            target_size=target_bytes, post_commithook_properties=AFTER_COMMIT
        )
    except DriverMergeUnavailableError:
        return None
    except DeltaError as exc:
        log.warning("delta-rs did not compact %s, Spark's OPTIMIZE will: %s", path, exc)
        return None
    removed, added = metrics.get("numFilesRemoved", 0), metrics.get("numFilesAdded", 0)
    if not removed:
        return "found nothing to rewrite (delta-rs)"
    return f"rewrote {removed} files into {added} (delta-rs)"


def _optimize_with_spark(spark: SparkSession, path: str, target_bytes: int) -> str:
    with _session_conf(spark, MAX_FILE_SIZE_CONF, str(target_bytes)):
        row = SparkDeltaTable.forPath(spark, path).optimize().executeCompaction().head()
    metrics = None if row is None else row["metrics"]
    if metrics is None or not metrics["numFilesRemoved"]:
        return "found nothing to rewrite"
    vectors = metrics["deletionVectorStats"]
    return (
        f"rewrote {metrics['numFilesRemoved']} files into {metrics['numFilesAdded']}, "
        f"dropping {0 if vectors is None else vectors['numDeletionVectorsRemoved']} "
        "deletion vectors"
    )


def clean_log(path: str, store: DriverStore | None = LOCAL) -> str:
    """Delete the commit files of the table at ``path`` older than its
    ``delta.logRetentionDuration`` that a checkpoint makes unneeded, with delta-rs through
    ``store`` (:mod:`apply.lake.driver_store`); what it did, for the log. The driver's
    commits leave this to upkeep (:data:`apply.lake.driver_merge.AFTER_COMMIT`); Spark's
    own writer cleans after the checkpoints it writes, and a lake only Spark writes
    (``store`` None) is left to it."""
    if store is None:
        return "log cleaned by Delta's Spark writer"
    local = local_path(path)
    log_dir = None if local is None else os.path.join(local, "_delta_log")
    before = None if log_dir is None else len(os.listdir(log_dir))
    try:
        DeltaTable(store.location(path), storage_options=dict(store.options)).cleanup_metadata()
    except DeltaError as exc:
        # Nothing was committed; the next turn tries again.
        return f"log not cleaned: {exc}"
    if log_dir is None or before is None:
        return "expired log files cleaned"
    return f"{before - len(os.listdir(log_dir))} expired log files cleaned"


def _quoted(path: str) -> str:
    """``path`` as a Spark SQL quoted identifier (``delta.`<path>```)."""
    return "`" + path.replace("`", "``") + "`"


def error_condition(exc: Exception) -> str | None:
    """The Spark error condition of ``exc``. Delta raises VACUUM LITE's refusal as a
    ``DeltaIllegalStateException``, which PySpark does not convert: it arrives as a
    ``Py4JJavaError`` whose Java exception carries the condition (measured: caught as a
    ``PySparkException`` only, the refusal failed every later vacuum of the table)."""
    if isinstance(exc, PySparkException):
        return exc.getCondition()
    if isinstance(exc, Py4JJavaError):
        try:
            condition = exc.java_exception.getErrorClass()
        except (Py4JError, AttributeError):
            return None  # not a Spark error: it names no condition
        return None if condition is None else str(condition)
    return None


def vacuum(spark: SparkSession, path: str) -> str:
    """VACUUM the Delta table at ``path`` with its own retention: LITE (files the log
    says were removed), or the full listing when LITE cannot see them all. The caller
    holds the table's lock (:mod:`apply.lake.table_lock`): a VACUUM commits too."""
    TABLE_LOCKS.require(path, "VACUUM")
    try:
        spark.sql(f"VACUUM delta.{_quoted(path)} LITE").collect()
    except (PySparkException, Py4JJavaError) as exc:
        if error_condition(exc) != _CANNOT_VACUUM_LITE:
            raise
        SparkDeltaTable.forPath(spark, path).vacuum()
        return "listed every file (the log no longer reaches the previous vacuum)"
    return "from the log"


@dataclass(frozen=True, slots=True)
class TableUpkeep:
    """The upkeep policy and where its runs are counted: what a batch needs to keep
    its tables in shape (module docstring)."""

    settings: UpkeepSettings
    observer: UpkeepObserver | None = None
    store: DriverStore | None = LOCAL
    """How delta-rs reaches the lake to clean expired logs; None: Spark's writer does."""
    compact_from_driver: bool = True
    """Whether delta-rs compacts the tables the driver writes; off with the driver writer
    (``APPLY_LAKE__DRIVER_WRITE_RECORDS=0``), so that nothing but Spark rewrites data
    files then."""
    checked: CheckedFiles | None = None
    """The files whose instants were read already, the driver's
    (:attr:`apply.lake.driver_merge.DriverTables.checked`)."""

    def after_commit(
        self,
        spark: SparkSession,
        *,
        table: str,
        path: str,
        version_before: int,
        version_after: int,
    ) -> tuple[UpkeepRun, ...]:
        """Run the upkeep ``table`` is due once its commits took it from
        ``version_before`` to ``version_after``; call it in the table's session, after
        its commit, from the one task that writes the table."""

        def run(task: UpkeepTask) -> str:
            if task is UpkeepTask.COMPACT:
                return compact(
                    spark,
                    path,
                    self.settings.target_file_size_mb,
                    self.store,
                    from_driver=self.compact_from_driver,
                    checked=self.checked,
                )
            return vacuum(spark, path)

        tasks = due(self.settings, version_before, version_after, table)
        return run_tasks(table, tasks, run, observer=self.observer)
