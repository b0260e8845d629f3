"""The body of ``foreachBatch``: survey the batch once, run every table's part at the same
time (:mod:`apply.batch.table_pool`), park the errored ones in one commit, and return the
results the job publishes (:mod:`apply.control.progress`).

A batch small enough (``ApplyContext.driver_write_records``) is held in the driver
first, read from Kafka there over the ranges of the query's offset log
(:mod:`apply.batch.held_batch`) or else collected in one Spark job, and surveyed there
(:func:`apply.lake.decode.survey_held`), so that
each table's MERGE can run there with no Spark job of its own (:mod:`apply.lake.driver_plan`,
:mod:`apply.lake.driver_merge`). A bigger batch is surveyed by Spark."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from apply.batch.context import ApplyContext
from apply.batch.held_batch import HeldRecord, batch_ranges
from apply.batch.park import Park, park_tables, parsable_schemas
from apply.batch.read import lake_state, missing_schemas
from apply.batch.table import apply_table, released
from apply.batch.table_pool import SchedulerPools, run_per_table, table_session
from apply.control.progress import BatchResult, TableResult
from apply.errors import MissingSchemaError, TableError, UnknownSchemaError
from apply.lake.dead_letter import ErroredTable, errored_tables
from apply.lake.decode import RECORD_COLUMNS, TopicSurvey, persisted, survey, survey_held
from apply.lake.driver_plan import CollectedRecord
from apply.lake.tables import table_of_topic
from schemas.registry_framing import registry_id_of
from schemas.single_object import format_fingerprint

log = logging.getLogger(__name__)

_LIMIT_PARTITIONS = "spark.sql.limit.initialNumPartitions"
_ALL_PARTITIONS = 1_000_000


def _table_name(topic_survey: TopicSurvey) -> str:
    """The table a topic's records go to: the name of its scheduler pool too."""
    return str(table_of_topic(topic_survey.topic))


def _table_task(
    spark: SparkSession,
    *,
    batch: DataFrame,
    batch_id: int,
    context: ApplyContext,
    errored: Mapping[str, ErroredTable],
    topic_survey: TopicSurvey,
    collected: Sequence[CollectedRecord] | None,
) -> TableResult | Park | None:
    """One table's part of the batch, in a session of its own (:mod:`apply.batch.table_pool`)."""
    session = table_session(spark)
    table = str(table_of_topic(topic_survey.topic))
    before = errored.get(table)
    if before is not None:
        release = released(
            session,
            batch=batch,
            batch_id=batch_id,
            topic_survey=topic_survey,
            context=context,
            errored=before,
        )
        if release is not None:
            return release
        return Park(
            survey=topic_survey,
            error=before.error,
            error_kind=before.error_kind,
            newly_errored=False,
            state=lake_state(session, topic_survey, context),
            schemas=parsable_schemas(topic_survey, context),
        )
    try:
        missing = missing_schemas(topic_survey, context)
        if missing:
            registry_ids = [i for i in map(registry_id_of, missing) if i is not None]
            fingerprints = [format_fingerprint(f) for f in missing if registry_id_of(f) is None]
            raise MissingSchemaError(
                table, topic_survey.topic, context.schema_topic, fingerprints, registry_ids
            )
        return apply_table(session, batch, batch_id, topic_survey, context, collected=collected)
    except TableError as exc:
        log.error(  # noqa: TRY400 - the message says what to do; the trace adds nothing
            "batch %d: table %s is errored and parked: %s", batch_id, table, exc
        )
        return Park(
            survey=topic_survey,
            error=str(exc),
            error_kind=type(exc).__name__,
            newly_errored=True,
            state=lake_state(session, topic_survey, context),
            schemas=parsable_schemas(topic_survey, context),
        )


