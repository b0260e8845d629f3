"""One table's part of a micro-batch, reduced to the latest change per key and applied
with one MERGE: one atomic Delta commit holding the rows and the state that describes
them.

Terms: a record's **position** is ``(commit_lsn, ordinal)`` (docs/wire-contract.md,
ordering and duplicates); :mod:`apply.lake.positions` says what the applied state holds.

Steps, all on the JVM:

1. **Drop replays**: records at or below their partition's applied position
   (:func:`replay_flag`). The capture publishes them again after a restart.
2. **Drop changes a TRUNCATE erased**: row changes positioned before the newest TRUNCATE,
   whether it is in this batch or applied earlier.
3. **Latest change per key** (:func:`merge_source`): ``max_by`` over the position. An
   unchanged TOAST column of that change takes its value from the newest earlier change
   of the key in the batch that carried one (an INSERT then an UPDATE of the same row in
   one batch). A column no change of the batch carried stays listed as unchanged, and
   the MERGE keeps the target's value.
4. **One MERGE** (:func:`merge_into`), target ``t``, source ``s``:

   - matched, ``s`` is a DELETE and newer than ``t`` -> delete;
   - matched, ``s`` is an INSERT/UPDATE/READ and newer -> update every column, except
     that a column ``s`` lists as unchanged keeps ``t``'s value;
   - not matched, not a DELETE -> insert;
   - with a TRUNCATE in the batch: not matched by source and ``t`` positioned before
     the TRUNCATE -> delete. A row a later change of the batch touches is matched
     instead, and that change decides.

   "Newer" compares ``s``'s position with the row's metadata columns, so no replayed or
   late record can take a row back to an older state, even without the replay filter.

Idempotence: around the MERGE the session carries ``txnAppId`` (the streaming query's
identity, :func:`transaction_app_id`) and ``txnVersion`` (the batch id). Delta records
the pair in the commit and skips a later write with the same application id and a
version not above it: a micro-batch Spark replays after a crash between the Delta
commit and its checkpoint is not applied twice, and writes no second commit. The same
commit carries the new :class:`~apply.lake.positions.AppliedState` as ``userMetadata``. The
three settings are session-wide, so each table is merged in a Spark session of its own
(:mod:`apply.batch.table_pool`), and the settings are restored in ``finally`` even when the
MERGE fails.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import reduce

from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import (
    ArrayType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from apply.errors import SchemaChangeError, TransientError
from apply.lake.decode import COMMIT_LSN, COMMIT_TS, MALFORMED, OP, ORDINAL, ROW, UNCHANGED
from apply.lake.delta_log import DeltaLogFiles
from apply.lake.delta_schema import (
    COMMIT_LSN_COLUMN,
    COMMIT_TS_COLUMN,
    ORDINAL_COLUMN,
    ColumnPlan,
)
from apply.lake.positions import AppliedState, Position
from apply.lake.table_lock import TABLE_LOCKS
from schemas.lsn import Lsn
from schemas.operation import Operation

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

CONCURRENT_WRITES = (
    DeltaConcurrentModificationException,
    ConcurrentWriteException,
    MetadataChangedException,
    ProtocolChangedException,
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException,
    ConcurrentTransactionException,
)


def transaction_app_id(checkpoint_location: str) -> str:
    """Delta ``txnAppId`` for the streaming query checkpointed at ``checkpoint_location``.

    Batch ids restart at 0 with a new checkpoint, so the id must change with it: a new
    query under an old id would see every batch skipped. It is derived from the location
    text, which a restarted query reuses.
    """
    digest = hashlib.sha256(checkpoint_location.rstrip("/").encode("utf-8")).hexdigest()
    return f"pgdelta-apply-{digest[:24]}"


def _position() -> Column:
    return sf.struct(sf.col(COMMIT_LSN), sf.col(ORDINAL))


def _position_literal(position: Position) -> Column:
    return sf.struct(
        sf.lit(position.commit_lsn).cast(LongType()).alias(COMMIT_LSN),
        sf.lit(position.ordinal).cast(LongType()).alias(ORDINAL),
    )


def replay_flag(
    previous: AppliedState | None, topic: str, *, malformed: Column | None = None
) -> Column:
    """True for a decoded record at or below its partition's applied position
    (``malformed``: the flag of a record that did not decode, by default its column)."""
    entries = [
        (partition, progress.position)
        for (state_topic, partition), progress in (previous.partitions if previous else {}).items()
        if state_topic == topic and progress.position is not None
    ]
    if not entries:
        return sf.lit(False)
    applied = sf.try_element_at(
        sf.create_map(
            *[
                part
                for partition, position in sorted(entries)
                for part in (sf.lit(partition), _position_literal(position))
            ]
        ),
        sf.col("partition"),
    )
    bad = sf.col(MALFORMED) if malformed is None else malformed
    return sf.coalesce(~bad & (_position() <= applied), sf.lit(False))


@dataclass(frozen=True, slots=True)
class PartitionMeasure:
    """One partition's decodable records in the batch, as the MERGE sees them."""

    position: Position | None
    commit_ts: int | None
    replays: int
    truncates: int
    """TRUNCATE records that are not replays."""
    truncate: Position | None
    malformed: int
    first_malformed: int | None


