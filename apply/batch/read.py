"""Stage 1, read: what the lake holds for a table before the batch.

Which records a topic's batch holds is the survey's (:func:`apply.lake.decode.survey`); this
stage checks them against the contract (framing, writer schemas the job knows) and reads
the table's side: its applied state, and whether that state already covers the batch, in
which case nothing is planned or written (:func:`covered_result`).
"""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from apply.batch.context import ApplyContext
from apply.control.progress import TableResult
from apply.errors import BadRecordError, ConfigError, TableError
from apply.lake.decode import TopicSurvey
from apply.lake.driver_merge import DriverMergeUnavailableError
from apply.lake.history import recover_state
from apply.lake.positions import AppliedState, covers
from apply.lake.tables import TableId, table_of_topic, table_path
from schemas.single_object import Fingerprint

log = logging.getLogger(__name__)


def applied_state(spark: SparkSession, lake_root: str, table: TableId) -> AppliedState | None:
    """The applied state of ``table``, as its Delta table records it."""
    return recover_state(spark, table_path(lake_root, table), str(table))


def recorded_state(
    spark: SparkSession, table: TableId, context: ApplyContext
) -> AppliedState | None:
    """The applied state of ``table`` when the job starts. On a local lake whose tables
    the driver writes it is read by delta-rs, and remembered for the table's first batch
    (:mod:`apply.lake.known_tables`): a Spark read of every table's history is a job per
    table, and most of a restarted job's CPU before its first batch. Spark reads a table
    delta-rs cannot (deletion vectors, the change data feed, a lake the driver does not
    write: :mod:`apply.lake.driver_store`)."""
    path = table_path(context.lake_root, table)
    driver_tables, known_tables = context.driver_tables, context.known
    if driver_tables is not None and known_tables is not None and not context.deletion_vectors:
        try:
            known = driver_tables.read(path, table)
        except DriverMergeUnavailableError as exc:
            log.debug("table %s: its applied state is read by Spark: %s", table, exc)
        else:
            if known is None:
                return None
            known_tables.remember(path, known)
            return known.history.state
    return recover_state(spark, path, str(table))


def lake_state(
    spark: SparkSession, topic_survey: TopicSurvey, context: ApplyContext
) -> AppliedState | None:
    """The applied state of the topic's lake table, if it has a readable one."""
    table = table_of_topic(topic_survey.topic)
    try:
        return applied_state(spark, context.lake_root, table)
    except TableError:
        return None  # the history itself is what is broken; positions stay unknown


def missing_schemas(topic_survey: TopicSurvey, context: ApplyContext) -> list[Fingerprint]:
    """The writer keys (fingerprints, or registry ids as keys) of the topic's records
    that ``context`` lacks."""
    return sorted(
        fingerprint
        for fingerprint in topic_survey.fingerprints
        if fingerprint not in context.writer_schemas
    )


def check_framing(topic_survey: TopicSurvey, table: str) -> None:
    """Every record of the topic carries one of the contract's two framings; the first
    that does not makes the table errored (:class:`~apply.errors.BadRecordError`)."""
    for partition, seen in sorted(topic_survey.partitions.items()):
        if seen.first_without_header is not None:
            raise BadRecordError(
                table,
                topic_survey.topic,
                partition,
                seen.first_without_header,
                "has neither framing of the contract (no single-object c3 01 header, no "
                "Schema Registry 00 header)",
            )


def batch_ids_restarted(table: str, batch_id: int, recorded: AppliedState | None) -> ConfigError:
    return ConfigError(
        f"batch {batch_id} for table {table} is already written, but the table's newest "
        f"apply commit is from batch {None if recorded is None else recorded.batch_id}: the "
        "streaming checkpoint was reset while keeping its location, so batch ids restarted "
        "under the same txnAppId; use a new checkpoint location"
    )


def covered_result(
    topic_survey: TopicSurvey,
    batch_id: int,
    version: int,
    previous: AppliedState,
    *,
    path: str,
    context: ApplyContext,
) -> TableResult | None:
    """The result for a batch the table's state already covers, which commits nothing;
    None when the batch holds records the table has not seen. Batch ids compare only
    within one query: a lane that just took the table over counts from 0."""
    topic = topic_survey.topic
    next_offsets = {(topic, p): seen.next_offset for p, seen in topic_survey.partitions.items()}
    if not covers(previous, next_offsets):
        return None
    if context.wrote(previous) and batch_id < previous.batch_id:
        raise batch_ids_restarted(previous.table, batch_id, previous)
    result = TableResult(
        table=previous.table,
        topic=topic,
        path=path,
        batch_id=batch_id,
        committed=False,
        version=version,
        records=topic_survey.records,
        tombstones=topic_survey.tombstones,
        # Every record is below its partition's next offset: applied before.
        replays=topic_survey.records - topic_survey.tombstones,
        superseded=0,
        truncates=0,
        source_rows=0,
        rows_inserted=0,
        rows_updated=0,
        rows_deleted=0,
        rows_truncated=0,
        table_created=False,
        columns_added=(),
        partitions=tuple(sorted(next_offsets)),
        state=previous,
    )
    log.info(
        "batch %d to %s: all %d records applied before, nothing to commit (version %d)",
        batch_id,
        previous.table,
        result.records,
        version,
    )
    return result
