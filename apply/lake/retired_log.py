"""The retired change log: what a lake that ran with it still holds, folded into its
tables once at start (docs/lake-change-log.md).

Apply used to offer an opt-in change log: each batch appended a table's latest change
per key to a Delta table of its own at ``<lake_root>/_change-log/<schema>/<table>``,
with the table's applied state in the append's commit, and a timer folded the log into
the table with one MERGE now and then. A logged change counted as applied, so capture
confirmed the slot past it: a log can hold the only copy of changes its table lacks.
The table is now fresh at every default (:mod:`apply.lake.driver_merge`), and the log is
gone; this module keeps what an upgrade needs so that nothing is lost.

A log's rows carry the table's data columns, the position and commit time columns, the
operation (``_cdc_op``) and the sequence of the append that wrote them (``_cdc_seq``).
Each append's state carries its sequence as ``log_seq``; each fold's MERGE carried the
log's state into the table with ``log_seq`` set to the sequence it folded up to, the
table's **watermark**. So the log's newest state, with sequence S, is folded when:

- the table's watermark is below S (or it has none), and
- the table's state does not cover the log's offsets: a batch the log could not take
  (a TRUNCATE, a replaced table) folded and emptied the log, then MERGEd into the table
  directly, leaving a table state newer than the log's but without a watermark.

The fold is the one the timer ran: the log's rows with a sequence above the watermark,
reduced to the latest change per key, MERGEd with the position guard (no row goes back
to an older state), the log's state with ``log_seq`` = S in the commit, under the
``txnAppId`` ``<query>:fold`` and ``txnVersion`` S. Its commit is the watermark, so a
second start finds nothing to fold; a fold Delta skips as committed before, on a table
whose watermark is below S, means the log does not belong to the table as it is now,
and the job stops.

The job never deletes a log: it warns, at every start, that the log is retired and its
folder can be deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import ArrayType, LongType, StringType

from apply.errors import RetiredChangeLogError
from apply.lake.decode import COMMIT_LSN, COMMIT_TS, MALFORMED, OP, ORDINAL, ROW, UNCHANGED
from apply.lake.delta_schema import (
    COMMIT_LSN_COLUMN,
    COMMIT_TS_COLUMN,
    ORDINAL_COLUMN,
    ColumnPlan,
    ColumnSpec,
    read_existing_table,
)
from apply.lake.history import read_history
from apply.lake.positions import AppliedState, covers, encode_state
from apply.lake.spark_merge import merge_into, merge_source
from apply.lake.table_lock import TABLE_LOCKS
from apply.lake.tables import TableId, table_of_segments, table_path
from schemas.naming import topic_segment

log = logging.getLogger(__name__)

CHANGE_LOG_DIR = "_change-log"
"""The folder under the lake root that held every table's change log. No schema's
escaped segment can be ``_change-log`` (an escaped ``-`` starts a hex escape)."""
OP_COLUMN = "_cdc_op"
SEQ_COLUMN = "_cdc_seq"
FOLD_SUFFIX = ":fold"


def change_log_path(lake_root: str, table: TableId) -> str:
    """Where the change log of ``table`` was written under ``lake_root``."""
    return (
        f"{lake_root.rstrip('/')}/{CHANGE_LOG_DIR}/"
        f"{topic_segment(table.schema)}/{topic_segment(table.table)}"
    )


def logged_tables(spark: SparkSession, lake_root: str) -> list[TableId]:
    """Every table with a change log under ``lake_root``."""
    jvm: Any = spark.sparkContext._jvm  # Hadoop FS lives on the JVM only
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    pattern = jvm.org.apache.hadoop.fs.Path(
        f"{lake_root.rstrip('/')}/{CHANGE_LOG_DIR}/*/*/_delta_log"
    )
    found = []
    for status in pattern.getFileSystem(conf).globStatus(pattern) or []:
        log_dir = status.getPath().getParent()
        try:
            found.append(table_of_segments(log_dir.getParent().getName(), log_dir.getName()))
        except ValueError:
            continue  # not a folder apply writes
    return sorted(found)


def fold_app_id(app_id: str) -> str:
    """The ``txnAppId`` of the folds of a query's logs."""
    return app_id + FOLD_SUFFIX


def _next_offsets(state: AppliedState) -> dict[tuple[str, int], int]:
    return {key: progress.next_offset for key, progress in state.partitions.items()}


def holds_log(table_state: AppliedState | None, logged: AppliedState) -> bool:
    """Whether a table whose newest state is ``table_state`` holds every change of a log
    whose newest state is ``logged`` (module docstring)."""
    if table_state is None:
        return False
    if logged.log_seq is None:
        return True  # not a log append's state: nothing the table could lack
    watermark = table_state.log_seq
    if watermark is not None and watermark >= logged.log_seq:
        return True
    return covers(table_state, _next_offsets(logged))


