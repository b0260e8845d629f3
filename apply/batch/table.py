"""One table's part of a micro-batch, through the stages in order: read (:mod:`.read`),
plan (:mod:`.plan`), write (:mod:`.write`); and the release of an errored table whose
parked records a TRUNCATE supersedes."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession

from apply.batch.context import ApplyContext
from apply.batch.plan import format_position, plan_batch
from apply.batch.read import check_framing, covered_result, lake_state, missing_schemas
from apply.batch.superseded import measure_supersession
from apply.batch.write import after_commit, merge_batch, merge_from_driver
from apply.control.progress import TableResult
from apply.errors import TableError
from apply.lake.dead_letter import ErroredTable, release_superseded
from apply.lake.decode import TopicSurvey, decode_topic, persisted
from apply.lake.delta_schema import (
    ExistingTable,
    ValueSchema,
    parse_value_schema,
    read_existing_table,
)
from apply.lake.driver_merge import DriverMergeUnavailableError
from apply.lake.driver_plan import CollectedRecord
from apply.lake.history import TableHistory, read_history
from apply.lake.table_lock import TABLE_LOCKS
from apply.lake.tables import table_of_topic, table_path

log = logging.getLogger(__name__)


def apply_table(
    spark: SparkSession,
    batch: DataFrame,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    *,
    collected: Sequence[CollectedRecord] | None = None,
) -> TableResult | None:
    """Apply one topic's records of the batch to its Delta table (module docstring).
    ``collected``: the topic's records, when the batch was small enough to be collected
    to the driver (:mod:`apply.batch.micro_batch`): a table the job knows is then
    written from there when it can be (:func:`apply.batch.write.merge_from_driver`),
    else by Spark.

    Returns None only for a batch holding nothing but tombstones of a table that has no
    Delta table yet: there is nothing to record them in.
    """
    topic = topic_survey.topic
    table = table_of_topic(topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    check_framing(topic_survey, name)
    schemas = [
        parse_value_schema(table, fingerprint, context.writer_schemas[fingerprint])
        for fingerprint in sorted(topic_survey.fingerprints)
    ]
    # One writer per table (apply.lake.table_lock): held across the whole write, the DDL
    # before the MERGE and the upkeep after it included.
    with TABLE_LOCKS.held(path):
        return _apply_table_merged(
            spark,
            batch,
            batch_id,
            topic_survey,
            context,
            schemas=schemas,
            collected=collected,
        )


def _apply_table_merged(
    spark: SparkSession,
    batch: DataFrame,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    *,
    schemas: list[ValueSchema],
    collected: Sequence[CollectedRecord] | None,
) -> TableResult | None:
    """:func:`apply_table`'s write: the batch MERGEd into the table, from
    the driver when it can be, else by Spark; under the table's lock."""
    topic = topic_survey.topic
    table = table_of_topic(topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    known = context.known.current(spark, path) if context.known is not None else None
    # A batch held in the driver reads the table there too (no Spark job), when the job
    # does not know it: the first batch after a start, or after another commit.
    read_in_driver = False
    # Not when the job creates tables with deletion vectors: the driver writes none of
    # those, and opening one with delta-rs every batch would be wasted.
    driver_tables = None if context.deletion_vectors else context.driver_tables
    if known is None and collected is not None and driver_tables is not None:
        try:
            known = driver_tables.read(path, table)
            read_in_driver = True
        except DriverMergeUnavailableError as exc:
            log.debug("batch %d: table %s is read by Spark: %s", batch_id, name, exc)
    existing: ExistingTable | None = None
    if known is not None:
        history: TableHistory | None = known.history
        existing = known.existing
    elif read_in_driver:
        history = None  # no table yet: the driver creates it
    else:
        history = read_history(spark, path, name)
    if history is not None and history.state is not None:
        covered = covered_result(
            topic_survey, batch_id, history.version, history.state, path=path, context=context
        )
        if covered is not None:
            return covered
    if collected is not None and (known is not None or read_in_driver):
        driven = merge_from_driver(
            spark,
            batch_id=batch_id,
            topic_survey=topic_survey,
            context=context,
            history=history,
            existing=existing,
            schemas=schemas,
            records=collected,
        )
        if driven is not None:
            after_commit(
                spark,
                context,
                driven.result,
                path=path,
                existing=driven.existing,
                version_before=driven.version_before,
            )
            return driven.result
    if known is None and not read_in_driver:
        existing = read_existing_table(spark, path, table) if history is not None else None
    if existing is None and not schemas:
        log.warning("tombstones for a table not created yet, nothing to record: %s", name)
        return None
    previous = history.state if history is not None else None
    plan = plan_batch(
        batch, topic, table=table, existing=existing, schemas=schemas, previous=previous
    )

    decoded = (
        decode_topic(batch, topic, schemas, plan.columns.columns, plan.superseded)
        if schemas
        else None
    )
    with persisted(decoded):
        result = merge_batch(
            spark,
            batch_id=batch_id,
            topic_survey=topic_survey,
            context=context,
            history=history,
            existing=existing,
            plan=plan,
            decoded=decoded,
        )
    after_commit(
        spark,
        context,
        result,
        path=path,
        # Kept even when this batch created the table, gave it columns or replaced it
        # (its new shape read once): the table's next batch then knows it and can be
        # MERGEd from the driver (apply.lake.driver_merge).
        existing=(
            existing
            if existing is not None and not plan.replace and not plan.columns.added
            else read_existing_table(spark, path, table)
        )
        if result.committed
        else None,
        version_before=-1 if history is None else history.version,
    )
    return result


def released(
    spark: SparkSession,
    *,
    batch: DataFrame,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
    errored: ErroredTable,
) -> TableResult | None:
    """An errored table's batch applied, and its parked records released, when a TRUNCATE
    positioned after every parked record supersedes them all (a resync reached apply);
    None when the table stays parked.

    The TRUNCATE is this batch's, or one the lake table already holds: the latter when
    an earlier attempt committed the batch and died before the release."""
    table = errored.table
    newest = errored.newest
    if newest is None or errored.unpositioned or missing_schemas(topic_survey, context):
        return None  # a record without position could be after any TRUNCATE
    state = lake_state(spark, topic_survey, context)
    erased = None if state is None else state.truncated_at
    if erased is None or erased <= newest:
        try:
            schemas = [
                parse_value_schema(table_of_topic(topic_survey.topic), f, context.writer_schemas[f])
                for f in sorted(topic_survey.fingerprints)
            ]
        except TableError:
            return None
        if not schemas:
            return None
        erased = measure_supersession(batch, topic_survey.topic, schemas, state).truncate
        if erased is None or erased <= newest:
            return None
    try:
        result = apply_table(spark, batch, batch_id, topic_survey, context)
    except TableError as exc:
        log.error(  # noqa: TRY400 - the message says what to do; the trace adds nothing
            "batch %d: table %s stays errored, its batch after the TRUNCATE fails too: %s",
            batch_id,
            table,
            exc,
        )
        return None
    release_superseded(
        spark, context.dead_letter, table, erased, None if result is None else result.version
    )
    log.warning(
        "batch %d: table %s is released: the TRUNCATE at %s supersedes its %d parked records",
        batch_id,
        table,
        format_position(erased),
        errored.records,
    )
    return result
