"""The dead-letter Delta table: records of errored tables, parked until someone acts.

A table whose micro-batch fails for a definite reason (:class:`~apply.errors.TableError`)
is *parked*: the Kafka records of its topic in that batch are written here, bytes as
they were read, and the table stays **errored** until ``python -m apply reapply`` has
applied them (:mod:`apply.reapply`). Every later batch parks the errored table's
records too, so its records stay in position order behind the first one that failed,
while the other tables go on.

Location: ``<lake_root>/dead-letter``. A table's directory is two escaped segments
(``<schema>/<table>``) in which ``-`` always starts a two-hex-digit escape
(:mod:`apply.lake.tables`); ``dead-letter`` is one segment with ``-le``, so it can never be
the directory of a schema, and the restart scan of ``<lake_root>/*/*/_delta_log`` never
mistakes it for a table.

One row per parked Kafka record (:data:`DEAD_LETTER_SCHEMA`): the table, the record's
coordinates and bytes (key, value, headers when the source read them), its writer
fingerprint, its position when it decodes, the error, the micro-batch and time that
parked it, and, once re-applied, when and into which version of the lake table.

Invariants:

- **The errored state is the rows.** A table is errored exactly while it has rows here
  that are neither re-applied nor discarded (``reapplied_at`` and ``discarded_at``
  null). Parking a table and marking it errored is therefore one atomic commit, and
  re-applying and clearing it is the release commit (:func:`release`); there is no
  second place that could disagree.
- **Parking is idempotent by Kafka coordinates.** A record whose ``(topic, partition,
  offset)`` is already here is not written again, so a micro-batch replayed under the
  same id, or its records read again under a later id (a lost checkpoint), adds nothing
  and writes no commit. Delta's ``txnAppId``/``txnVersion`` cannot serve here as they
  do for the lake tables: a replayed batch may park a different set of tables than its
  first attempt (a table can turn errored in between), and Delta would then skip the
  second append as a whole and silently drop records already reported as parked. The
  streaming job is the only writer that adds rows, so the anti-join is exact.
- **Releasing never conflicts with parking.** Parking is a blind append and releasing an
  ``UPDATE`` of rows already there; under Delta's default ``WriteSerializable``
  isolation a blind append does not conflict with an update, whichever commits first.
- **Discarding is the operator's act, per record** (:func:`discard`): a record that can
  never be applied (it does not decode, its schema is gone for good) is marked
  discarded by its Kafka coordinates, so ``reapply`` can apply the others. It stays
  here, bytes and all, for inspection; nothing is deleted.
- Parked records are durable and replayable from here, independent of Kafka's
  retention and of the replication slot: that is what allows the control topic to count
  them as done (docs/apply.md, errored tables).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
)
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from apply.errors import TransientError
from apply.lake.decode import COMMIT_LSN, ORDINAL, decode_positions
from apply.lake.delta_log import newest_local_version, sync_commits
from apply.lake.delta_schema import ValueSchema
from apply.lake.positions import Position, TopicPartition
from apply.lake.table_lock import TABLE_LOCKS
from schemas.lsn import Lsn

log = logging.getLogger(__name__)

DIRECTORY = "dead-letter"

TABLE = "source_table"
TOPIC = "topic"
PARTITION = "partition"
OFFSET = "offset"
BATCH_ID = "batch_id"
ERROR = "error"
ERROR_KIND = "error_kind"
REAPPLIED_AT = "reapplied_at"
REAPPLIED_VERSION = "reapplied_version"
DISCARDED_AT = "discarded_at"

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
DEAD_LETTER_SCHEMA = StructType(
    [
        StructField(TABLE, StringType(), nullable=False),
        StructField(TOPIC, StringType(), nullable=False),
        StructField(PARTITION, IntegerType(), nullable=False),
        StructField(OFFSET, LongType(), nullable=False),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("headers", HEADERS_TYPE),
        StructField("fingerprint", StringType()),
        StructField(COMMIT_LSN, LongType()),
        StructField(ORDINAL, LongType()),
        StructField(ERROR, StringType(), nullable=False),
        StructField(ERROR_KIND, StringType(), nullable=False),
        StructField(BATCH_ID, LongType(), nullable=False),
        StructField("parked_at", TimestampType(), nullable=False),
        StructField(REAPPLIED_AT, TimestampType()),
        StructField(REAPPLIED_VERSION, LongType()),
        StructField(DISCARDED_AT, TimestampType()),
    ]
)
"""Columns of the dead-letter table (docs/apply.md, dead-letter table)."""

METADATA_KEY = "pgdelta.dead_letter"
"""Marks the commit metadata of a parking commit; its value is the format version."""

# An UPDATE that loses against a concurrent rewrite of the same rows is simply redone.
_RELEASE_ATTEMPTS = 5
_RELEASE_CONFLICTS = (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
)


def dead_letter_path(lake_root: str) -> str:
    """Where the dead-letter table of ``lake_root`` lives (module docstring)."""
    return f"{lake_root.rstrip('/')}/{DIRECTORY}"


@dataclass(frozen=True, slots=True)
class ErroredTable:
    """A table with parked records not re-applied yet."""

    table: str
    """The source table, ``schema.table``."""
    since_batch: int
    """The micro-batch that parked its first record still waiting."""
    error: str
    """The error that parked it then."""
    error_kind: str
    records: int
    """Records parked and waiting."""
    newest: Position | None = None
    """The position of the newest waiting record that has one."""
    unpositioned: int = 0
    """Waiting records other than tombstones without a position (they did not decode)."""


@dataclass(frozen=True, slots=True)
class ParkRequest:
    """One table's records of a micro-batch to park."""

    table: str
    topic: str
    error: str
    error_kind: str
    schemas: Sequence[ValueSchema]
    """Writer schemas of the records that could be parsed: they give the positions of
    the records that decode. May be empty."""