def _held(records: DataFrame, batch_id: int, context: ApplyContext) -> list[HeldRecord] | None:
    """The batch's records in the driver, when the driver writes the lake
    (``context.driver_tables``) and the batch holds at most
    ``context.driver_write_records`` records; else None. Read from Kafka by the
    driver when the query's offset log gives the batch's ranges (:mod:`apply.batch.held_batch`),
    else with one Spark job reading at most one record more than the bound."""
    if context.driver_tables is None or context.driver_write_records <= 0:
        return None
    reader, checkpoint = context.held_reader, context.checkpoint
    ranges = None if checkpoint is None else batch_ranges(checkpoint, batch_id)
    if reader is not None and ranges:
        return reader.read(ranges, context.driver_write_records)
    # A limit reads one partition first and then four times as many in each further job
    # until it has its rows: four jobs over a batch of 11 topics of 3 partitions. Asked to
    # read them all at once, it is one job, as a survey is.
    conf = records.sparkSession.conf
    before = conf.get(_LIMIT_PARTITIONS, None)
    conf.set(_LIMIT_PARTITIONS, str(_ALL_PARTITIONS))
    try:
        rows = records.limit(context.driver_write_records + 1).collect()
    finally:
        if before is None:
            conf.unset(_LIMIT_PARTITIONS)
        else:
            conf.set(_LIMIT_PARTITIONS, before)
    if len(rows) > context.driver_write_records:
        return None
    return [(r["topic"], int(r["partition"]), int(r["offset"]), r["value"]) for r in rows]


def _by_topic(held: Sequence[HeldRecord]) -> dict[str, list[CollectedRecord]]:
    """The held records' values by topic (tombstones are counted by the survey alone)."""
    found: dict[str, list[CollectedRecord]] = {}
    for topic, partition, offset, value in held:
        if value is not None:
            found.setdefault(topic, []).append(CollectedRecord(partition, offset, bytes(value)))
    return found


def apply_batch(
    batch: DataFrame,
    batch_id: int,
    context: ApplyContext,
    *,
    park_missing_schemas: bool = False,
) -> BatchResult:
    """Apply a micro-batch from the Kafka source: a result per table applied (tables
    holding only tombstones and no Delta table yet have none) and per table parked, each
    in topic order.

    A writer fingerprint ``context`` lacks raises :class:`UnknownSchemaError` before
    anything is written: the schema topic is probably read less far than the change
    topics. The caller reads it again and retries with ``park_missing_schemas``; then a
    table whose schemas are still missing is parked (:class:`MissingSchemaError`) and
    the others are applied."""
    spark = batch.sparkSession
    # Surveyed once, then read again per table. Only the columns decoding needs are
    # cached: keeping the headers too doubled the cost of the first read. Parking, the
    # rare path, reads the batch again, headers included.
    records = batch.select(*RECORD_COLUMNS)
    started = time.monotonic()
    with persisted(records):
        held = _held(records, batch_id, context)
        surveys = survey(records) if held is None else survey_held(held)
        if not park_missing_schemas:
            for topic in sorted(surveys):
                missing = missing_schemas(surveys[topic], context)
                if missing:
                    raise UnknownSchemaError(topic, [format_fingerprint(f) for f in missing])
        log.info(
            "batch %d: %d topics surveyed %s in %.2fs",
            batch_id,
            len(surveys),
            "by Spark" if held is None else f"in the driver ({len(held)} records)",
            time.monotonic() - started,
        )
        errored = errored_tables(spark, context.dead_letter)
        collected = None if held is None else _by_topic(held)
        topics = [surveys[topic] for topic in sorted(surveys)]
        futures = run_per_table(
            topics,
            lambda topic_survey: _table_task(
                spark,
                batch=records,
                batch_id=batch_id,
                context=context,
                errored=errored,
                topic_survey=topic_survey,
                collected=None if collected is None else collected.get(topic_survey.topic, []),
            ),
            context.parallelism,
            pools=SchedulerPools(spark.sparkContext, _table_name),
        )
        # Not a TableError: the batch fails as a whole, the first failure in topic order.
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        outcomes = [future.result() for future in futures]
        applied = tuple(o for o in outcomes if isinstance(o, TableResult))
        to_park = [o for o in outcomes if isinstance(o, Park)]
        return BatchResult(
            applied=applied, parked=park_tables(spark, batch, batch_id, context, to_park)
        )