@dataclass(frozen=True, slots=True)
class BatchMeasure:
    partitions: Mapping[int, PartitionMeasure]
    unchanged_columns: frozenset[str]
    """Avro names listed as unchanged by any record of the batch that is not a replay."""

    @property
    def truncate(self) -> Position | None:
        found = [m.truncate for m in self.partitions.values() if m.truncate is not None]
        return max(found) if found else None


def _position_of(value: Row | None) -> Position | None:
    if value is None:
        return None
    return Position(Lsn(int(value[COMMIT_LSN])), int(value[ORDINAL]))


def measure(decoded: DataFrame, previous: AppliedState | None, topic: str) -> BatchMeasure:
    """Per partition: newest position and its commit time, replays, truncates and
    malformed records; plus the unchanged column names. One Spark job."""
    ok = ~sf.col(MALFORMED)
    replay = replay_flag(previous, topic)
    fresh = ok & ~replay
    truncate = fresh & (sf.col(OP) == sf.lit(Operation.TRUNCATE.value))
    rows = (
        decoded.groupBy("partition")
        .agg(
            sf.max(sf.when(ok, _position())).alias("position"),
            sf.max_by(sf.unix_micros(sf.col(COMMIT_TS)), sf.when(ok, _position())).alias("ts"),
            sf.count_if(replay).alias("replays"),
            sf.count_if(truncate).alias("truncates"),
            sf.max(sf.when(truncate, _position())).alias("truncate"),
            sf.count_if(~ok).alias("malformed"),
            sf.min(sf.when(~ok, sf.col("offset"))).alias("first_malformed"),
            sf.array_distinct(sf.flatten(sf.collect_set(sf.when(fresh, sf.col(UNCHANGED))))).alias(
                "unchanged"
            ),
        )
        .collect()
    )
    unchanged: set[str] = set()
    partitions = {}
    for row in rows:
        unchanged.update(row["unchanged"] or ())
        partitions[int(row["partition"])] = PartitionMeasure(
            position=_position_of(row["position"]),
            commit_ts=row["ts"],
            replays=int(row["replays"]),
            truncates=int(row["truncates"]),
            truncate=_position_of(row["truncate"]),
            malformed=int(row["malformed"]),
            first_malformed=row["first_malformed"],
        )
    return BatchMeasure(partitions=partitions, unchanged_columns=frozenset(unchanged))


def source_schema(plan: ColumnPlan) -> StructType:
    """The MERGE source's schema: envelope fields, then the row as one struct, so no
    source column can clash with a table column."""
    return StructType(
        [
            StructField(OP, StringType()),
            StructField(COMMIT_LSN, LongType()),
            StructField(ORDINAL, LongType()),
            StructField(COMMIT_TS, TimestampType()),
            StructField(UNCHANGED, ArrayType(StringType(), containsNull=True)),
            StructField(
                ROW,
                StructType([StructField(c.name, c.data_type) for c in plan.columns]),
            ),
        ]
    )


@dataclass(frozen=True, slots=True)
class MergeSource:
    frame: DataFrame
    """Latest change per key, with the columns of :func:`source_schema`."""
    unchanged_columns: tuple[str, ...]
    """Columns the MERGE may have to keep from the target (unchanged TOAST)."""


def _after(position: Position, lsn: Column, ordinal: Column) -> Column:
    return (lsn > sf.lit(position.commit_lsn)) | (
        (lsn == sf.lit(position.commit_lsn)) & (ordinal > sf.lit(position.ordinal))
    )