def _exists(spark: SparkSession, path: str) -> bool:
    return bool(DeltaTable.isDeltaTable(spark, path))


def _waiting() -> Column:
    return sf.col(REAPPLIED_AT).isNull() & sf.col(DISCARDED_AT).isNull()


def errored_tables(spark: SparkSession, path: str) -> dict[str, ErroredTable]:
    """The tables that are errored now (module docstring), by name. One Spark job, which
    data skipping keeps small: released files hold no null ``reapplied_at``."""
    if not _exists(spark, path):
        return {}
    rows = (
        spark.read.format("delta")
        .load(path)
        .where(_waiting())
        .groupBy(TABLE)
        .agg(
            sf.min(BATCH_ID).alias("since"),
            sf.min_by(sf.struct(ERROR, ERROR_KIND), sf.struct(BATCH_ID, OFFSET)).alias("first"),
            sf.count(sf.lit(1)).alias("records"),
            sf.max(sf.struct(COMMIT_LSN, ORDINAL)).alias("newest"),
            # Tombstones have no position, and need none: apply skips them.
            sf.count_if(sf.col("value").isNotNull() & sf.col(COMMIT_LSN).isNull()).alias(
                "unpositioned"
            ),
        )
        .collect()
    )
    return {
        row[TABLE]: ErroredTable(
            table=row[TABLE],
            since_batch=int(row["since"]),
            error=row["first"][ERROR],
            error_kind=row["first"][ERROR_KIND],
            records=int(row["records"]),
            newest=_position(row["newest"]),
            unpositioned=int(row["unpositioned"]),
        )
        for row in rows
    }


def _position(value: Row | None) -> Position | None:
    if value is None or value[COMMIT_LSN] is None:
        return None
    return Position(Lsn(int(value[COMMIT_LSN])), int(value[ORDINAL]))


def _ensure(spark: SparkSession, path: str) -> None:
    # Every commit to the dead-letter table holds its lock (apply.lake.table_lock), as every
    # commit to a lake table does: tables' tasks release parked records in parallel.
    with TABLE_LOCKS.held(path):
        DeltaTable.createIfNotExists(spark).location(path).addColumns(DEAD_LETTER_SCHEMA).execute()


