"""Stage 3, write: one Delta commit per table, with its applied state in the commit.

- :func:`merge_batch`: the latest change per key MERGEd into the table (or the table
  replaced);
- :func:`merge_from_driver`: the MERGE of a small batch collected to the driver,
  decoded there and written with delta-rs, no Spark job (:mod:`apply.lake.driver_merge`);
- :func:`after_commit`: what the job keeps of the commit for the next batch
  (:mod:`apply.lake.known_tables`) and the upkeep it made due (:mod:`apply.lake.upkeep`).

Delta's ``txnAppId``/``txnVersion`` make a repeated write a no-op; the state is then read
back from the commit that holds it (:func:`replayed_state`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from apply.batch.context import ApplyContext
from apply.batch.plan import check_decoded, format_position, measure_batch, partition_batches
from apply.batch.read import batch_ids_restarted
from apply.batch.superseded import TablePlan
from apply.control.progress import TableResult
from apply.engine.spark_session import table_property_defaults
from apply.errors import SchemaChangeError, TransientError
from apply.lake.decode import TopicSurvey
from apply.lake.delta_log import sync_commits
from apply.lake.delta_schema import (
    ColumnPlan,
    ExistingTable,
    ValueSchema,
    ensure_table,
    plan_columns,
    prepare_replacement,
)
from apply.lake.driver_merge import DriverMergeUnavailableError, merge_rows, source_rows
from apply.lake.driver_plan import (
    CollectedRecord,
    DecodedChange,
    DriverWriteUnavailableError,
    decode_records,
    latest_changes,
    measure_changes,
)
from apply.lake.history import TableHistory, newest_version, read_history, recover_state
from apply.lake.known_tables import KnownTable
from apply.lake.positions import AppliedState, advance, encode_state
from apply.lake.spark_merge import (
    BatchMeasure,
    MergeOutcome,
    empty_source,
    merge_into,
    merge_source,
    own_outcome,
    replace_table,
)
from apply.lake.tables import table_of_topic, table_path

log = logging.getLogger(__name__)


def _metric(metrics: Mapping[str, str], name: str) -> int:
    return int(metrics.get(name, "0"))


def replayed_state(spark: SparkSession, path: str, table: str, batch_id: int) -> AppliedState:
    """The state recorded in the table at ``path`` when Delta skipped
    the batch's write: this ``txnAppId`` committed this batch id, or a later one,
    before. Only the first is a replay; the second means batch ids restarted."""
    recorded = recover_state(spark, path, table)
    if recorded is None or recorded.batch_id != batch_id:
        raise batch_ids_restarted(table, batch_id, recorded)
    return recorded


def after_commit(
    spark: SparkSession,
    context: ApplyContext,
    result: TableResult,
    *,
    path: str,
    existing: ExistingTable | None,
    version_before: int,
) -> None:
    """After a table's batch wrote the Delta table at ``path``:
    keep what it committed for the next batch (:mod:`apply.lake.known_tables`), when
    ``existing`` names the columns it wrote to (None: the batch created or changed
    them, nothing is kept), and run the upkeep the commit made due (:mod:`apply.lake.upkeep`).

    On a local lake the batch's commits are flushed to disk first
    (:func:`apply.lake.delta_log.sync_commits`): the job publishes the state they hold as
    applied once the batch returns, and capture then lets the slot go past it."""
    if result.committed:
        sync_commits(path, version_before + 1, result.version)
    if context.known is not None:
        if result.committed and existing is not None:
            context.known.remember(
                path, KnownTable(TableHistory(result.version, result.state), existing)
            )
        else:
            context.known.forget(path)
    if result.committed and context.upkeep is not None:
        context.upkeep.after_commit(
            spark,
            table=result.table,
            path=path,
            version_before=version_before,
            version_after=result.version,
        )


def merge_batch(
    spark: SparkSession,
    *,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    history: TableHistory | None,
    existing: ExistingTable | None,
    plan: TablePlan,
    decoded: DataFrame | None,
) -> TableResult:
    """A table's batch once its records are decoded: measure, then MERGE into the table
    (or replace it). ``decoded`` is cached, so the measure and the MERGE decode every
    record once."""
    topic = topic_survey.topic
    table = table_of_topic(topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    previous = history.state if history is not None else None
    measured = measure_batch(decoded, previous, topic_survey, name)
    truncate = measured.truncate
    state = advance(
        previous,
        name,
        batch_id,
        partition_batches(topic_survey, measured),
        truncate,
        txn_app_id=context.txn_app_id,
    )

    columns = plan.columns
    if plan.replace:
        assert existing is not None  # plan_table replaces an existing table only
        prepare_replacement(spark, path, columns, existing)
        version_before = newest_version(spark, path)
    else:
        ensure_table(
            spark, path, table, columns, existing, deletion_vectors=context.deletion_vectors
        )
        if history is None or columns.added:
            refreshed = read_history(spark, path, name)
            assert refreshed is not None  # ensure_table just wrote the table
            version_before = refreshed.version
        else:
            version_before = history.version
    source = (
        merge_source(
            decoded,
            previous=previous,
            topic=topic,
            plan=columns,
            erased_before=state.truncated_at,
            unchanged_columns=measured.unchanged_columns,
        )
        if decoded is not None
        else empty_source(spark, columns)
    )
    if plan.replace:
        log.warning(
            "batch %d to %s: the lake table cannot take the new schema; the TRUNCATE at %s "
            "erases every row it holds, so it is replaced by the rows from there on",
            batch_id,
            name,
            format_position(truncate),
        )
        outcome = replace_table(
            spark,
            path=path,
            table=name,
            source=source,
            plan=columns,
            version_before=version_before,
            app_id=context.txn_app_id,
            batch_id=batch_id,
            metadata=encode_state(state),
        )
    else:
        outcome = merge_into(
            spark,
            path=path,
            table=name,
            source=source,
            plan=columns,
            truncate=truncate,
            version_before=version_before,
            app_id=context.txn_app_id,
            batch_id=batch_id,
            metadata=encode_state(state),
        )
    if not outcome.committed:
        state = replayed_state(spark, path, name, batch_id)

    metrics = outcome.metrics
    return merged_result(
        topic_survey,
        batch_id=batch_id,
        path=path,
        outcome=outcome,
        measured=measured,
        rows=MergedRows(
            source=_metric(metrics, "numSourceRows"),
            inserted=_metric(metrics, "numOutputRows" if plan.replace else "numTargetRowsInserted"),
            updated=_metric(metrics, "numTargetRowsUpdated"),
            deleted=_metric(metrics, "numTargetRowsDeleted"),
            truncated=_metric(metrics, "numTargetRowsNotMatchedBySourceDeleted"),
        ),
        table_created=columns.create and not plan.replace,
        columns_added=tuple(column.name for column in columns.added),
        state=state,
        writer="",
    )


@dataclass(frozen=True, slots=True)
class MergedRows:
    """What a MERGE did to the table's rows, from either writer's metrics."""

    source: int
    inserted: int
    updated: int
    deleted: int
    truncated: int = 0


def merged_result(
    topic_survey: TopicSurvey,
    *,
    batch_id: int,
    path: str,
    outcome: MergeOutcome,
    measured: BatchMeasure,
    rows: MergedRows,
    table_created: bool,
    columns_added: tuple[str, ...],
    state: AppliedState,
    writer: str,
) -> TableResult:
    """What a batch MERGEd into its table reports, from either writer; ``writer`` names
    the driver's in the log line (empty for Spark's)."""
    topic = topic_survey.topic
    replays = sum(m.replays for m in measured.partitions.values())
    truncates = sum(m.truncates for m in measured.partitions.values())
    changes = topic_survey.records - topic_survey.tombstones - replays - truncates
    result = TableResult(
        table=state.table,
        topic=topic,
        path=path,
        batch_id=batch_id,
        committed=outcome.committed,
        version=outcome.version,
        records=topic_survey.records,
        tombstones=topic_survey.tombstones,
        replays=replays,
        superseded=changes - rows.source if outcome.committed else 0,
        truncates=truncates,
        source_rows=rows.source,
        rows_inserted=rows.inserted,
        rows_updated=rows.updated,
        rows_deleted=rows.deleted,
        rows_truncated=rows.truncated,
        table_created=table_created,
        columns_added=columns_added,
        partitions=tuple(sorted((topic, partition) for partition in topic_survey.partitions)),
        state=state,
    )
    log.info(
        "batch %d to %s%s: version %d %s, %d records, %d replays, "
        "rows inserted %d, updated %d, deleted %d",
        batch_id,
        state.table,
        writer,
        result.version,
        "committed" if result.committed else "skipped as already committed",
        result.records,
        result.replays,
        result.rows_inserted,
        result.rows_updated,
        result.rows_deleted,
    )
    return result


@dataclass(frozen=True, slots=True)
class DriverPlan:
    """A table's part of a batch the driver holds, planned for the driver's MERGE
    (:mod:`apply.lake.driver_plan`): its columns, the batch's measure, and the latest change
    per key after the replay filter and the newest applied TRUNCATE."""

    columns: ColumnPlan
    measured: BatchMeasure
    changes: Sequence[DecodedChange]


def plan_in_driver(
    *,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    previous: AppliedState | None,
    existing: ExistingTable | None,
    schemas: Sequence[ValueSchema],
    records: Sequence[CollectedRecord],
    creates: bool = False,
) -> DriverPlan | None:
    """The plan the driver's MERGE writes (:func:`merge_from_driver`); None for a
    batch the driver does not take, which
    Spark then writes: more than one writer schema, a lake the driver does not write
    (:mod:`apply.lake.driver_store`), a
    replayed batch id (Spark's transaction check decides), new or retyped columns, a
    TRUNCATE, or nothing but replays and tombstones (Spark commits the state alone). An
    unchanged TOAST value is resolved as Spark's MERGE resolves it (the key's newest
    change in the batch that carried the value, else the table's own). ``creates``: a
    table that does not exist yet (``existing`` None) is planned too, for the writer
    that creates it."""
    topic = topic_survey.topic
    table = table_of_topic(topic)
    if len(schemas) != 1 or context.driver_tables is None:
        return None
    if previous is not None and context.wrote(previous) and batch_id <= previous.batch_id:
        return None
    try:
        plan = plan_columns(table, existing, schemas)
    except SchemaChangeError:
        return None  # a TRUNCATE in the batch may still let the table take it
    if (plan.create and not creates) or plan.added:
        return None
    decoded = decode_records(records, schemas[0], plan.columns)
    measured = measure_changes(decoded, previous, topic)
    check_decoded(measured, topic_survey, str(table))
    if measured.truncate is not None:
        return None
    changes = latest_changes(
        decoded,
        previous,
        topic,
        key_indexes=[
            index for index, column in enumerate(plan.columns) if column.name in plan.key_columns
        ],
        erased_before=None if previous is None else previous.truncated_at,
        columns=[column.name for column in plan.columns],
        unchanged_columns=measured.unchanged_columns,
    )
    if not changes:
        return None
    return DriverPlan(columns=plan, measured=measured, changes=changes)


@dataclass(frozen=True, slots=True)
class DriverMerged:
    """A batch the driver MERGEd (:func:`merge_from_driver`), and the table it wrote."""

    result: TableResult
    existing: ExistingTable
    version_before: int
    """The table's version before the batch; -1 when the batch created it."""


def merge_from_driver(
    spark: SparkSession,
    *,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    history: TableHistory | None,
    existing: ExistingTable | None,
    schemas: Sequence[ValueSchema],
    records: Sequence[CollectedRecord],
) -> DriverMerged | None:
    """:func:`merge_batch` for a small batch collected to the driver, MERGEd by delta-rs
    with no Spark job (:mod:`apply.lake.driver_merge`); None when the batch or the table is
    one that path does not take (its module docstring), and then nothing is written.
    ``history`` and ``existing`` None: the table does not exist yet, and the driver
    creates it first (one commit, as Spark's creation is), unless the tables the job
    creates have deletion vectors. The caller holds the table's lock."""
    table = table_of_topic(topic_survey.topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    previous = None if history is None else history.state
    if context.driver_tables is None or (history is None and context.deletion_vectors):
        return None
    planned = plan_in_driver(
        batch_id=batch_id,
        topic_survey=topic_survey,
        context=context,
        previous=previous,
        existing=existing,
        schemas=schemas,
        records=records,
        creates=history is None,
    )
    if planned is None:
        return None
    plan, measured, changes = planned.columns, planned.measured, planned.changes
    state = advance(
        previous,
        name,
        batch_id,
        partition_batches(topic_survey, measured),
        None,
        txn_app_id=context.txn_app_id,
    )
    try:
        if history is None:
            existing = context.driver_tables.create(
                path, table, plan, defaults=table_property_defaults(spark)
            )
            delta_table, version_before = context.driver_tables.at(path, 0), 0
        else:
            delta_table = context.driver_tables.at(path, history.version)
            version_before = history.version
        assert existing is not None  # read by the caller, or created just now
        metrics = merge_rows(
            delta_table,
            source_rows(changes, plan.columns),
            path=path,
            name=name,
            columns=plan.columns,
            key_columns=plan.key_columns,
            app_id=context.txn_app_id,
            batch_id=batch_id,
            metadata=encode_state(state),
            unchanged_columns=measured.unchanged_columns,
        )
    except (DriverMergeUnavailableError, DriverWriteUnavailableError) as exc:
        reported = isinstance(exc, DriverMergeUnavailableError) and exc.reported
        log.log(
            logging.DEBUG if reported else logging.WARNING,
            "batch %d to %s: merged by Spark instead: %s",
            batch_id,
            name,
            exc,
        )
        return None
    outcome = own_outcome(spark, path, version_before, context.txn_app_id, batch_id)
    if not outcome.committed:
        # delta-rs does not skip a transaction it committed before; plan_in_driver's replay
        # check keeps it from being asked to, so this is someone else's commit in between.
        context.driver_tables.forget(path)
        raise TransientError(
            f"table {name}: the driver's MERGE of batch {batch_id} is not in the table's "
            "log after it returned; retry the batch, and make sure one apply job owns each "
            "table"
        )
    result = merged_result(
        topic_survey,
        batch_id=batch_id,
        path=path,
        outcome=outcome,
        measured=measured,
        rows=MergedRows(
            source=len(changes),
            inserted=int(metrics.get("num_target_rows_inserted", 0)),
            updated=int(metrics.get("num_target_rows_updated", 0)),
            deleted=int(metrics.get("num_target_rows_deleted", 0)),
        ),
        table_created=history is None,
        columns_added=(),
        state=state,
        writer=" from the driver",
    )
    return DriverMerged(
        result=result,
        existing=existing,
        version_before=-1 if history is None else history.version,
    )
