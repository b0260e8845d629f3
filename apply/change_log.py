"""A table's change log: where a micro-batch appends its changes when the lake runs with
``lake.change_log`` (docs/lake-change-log.md).

A MERGE into a Delta table costs seconds however few rows it holds (docs/benchmarks.md,
"Where a micro-batch's time goes"), while an append of the same rows costs a fraction
of that. So with the change log on, a batch **appends** each table's changes, reduced to
the latest change per key exactly as the MERGE source is (:func:`apply.merge.merge_source`),
to the table's log, with the table's applied state in the same commit; a **fold**
(:mod:`apply.fold`) later merges the log into the table in one larger MERGE.

Layout: the log of ``schema.table`` is a Delta table at
``<lake_root>/_change-log/<schema>/<table>`` (the same escaped segments as the table,
:mod:`apply.tables`). No schema's segment can be ``_change-log``, since an escaped
segment's ``-`` always starts a two-digit hex escape, so the folder never meets a
table's; and a log sits one level deeper than the ``<root>/*/*`` glob that finds tables.

Its columns are the table's data columns, with the table's position columns
(``_cdc_commit_lsn``, ``_cdc_ordinal``, ``_cdc_commit_ts``), and:

- ``_cdc_op``: ``INSERT``, ``UPDATE``, ``READ`` (a snapshot row) or ``DELETE``, as in
  the change records;
- ``_cdc_seq``: the sequence number of the append that wrote the row. It is the log
  version the append was planned to get (the job is the log's only writer), so it grows
  with every append, and a fold can say "every row up to sequence S" in one number.

Guarantees:

- **Applied means logged.** The append commits the rows and the table's new
  :class:`~apply.positions.AppliedState` together (``userMetadata``, with ``txnAppId``
  and the batch id as ``txnVersion``, so a replayed batch appends nothing). The state
  carries the append's sequence (``log_seq``). A table's applied state is the newer of
  its log's and its table's (:func:`newer_state`).
- **A log is a suffix.** Rows leave the log only from its oldest end (:func:`trim`),
  so for every key, the newest row the log holds, if any, is the key's newest change.
- **What goes to the log.** Every batch but one with a TRUNCATE or one that replaces
  the table (a retyped column after a resync): those first fold and empty the log, then
  are merged into the table as without a log (:mod:`apply.batch`), so a change in the
  table is never older than a row left in the log. Rows go to the log whole: an
  unchanged TOAST value is taken from the freshest view before the append
  (:func:`resolve_unchanged`).

The freshest view (:func:`freshest_view_sql`) reads the table and its log together:
for each key, the log's newest row wins when it is positioned after the table's row
(or the table has none), a winning ``DELETE`` hides the key, and every other table row
stands. It is plain SQL that Spark SQL, DuckDB and DataFusion (delta-rs) all run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from apply.decode import COMMIT_LSN, COMMIT_TS, MALFORMED, OP, ORDINAL, ROW, UNCHANGED
from apply.delta_schema import (
    COMMIT_LSN_COLUMN,
    COMMIT_TS_COLUMN,
    KEY_COLUMNS_PROPERTY,
    METADATA_FIELDS,
    ORDINAL_COLUMN,
    ColumnSpec,
    read_existing_table,
    support_timestamp_ntz,
)
from apply.errors import ConfigError, TransientError
from apply.merge import CONCURRENT_WRITES, MergeOutcome, MergeSource, own_outcome
from apply.positions import AppliedState, covers
from apply.tables import TableId, table_of_segments, table_path
from schemas.naming import topic_segment
from schemas.operation import Operation

CHANGE_LOG_DIR = "_change-log"
"""The folder under the lake root that holds every table's change log."""
OP_COLUMN = "_cdc_op"
SEQ_COLUMN = "_cdc_seq"
LOG_OF_PROPERTY = "pgdelta.changeLogOf"
"""Table property of a change log naming its source table, ``schema.table``."""