def _records(batch: DataFrame, request: ParkRequest, batch_id: int) -> DataFrame:
    records = batch.where(sf.col("topic") == sf.lit(request.topic))
    headers = (
        sf.col("headers").cast(HEADERS_TYPE)
        if "headers" in batch.columns
        else sf.lit(None).cast(HEADERS_TYPE)
    )
    positioned = decode_positions(records, request.schemas)
    return positioned.select(
        sf.lit(request.table).alias(TABLE),
        sf.col("topic").alias(TOPIC),
        sf.col("partition").cast(IntegerType()).alias(PARTITION),
        sf.col("offset").cast(LongType()).alias(OFFSET),
        sf.col("key"),
        sf.col("value"),
        headers.alias("headers"),
        sf.col("fingerprint"),
        sf.col(COMMIT_LSN),
        sf.col(ORDINAL),
        sf.lit(request.error).alias(ERROR),
        sf.lit(request.error_kind).alias(ERROR_KIND),
        sf.lit(batch_id).cast(LongType()).alias(BATCH_ID),
        sf.current_timestamp().alias("parked_at"),
        sf.lit(None).cast(TimestampType()).alias(REAPPLIED_AT),
        sf.lit(None).cast(LongType()).alias(REAPPLIED_VERSION),
        sf.lit(None).cast(TimestampType()).alias(DISCARDED_AT),
    )


def park(
    spark: SparkSession, path: str, batch: DataFrame, batch_id: int, requests: Sequence[ParkRequest]
) -> dict[str, int]:
    """Park the requested tables' records of ``batch`` in one commit; records already
    parked are left out, and nothing is committed when none is new. Returns the records
    written per table."""
    if not requests:
        return {}
    with TABLE_LOCKS.held(path):
        before = newest_local_version(path)
        _ensure(spark, path)
        written = _park_new(spark, path, batch, batch_id, requests)
        # Parked counts as applied: the slot is confirmed past these records once the
        # batch's progress is published, so the commits must outlive a host crash
        # (apply.lake.delta_log.sync_commits), the table's creation included.
        newest = newest_local_version(path)
        if newest is not None:
            sync_commits(path, 0 if before is None else before + 1, newest)
        return written


def _park_new(
    spark: SparkSession, path: str, batch: DataFrame, batch_id: int, requests: Sequence[ParkRequest]
) -> dict[str, int]:
    frames = [_records(batch, request, batch_id) for request in requests]
    new = frames[0]
    for frame in frames[1:]:
        new = new.unionByName(frame)
    parked = (
        spark.read.format("delta")
        .load(path)
        .where(sf.col(TOPIC).isin([request.topic for request in requests]))
        .select(TOPIC, PARTITION, OFFSET)
    )
    new = new.join(parked, [TOPIC, PARTITION, OFFSET], "left_anti").persist()
    try:
        counts = {row[TABLE]: int(row["count"]) for row in new.groupBy(TABLE).count().collect()}
        written = {request.table: counts.get(request.table, 0) for request in requests}
        if not any(written.values()):
            return written
        metadata = {
            METADATA_KEY: 1,
            "batch_id": batch_id,
            "parked": {table: n for table, n in sorted(written.items()) if n},
        }
        (
            new.write.format("delta")
            .mode("append")
            .option("userMetadata", json.dumps(metadata, separators=(",", ":")))
            .save(path)
        )
        return written
    finally:
        new.unpersist()


def waiting_records(spark: SparkSession, path: str, table: str) -> DataFrame:
    """The parked records of ``table`` not re-applied yet, with the columns of Spark's
    Kafka source the apply path reads (``topic``, ``partition``, ``offset``, ``key``,
    ``value``) and ``batch_id``."""
    return (
        spark.read.format("delta")
        .load(path)
        .where((sf.col(TABLE) == sf.lit(table)) & _waiting())
        .select(TOPIC, PARTITION, OFFSET, "key", "value", BATCH_ID)
    )