def merge_source(
    decoded: DataFrame,
    *,
    previous: AppliedState | None,
    topic: str,
    plan: ColumnPlan,
    erased_before: Position | None,
    unchanged_columns: frozenset[str],
) -> MergeSource:
    """Steps 1 to 3 of the module docstring. ``erased_before`` is the newest TRUNCATE
    position, of this batch or applied before."""
    eligible = decoded.where(
        ~sf.col(MALFORMED)
        & (sf.col(OP) != sf.lit(Operation.TRUNCATE.value))
        & ~replay_flag(previous, topic)
    )
    if erased_before is not None:
        eligible = eligible.where(_after(erased_before, sf.col(COMMIT_LSN), sf.col(ORDINAL)))
    key_set = set(plan.key_columns)
    folded = tuple(
        c.name for c in plan.columns if c.name in unchanged_columns and c.name not in key_set
    )
    position = _position()
    upsert = sf.col(OP) != sf.lit(Operation.DELETE.value)
    latest = sf.max_by(sf.struct(OP, COMMIT_LSN, ORDINAL, COMMIT_TS, UNCHANGED, ROW), position)
    # Per folded column: its value in the newest change of the key that carried it.
    carried = [
        sf.max_by(
            sf.struct(sf.col(ROW)[name].alias("v")),
            sf.when(upsert & ~sf.array_contains(sf.col(UNCHANGED), sf.lit(name)), position),
        ).alias(f"_carried_{index}")
        for index, name in enumerate(folded)
    ]
    grouped = eligible.groupBy(
        *[sf.col(ROW)[name].alias(f"_key_{index}") for index, name in enumerate(plan.key_columns)]
    ).agg(latest.alias("_latest"), *carried)
    carried_by_name = {name: sf.col(f"_carried_{index}") for index, name in enumerate(folded)}
    row = sf.struct(
        *[
            (
                carried_by_name[c.name]["v"]
                if c.name in carried_by_name
                else sf.col("_latest")[ROW][c.name]
            ).alias(c.name)
            for c in plan.columns
        ]
    )
    still_unchanged = (
        sf.array_compact(
            sf.array(
                *[
                    sf.when(
                        value.isNull()
                        & sf.array_contains(sf.col("_latest")[UNCHANGED], sf.lit(name)),
                        sf.lit(name),
                    )
                    for name, value in carried_by_name.items()
                ]
            )
        )
        if folded
        else sf.array().cast(ArrayType(StringType()))
    )
    frame = grouped.select(
        sf.col("_latest")[OP].alias(OP),
        sf.col("_latest")[COMMIT_LSN].alias(COMMIT_LSN),
        sf.col("_latest")[ORDINAL].alias(ORDINAL),
        sf.col("_latest")[COMMIT_TS].alias(COMMIT_TS),
        still_unchanged.alias(UNCHANGED),
        row.alias(ROW),
    )
    return MergeSource(frame=frame, unchanged_columns=folded)


def empty_source(spark: SparkSession, plan: ColumnPlan) -> MergeSource:
    """A source with no rows: the MERGE then commits only the new state (offsets of a
    batch that held nothing but replays or tombstones)."""
    return MergeSource(spark.createDataFrame([], source_schema(plan)), ())


@contextmanager
def commit_settings(
    spark: SparkSession, app_id: str, batch_id: int, metadata: str
) -> Iterator[None]:
    """Session settings for one idempotent commit carrying ``metadata``; the previous
    values come back afterwards, whatever happens."""
    settings = {
        TXN_APP_ID_CONF: app_id,
        TXN_VERSION_CONF: str(batch_id),
        USER_METADATA_CONF: metadata,
    }
    saved: dict[str, str | None] = {key: spark.conf.get(key, None) for key in settings}
    try:
        for key, value in settings.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, before in saved.items():
            if before is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, before)


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    committed: bool
    """False: Delta skipped the write, this batch id was committed before."""
    version: int
    metrics: Mapping[str, str]


def _target_before(position: Position) -> Column:
    """The target row was last changed before ``position``."""
    lsn, ordinal = sf.col(f"t.{COMMIT_LSN_COLUMN}"), sf.col(f"t.{ORDINAL_COLUMN}")
    return (lsn < sf.lit(position.commit_lsn)) | (
        (lsn == sf.lit(position.commit_lsn)) & (ordinal < sf.lit(position.ordinal))
    )