LOG_UPKEEP = frozenset({"DELETE", "OPTIMIZE", "VACUUM START", "VACUUM END"})
"""Operations of the commits on a log besides its appends: trims and upkeep, which
change neither its applied state nor its columns (:class:`apply.known_tables.KnownTables`)."""

LOG_FIELDS: tuple[StructField, ...] = (
    *METADATA_FIELDS,
    StructField(OP_COLUMN, StringType(), nullable=True),
    StructField(SEQ_COLUMN, LongType(), nullable=True),
)


def change_log_path(lake_root: str, table: TableId) -> str:
    """Where the change log of ``table`` lives under ``lake_root``."""
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


def log_schema(columns: Sequence[ColumnSpec]) -> StructType:
    """The log's schema: the table's data columns, then :data:`LOG_FIELDS`."""
    return StructType(
        [StructField(column.name, column.data_type, nullable=True) for column in columns]
        + list(LOG_FIELDS)
    )


def newer_state(table: AppliedState | None, log: AppliedState | None) -> AppliedState | None:
    """The applied state of a table from its table's and its log's newest states: the
    one that covers the other's offsets. Both come from one stream of batches, so one
    always does; the log's wins a tie, since it names the newest append."""
    if table is None:
        return log
    if log is None:
        return table
    log_next = {key: progress.next_offset for key, progress in log.partitions.items()}
    if covers(table, log_next) and not covers(log, _next_offsets(table)):
        return table
    return log


def _next_offsets(state: AppliedState) -> dict[tuple[str, int], int]:
    return {key: progress.next_offset for key, progress in state.partitions.items()}


def create_log(
    spark: SparkSession,
    path: str,
    table: TableId,
    columns: Sequence[ColumnSpec],
    keys: Sequence[str],
) -> None:
    """Create the log (a commit of its own, idempotent). Partitioned by ``_cdc_seq``, one
    partition per append: a trim is then a metadata-only commit (no Spark job), and it
    never conflicts with an append running beside it (Delta checks a DELETE against the
    partitions it read), so a batch appends while its table is being folded. No deletion
    vectors, so every reader can read the log."""
    (
        DeltaTable.createIfNotExists(spark)
        .location(path)
        .addColumns(log_schema(columns))
        .partitionedBy(SEQ_COLUMN)
        .property(LOG_OF_PROPERTY, str(table))
        .property(KEY_COLUMNS_PROPERTY, json.dumps(list(keys)))
        .property("delta.enableDeletionVectors", "false")
        .execute()
    )


def reshape_log(spark: SparkSession, path: str, columns: Sequence[ColumnSpec]) -> None:
    """Give an emptied log the table's columns after the table was replaced or took new
    columns directly (:mod:`apply.batch`): an overwrite with no rows and the new schema,
    one commit. The log must hold no rows (the fold before the batch trimmed them)."""
    support_timestamp_ntz(spark, path, columns)
    (
        spark.createDataFrame([], log_schema(columns))
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .partitionBy(SEQ_COLUMN)
        .save(path)
    )


@dataclass(frozen=True, slots=True)
class Append:
    """One batch's rows for a table's log, and the commit they go in."""

    path: str
    table: str
    seq: int
    version_before: int
    app_id: str
    batch_id: int
    metadata: str


def append(
    spark: SparkSession, source: MergeSource, columns: Sequence[ColumnSpec], to: Append
) -> MergeOutcome:
    """Append the latest change per key (``source``, the MERGE's source) to the log in
    one commit carrying the batch's transaction id and state; a batch committed before
    appends nothing (Delta skips it)."""
    row = sf.col(ROW)
    frame = source.frame.select(
        *[row[c.name].cast(c.data_type).alias(c.name) for c in columns],
        sf.col(COMMIT_LSN).cast(LongType()).alias(COMMIT_LSN_COLUMN),
        sf.col(ORDINAL).cast(LongType()).alias(ORDINAL_COLUMN),
        sf.col(COMMIT_TS).alias(COMMIT_TS_COLUMN),
        sf.col(OP).alias(OP_COLUMN),
        sf.lit(to.seq).cast(LongType()).alias(SEQ_COLUMN),
    )
    try:
        (
            frame.write.format("delta")
            .mode("append")
            .option("mergeSchema", "true")
            .option("txnAppId", to.app_id)
            .option("txnVersion", str(to.batch_id))
            .option("userMetadata", to.metadata)
            .save(to.path)
        )
    except CONCURRENT_WRITES as exc:
        raise TransientError(
            f"table {to.table}: another writer committed to its change log {to.path}; "
            "retry the batch, and make sure one apply job owns each table"
        ) from exc
    return own_outcome(spark, to.path, to.version_before, to.app_id, to.batch_id)