def release(
    spark: SparkSession, path: str, table: str, up_to_batch: int, lake_version: int | None
) -> None:
    """Mark the waiting records of ``table`` parked by micro-batches up to ``up_to_batch``
    as re-applied into ``lake_version`` of its Delta table (None: they were tombstones of
    a table that has no Delta table yet). Records parked later stay
    waiting, so the table stays errored until they are re-applied too. Idempotent."""
    condition = (
        (sf.col(TABLE) == sf.lit(table)) & _waiting() & (sf.col(BATCH_ID) <= sf.lit(up_to_batch))
    )
    values: dict[str, str | Column] = {
        REAPPLIED_AT: sf.current_timestamp(),
        REAPPLIED_VERSION: sf.lit(lake_version).cast(LongType()),
    }
    _update(spark, path, table, condition, values)


def release_superseded(
    spark: SparkSession, path: str, table: str, erased_before: Position, lake_version: int | None
) -> None:
    """Mark the waiting records of ``table`` positioned before ``erased_before``, a
    TRUNCATE that ``lake_version`` of its Delta table holds, as re-applied into that
    version: the TRUNCATE erased whatever they carried, so applying them could change
    nothing (docs/apply.md, errored tables); tombstones, which apply skips, go with them.
    Records without a position stay waiting. Idempotent."""
    lsn, ordinal = sf.col(COMMIT_LSN), sf.col(ORDINAL)
    before = (lsn < sf.lit(erased_before.commit_lsn)) | (
        (lsn == sf.lit(erased_before.commit_lsn)) & (ordinal < sf.lit(erased_before.ordinal))
    )
    superseded = sf.col("value").isNull() | (lsn.isNotNull() & before)
    condition = (sf.col(TABLE) == sf.lit(table)) & _waiting() & superseded
    values: dict[str, str | Column] = {
        REAPPLIED_AT: sf.current_timestamp(),
        REAPPLIED_VERSION: sf.lit(lake_version).cast(LongType()),
    }
    _update(spark, path, table, condition, values)


def _update(
    spark: SparkSession,
    path: str,
    table: str,
    condition: Column,
    values: dict[str, str | Column],
) -> None:
    """An UPDATE of the dead-letter table, redone when it loses against a concurrent
    commit that rewrote the same files (a parking append never does)."""
    for attempt in range(_RELEASE_ATTEMPTS):
        try:
            with TABLE_LOCKS.held(path):
                DeltaTable.forPath(spark, path).update(condition, values)
        except _RELEASE_CONFLICTS as exc:
            if attempt + 1 == _RELEASE_ATTEMPTS:
                raise TransientError(
                    f"table {table}: the dead-letter table at {path} kept changing during "
                    "the update; run the command again (it is idempotent)"
                ) from exc
            log.info(
                "an update of the dead-letter rows of %s raced another commit, retrying", table
            )
            continue
        return


def discard(
    spark: SparkSession, path: str, table: str, *, topic: str, partition: int, offset: int
) -> bool:
    """Mark the waiting parked record of ``table`` at ``topic``/``partition``/``offset``
    discarded (module docstring); False when no such record waits. Idempotent: a
    discarded record no longer waits."""
    if not _exists(spark, path):
        return False
    condition = (
        (sf.col(TABLE) == sf.lit(table))
        & (sf.col(TOPIC) == sf.lit(topic))
        & (sf.col(PARTITION) == sf.lit(partition))
        & (sf.col(OFFSET) == sf.lit(offset))
        & _waiting()
    )
    if spark.read.format("delta").load(path).where(condition).limit(1).count() == 0:
        return False
    _update(spark, path, table, condition, {DISCARDED_AT: sf.current_timestamp()})
    return True


def parked_offsets(spark: SparkSession, path: str) -> dict[str, dict[TopicPartition, int]]:
    """Per table and partition, the highest parked offset plus one, re-applied or not:
    below it every record of the partition is in the lake or parked here."""
    if not _exists(spark, path):
        return {}
    rows = (
        spark.read.format("delta")
        .load(path)
        .groupBy(TABLE, TOPIC, PARTITION)
        .agg(sf.max(OFFSET).alias("last"))
        .collect()
    )
    offsets: dict[str, dict[TopicPartition, int]] = {}
    for row in rows:
        offsets.setdefault(row[TABLE], {})[(row[TOPIC], int(row[PARTITION]))] = int(row["last"]) + 1
    return offsets