def merge_into(
    spark: SparkSession,
    *,
    path: str,
    table: str,
    source: MergeSource,
    plan: ColumnPlan,
    truncate: Position | None,
    version_before: int,
    app_id: str,
    batch_id: int,
    metadata: str,
) -> MergeOutcome:
    """Step 4 of the module docstring: one MERGE, one commit (or none for a batch id
    committed before). ``truncate`` is the newest TRUNCATE of this batch. The caller
    holds the table's lock (:mod:`apply.lake.table_lock`)."""
    TABLE_LOCKS.require(path, f"the MERGE of batch {batch_id}")
    s_lsn, s_ordinal = sf.col(f"s.{COMMIT_LSN}"), sf.col(f"s.{ORDINAL}")
    t_lsn, t_ordinal = sf.col(f"t.{COMMIT_LSN_COLUMN}"), sf.col(f"t.{ORDINAL_COLUMN}")
    newer = (s_lsn > t_lsn) | ((s_lsn == t_lsn) & (s_ordinal > t_ordinal))
    is_delete = sf.col(f"s.{OP}") == sf.lit(Operation.DELETE.value)
    matches = reduce(
        Column.__and__,
        [sf.col(f"t.{name}").eqNullSafe(sf.col(f"s.{ROW}.{name}")) for name in plan.key_columns],
    )
    metadata_values = {
        COMMIT_LSN_COLUMN: s_lsn,
        ORDINAL_COLUMN: s_ordinal,
        COMMIT_TS_COLUMN: sf.col(f"s.{COMMIT_TS}"),
    }
    inserted: dict[str, Column | str] = {c.name: sf.col(f"s.{ROW}.{c.name}") for c in plan.columns}
    inserted.update(metadata_values)
    updated = dict(inserted)
    # A row older than this batch's TRUNCATE was erased: it has no value to keep.
    erased = _target_before(truncate) if truncate is not None else None
    for name in source.unchanged_columns:
        keep = sf.array_contains(sf.col(f"s.{UNCHANGED}"), sf.lit(name))
        if erased is not None:
            keep = keep & ~erased
        updated[name] = sf.when(keep, sf.col(f"t.{name}")).otherwise(sf.col(f"s.{ROW}.{name}"))
    builder = (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.frame.alias("s"), matches)
        .whenMatchedDelete(condition=is_delete & newer)
        .whenMatchedUpdate(condition=~is_delete & newer, set=updated)
        .whenNotMatchedInsert(condition=~is_delete, values=inserted)
    )
    if truncate is not None:
        builder = builder.whenNotMatchedBySourceDelete(condition=_target_before(truncate))
    try:
        with commit_settings(spark, app_id, batch_id, metadata):
            builder.execute()
    except CONCURRENT_WRITES as exc:
        raise TransientError(
            f"table {table}: another writer committed to {path} during the MERGE; retry the "
            "batch, and make sure one apply job owns each table"
        ) from exc
    except AnalysisException as exc:
        raise SchemaChangeError(
            table,
            f"the MERGE does not fit the Delta table at {path} ({exc.getCondition()}): was the "
            "table altered outside apply? Restore its schema, or resync the table: python -m "
            f"capture resync {table}, then restart capture",
        ) from exc
    return own_outcome(spark, path, version_before, app_id, batch_id)


def own_outcome(
    spark: SparkSession, path: str, version_before: int, app_id: str, batch_id: int
) -> MergeOutcome:
    """What the write after ``version_before`` did, from the commit files
    (:mod:`apply.lake.delta_log`, no Spark job): committed when a newer commit carries this
    query's transaction id for the batch, else skipped as a duplicate. Identified by the
    transaction id rather than by being the newest, so a commit someone else made right
    after it is never taken for apply's."""
    commit, newest = DeltaLogFiles(spark).own_commit(path, version_before, app_id, batch_id)
    if commit is None:
        return MergeOutcome(committed=False, version=newest, metrics={})
    return MergeOutcome(committed=True, version=commit.version, metrics=commit.metrics)


def replace_table(
    spark: SparkSession,
    *,
    path: str,
    table: str,
    source: MergeSource,
    plan: ColumnPlan,
    version_before: int,
    app_id: str,
    batch_id: int,
    metadata: str,
) -> MergeOutcome:
    """Replace the table's schema and rows by the rows of ``source`` (its latest change
    per key from the batch's TRUNCATE on; deletes leave no row) in one commit, with the
    same transaction id and metadata as a MERGE: an overwrite with ``overwriteSchema``.
    Only for a batch whose TRUNCATE erases every row the table holds from before it
    (:mod:`apply.batch.superseded`); table properties are kept. The caller holds the table's
    lock (:mod:`apply.lake.table_lock`)."""
    TABLE_LOCKS.require(path, f"the replacement of batch {batch_id}")
    row = sf.col(ROW)
    rows = source.frame.where(sf.col(OP) != sf.lit(Operation.DELETE.value)).select(
        *[row[c.name].cast(c.data_type).alias(c.name) for c in plan.columns],
        sf.col(COMMIT_LSN).alias(COMMIT_LSN_COLUMN),
        sf.col(ORDINAL).alias(ORDINAL_COLUMN),
        sf.col(COMMIT_TS).alias(COMMIT_TS_COLUMN),
    )
    # Writer options, not session settings: a DataFrame write commits under the session
    # of its DataFrame, which is the batch's, not the table's (apply.batch.table_pool).
    try:
        (
            rows.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .option("txnAppId", app_id)
            .option("txnVersion", str(batch_id))
            .option("userMetadata", metadata)
            .save(path)
        )
    except CONCURRENT_WRITES as exc:
        raise TransientError(
            f"table {table}: another writer committed to {path} during its replacement; "
            "retry the batch, and make sure one apply job owns each table"
        ) from exc
    return own_outcome(spark, path, version_before, app_id, batch_id)