def _unfolded(
    spark: SparkSession, path: str, columns: list[ColumnSpec], *, after_seq: int | None
) -> DataFrame:
    """The log's rows with a sequence above ``after_seq``, in the shape
    :func:`apply.lake.decode.decode_topic` gives (one partition, nothing malformed), so the
    MERGE source is built from them as from a batch. A column the log lacks is null."""
    rows = spark.read.format("delta").load(path)
    if after_seq is not None:
        rows = rows.where(sf.col(SEQ_COLUMN) > sf.lit(after_seq))
    present = set(rows.columns)
    return rows.select(
        sf.lit(0).alias("partition"),
        sf.lit(0).cast(LongType()).alias("offset"),
        sf.lit(False).alias(MALFORMED),
        sf.col(OP_COLUMN).alias(OP),
        sf.col(COMMIT_LSN_COLUMN).alias(COMMIT_LSN),
        sf.col(ORDINAL_COLUMN).alias(ORDINAL),
        sf.col(COMMIT_TS_COLUMN).alias(COMMIT_TS),
        sf.array().cast(ArrayType(StringType())).alias(UNCHANGED),
        sf.struct(
            *[
                (sf.col(c.name) if c.name in present else sf.lit(None))
                .cast(c.data_type)
                .alias(c.name)
                for c in columns
            ]
        ).alias(ROW),
    )


@dataclass(frozen=True, slots=True)
class RetiredLog:
    """A change log found at start, and what its fold did."""

    table: TableId
    path: str
    folded_through: int | None
    """The sequence the fold merged up to; None: the table held every change already."""
    version: int | None
    """The table's version after the fold; None when nothing was folded."""


def fold_retired_log(
    spark: SparkSession, *, lake_root: str, table: TableId, default_app_id: str
) -> RetiredLog:
    """Fold the change log of ``table`` into the table when it holds changes the table
    lacks (module docstring), under the table's lock. Raises
    :class:`~apply.errors.RetiredChangeLogError` when they cannot be folded."""
    name = str(table)
    log_path = change_log_path(lake_root, table)
    logged = read_history(spark, log_path, name)
    if logged is None or logged.state is None or logged.state.log_seq is None:
        return RetiredLog(table, log_path, folded_through=None, version=None)
    path = table_path(lake_root, table)
    try:
        with TABLE_LOCKS.held(path):
            return _fold(
                spark,
                table,
                path=path,
                log_path=log_path,
                logged=logged.state,
                default_app_id=default_app_id,
            )
    except RetiredChangeLogError:
        raise
    except Exception as exc:
        raise RetiredChangeLogError(name, log_path, f"the fold failed: {exc}") from exc


def _fold(
    spark: SparkSession,
    table: TableId,
    *,
    path: str,
    log_path: str,
    logged: AppliedState,
    default_app_id: str,
) -> RetiredLog:
    """:func:`fold_retired_log` under the table's lock."""
    name = str(table)
    through = logged.log_seq
    assert through is not None  # fold_retired_log checked
    history = read_history(spark, path, name)
    existing = read_existing_table(spark, path, table) if history is not None else None
    if history is None or existing is None:
        raise RetiredChangeLogError(
            name, log_path, "its Delta table is missing, so there is nothing to fold into"
        )
    if holds_log(history.state, logged):
        return RetiredLog(table, log_path, folded_through=None, version=None)
    watermark = None if history.state is None else history.state.log_seq
    plan = ColumnPlan(
        columns=existing.columns, added=(), key_columns=existing.key_columns, create=False
    )
    source = merge_source(
        _unfolded(spark, log_path, list(plan.columns), after_seq=watermark),
        previous=None,
        topic="",
        plan=plan,
        erased_before=None if history.state is None else history.state.truncated_at,
        unchanged_columns=frozenset(),
    )
    outcome = merge_into(
        spark,
        path=path,
        table=name,
        source=source,
        plan=plan,
        truncate=None,
        version_before=history.version,
        app_id=fold_app_id(logged.txn_app_id or default_app_id),
        batch_id=through,
        metadata=encode_state(replace(logged, log_seq=through)),
    )
    if not outcome.committed:
        raise RetiredChangeLogError(
            name,
            log_path,
            f"its fold up to sequence {through} was committed before, yet the table holds "
            f"the log only up to {watermark}: the table was recreated since",
        )
    return RetiredLog(table, log_path, folded_through=through, version=outcome.version)


def fold_retired_logs(
    spark: SparkSession, *, lake_root: str, default_app_id: str
) -> list[RetiredLog]:
    """Fold every change log under ``lake_root`` that holds changes its table lacks,
    then warn, per log, that it is retired and may be deleted: before the job's queries
    start, so the tables hold every change the slot was confirmed past."""
    found = []
    for table in logged_tables(spark, lake_root):
        retired = fold_retired_log(
            spark, lake_root=lake_root, table=table, default_app_id=default_app_id
        )
        if retired.folded_through is not None:
            log.warning(
                "the change log of %s is retired: its changes up to sequence %d were folded "
                "into the table (version %d); delete %s",
                table,
                retired.folded_through,
                retired.version,
                retired.path,
                extra={"table": str(table)},
            )
        else:
            log.warning(
                "the change log of %s is retired and the table holds every change it "
                "logged; delete %s",
                table,
                retired.path,
                extra={"table": str(table)},
            )
        found.append(retired)
    return found


__all__ = [
    "CHANGE_LOG_DIR",
    "RetiredLog",
    "change_log_path",
    "fold_app_id",
    "fold_retired_log",
    "fold_retired_logs",
    "holds_log",
    "logged_tables",
]