def resolve_unchanged(
    spark: SparkSession,
    source: MergeSource,
    *,
    table_path: str,
    log_path: str,
    columns: Sequence[ColumnSpec],
    key_columns: Sequence[str],
) -> MergeSource:
    """``source`` with every unchanged TOAST value filled in from the freshest view (the
    table overlaid with its log, as it stands before this batch), so the log holds whole
    rows and neither the fold nor the view has to look back for them. A key the view
    lacks keeps null, as a MERGE inserting it would. Costs a join with the table and its
    log, only for a batch that has such values; the others pass through."""
    if not source.unchanged_columns:
        return source
    names = [c.name for c in columns]
    current = spark.sql(
        freshest_view_sql("{t}", "{l}", names, key_columns, "spark"),
        t=spark.read.format("delta").load(table_path),
        l=spark.read.format("delta").load(log_path),
    ).select(
        *[sf.col(k).alias(f"_key_{i}") for i, k in enumerate(key_columns)],
        *[sf.col(name).alias(f"_now_{name}") for name in source.unchanged_columns],
    )
    matches = [
        sf.col(ROW)[key].eqNullSafe(sf.col(f"_key_{i}")) for i, key in enumerate(key_columns)
    ]
    condition = matches[0]
    for match in matches[1:]:
        condition = condition & match
    joined = source.frame.join(current, condition, "left")
    kept = set(source.unchanged_columns)
    row = sf.struct(
        *[
            (
                sf.when(
                    sf.array_contains(sf.col(UNCHANGED), sf.lit(name)), sf.col(f"_now_{name}")
                ).otherwise(sf.col(ROW)[name])
                if name in kept
                else sf.col(ROW)[name]
            ).alias(name)
            for name in names
        ]
    )
    frame = joined.select(
        OP,
        COMMIT_LSN,
        ORDINAL,
        COMMIT_TS,
        sf.array().cast(ArrayType(StringType())).alias(UNCHANGED),
        row.alias(ROW),
    )
    return MergeSource(frame=frame, unchanged_columns=())


def unfolded(
    spark: SparkSession,
    path: str,
    columns: Sequence[ColumnSpec],
    *,
    after_seq: int | None,
    through_seq: int,
) -> DataFrame:
    """The log's rows with a sequence in ``(after_seq, through_seq]``, in the shape
    :func:`apply.decode.decode_topic` gives (one partition, nothing malformed), so the
    MERGE source is built from them as from a batch. A column the log lacks (added to
    the table while the log was empty) is null."""
    rows = spark.read.format("delta").load(path)
    present = set(rows.columns)
    seq = sf.col(SEQ_COLUMN)
    window = seq <= sf.lit(through_seq)
    if after_seq is not None:
        window = window & (seq > sf.lit(after_seq))
    return rows.where(window).select(
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


def trim(spark: SparkSession, path: str, through_seq: int) -> None:
    """Delete the log's rows up to sequence ``through_seq``: its oldest end, so the log
    stays a suffix. The predicate is on the partition column: a metadata-only commit."""
    DeltaTable.forPath(spark, path).delete(sf.col(SEQ_COLUMN) <= sf.lit(through_seq))


Dialect = Literal["spark", "duckdb", "datafusion"]
"""Spark SQL quotes identifiers with backticks; DuckDB and DataFusion (delta-rs) with
double quotes."""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def freshest_view_sql(
    table_source: str,
    log_source: str,
    columns: Sequence[str],
    key_columns: Sequence[str],
    dialect: Dialect = "spark",
) -> str:
    """A query that reads the table overlaid with its log's newer changes (module
    docstring). ``table_source`` and ``log_source`` are how the engine names the two
    Delta tables (Spark: ``delta.`<path>```; DuckDB: ``delta_scan('<path>')``; delta-rs: the names
    registered with its ``QueryBuilder``)."""
    q = (lambda name: f"`{name.replace('`', '``')}`") if dialect == "spark" else _quote
    lsn, ordinal, ts = q(COMMIT_LSN_COLUMN), q(ORDINAL_COLUMN), q(COMMIT_TS_COLUMN)
    op = q(OP_COLUMN)
    keys = ", ".join(f"l.{q(k)}" for k in key_columns)
    # Parenthesised: DataFusion's parser binds a following AND into IS NOT DISTINCT FROM.
    same_key = " AND ".join(f"(t.{q(k)} IS NOT DISTINCT FROM l.{q(k)})" for k in key_columns)
    t_data = ", ".join(f"t.{q(c)}" for c in columns)
    l_data = ", ".join(f"l.{q(c)}" for c in columns)
    log_after_table = f"(l.{lsn} > t.{lsn} OR (l.{lsn} = t.{lsn} AND l.{ordinal} > t.{ordinal}))"
    # Identifiers are quoted for the dialect; the two sources are the caller's own text.
    return (
        f"WITH ranked AS (\n"  # noqa: S608
        f"  SELECT l.*, ROW_NUMBER() OVER (PARTITION BY {keys} "
        f"ORDER BY l.{lsn} DESC, l.{ordinal} DESC) AS _cdc_rank\n"
        f"  FROM {log_source} AS l\n"
        f"), latest AS (SELECT * FROM ranked WHERE _cdc_rank = 1)\n"
        f"SELECT {t_data}, t.{lsn}, t.{ordinal}, t.{ts} FROM {table_source} AS t\n"
        f"WHERE NOT EXISTS (SELECT 1 FROM latest AS l WHERE {same_key} AND {log_after_table})\n"
        f"UNION ALL\n"
        f"SELECT {l_data}, l.{lsn}, l.{ordinal}, l.{ts} FROM latest AS l\n"
        f"WHERE l.{op} <> '{Operation.DELETE.value}' AND NOT EXISTS (\n"
        f"  SELECT 1 FROM {table_source} AS t WHERE {same_key} AND NOT {log_after_table})"
    )


def view_sql(spark: SparkSession, lake_root: str, table: TableId, dialect: Dialect) -> str:
    """:func:`freshest_view_sql` for ``table`` with its columns and key read from its Delta
    table, naming the two tables as ``dialect`` does: Spark ``delta.`<path>```, DuckDB
    ``delta_scan('<path>')``, delta-rs's ``QueryBuilder`` the table registered as ``t``
    and its log as ``l``."""
    path = table_path(lake_root, table)
    existing = read_existing_table(spark, path, table)
    if existing is None:
        raise ConfigError(f"{table} has no Delta table at {path} yet")
    log_path = change_log_path(lake_root, table)
    sources = {
        "spark": (f"delta.`{path}`", f"delta.`{log_path}`"),
        "duckdb": (f"delta_scan('{path}')", f"delta_scan('{log_path}')"),
        "datafusion": ('"t"', '"l"'),
    }[dialect]
    return freshest_view_sql(
        *sources, [column.name for column in existing.columns], existing.key_columns, dialect
    )


__all__ = [
    "CHANGE_LOG_DIR",
    "LOG_FIELDS",
    "LOG_OF_PROPERTY",
    "LOG_UPKEEP",
    "OP_COLUMN",
    "SEQ_COLUMN",
    "Append",
    "append",
    "change_log_path",
    "create_log",
    "freshest_view_sql",
    "log_schema",
    "logged_tables",
    "newer_state",
    "reshape_log",
    "resolve_unchanged",
    "trim",
    "unfolded",
    "view_sql",
]
