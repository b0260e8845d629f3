"""Apply one micro-batch of change records to the lake: the body of ``foreachBatch``.

For each change topic in the batch, in topic order (:func:`apply_table`):

1. read the Delta table's history: its newest version and the applied state
   (:mod:`apply.history`) -- nothing is kept in memory between batches, so a restarted
   job behaves exactly like a running one;
2. decode the topic's records with their writer schemas (:mod:`apply.decode`), and plan
   the table's columns: create the table on first sight, add new columns
   (:mod:`apply.delta_schema`);
3. measure the batch per partition and compute the new state (:mod:`apply.positions`);
4. drop replays, reduce to the latest change per key and MERGE, with the state in the
   same commit (:mod:`apply.merge`).

Guarantees:

- Every record of the batch ends up applied, superseded, or dropped as a replay or
  tombstone, and the state's next offsets cover exactly the batch: the control
  messages made from the results (:func:`apply.progress.applied_progress`) never claim
  a record that is not in the lake.
- A failure leaves each table either with the whole batch committed or untouched. Spark
  retries the batch under the same id; tables that committed it are skipped by their
  ``txnVersion``, the others apply it.
- All writer fingerprints are resolved before any table is touched: an unknown one
  raises :class:`~apply.errors.UnknownSchemaError` and nothing is written.
- A skipped MERGE must be a replay of the table's newest apply commit; anything else
  means batch ids restarted under the same ``txnAppId`` (a checkpoint reset in place),
  which would skip new data, so it raises :class:`~apply.errors.ConfigError`.
- A table with a definite problem raises a :class:`~apply.errors.TableError`; tables
  after it in topic order are not applied in that attempt. Isolating such a table
  (parking it, dead-lettering its records) is left to the streaming application.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from apply.decode import TopicSurvey, decode_topic, survey
from apply.delta_schema import ensure_table, parse_value_schema, plan_columns, read_existing_table
from apply.errors import BadRecordError, ConfigError, UnknownSchemaError
from apply.history import read_history, recover_state
from apply.merge import BatchMeasure, empty_source, measure, merge_into, merge_source
from apply.positions import PartitionBatch, TopicPartition, advance, encode_state
from apply.progress import TableResult
from apply.tables import table_of_topic, table_path
from schemas.single_object import Fingerprint, format_fingerprint

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ApplyContext:
    """What every batch needs besides its records."""

    lake_root: str
    """Delta tables live at ``<lake_root>/<schema>/<table>`` (:mod:`apply.tables`)."""
    txn_app_id: str
    """Delta ``txnAppId`` of the streaming query (:func:`apply.merge.transaction_app_id`)."""
    writer_schemas: Mapping[Fingerprint, str]
    """Writer schema JSON by fingerprint, as read from the schema topic. The mapping may
    grow between batches; it is read, never changed."""


def apply_batch(batch: DataFrame, batch_id: int, context: ApplyContext) -> list[TableResult]:
    """Apply a micro-batch from the Kafka source; one result per table written."""
    spark = batch.sparkSession
    # Surveyed once, then read again per table and per writer schema.
    batch.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        surveys = survey(batch)
        for topic in sorted(surveys):
            missing = sorted(
                format_fingerprint(fingerprint)
                for fingerprint in surveys[topic].fingerprints
                if fingerprint not in context.writer_schemas
            )
            if missing:
                raise UnknownSchemaError(topic, missing)
        results = []
        for topic in sorted(surveys):
            result = apply_table(spark, batch, batch_id, surveys[topic], context)
            if result is not None:
                results.append(result)
        return results
    finally:
        batch.unpersist()


def _metric(metrics: Mapping[str, str], name: str) -> int:
    return int(metrics.get(name, "0"))


def _partition_batches(
    topic_survey: TopicSurvey, measured: BatchMeasure
) -> dict[TopicPartition, PartitionBatch]:
    """What the batch held per partition: offsets from the survey (tombstones included),
    positions from the decoded records."""
    batches = {}
    for partition, seen in topic_survey.partitions.items():
        decoded = measured.partitions.get(partition)
        batches[(topic_survey.topic, partition)] = PartitionBatch(
            next_offset=seen.next_offset,
            position=None if decoded is None else decoded.position,
            commit_ts=None if decoded is None else decoded.commit_ts,
        )
    return batches


def apply_table(
    spark: SparkSession,
    batch: DataFrame,
    batch_id: int,
    topic_survey: TopicSurvey,
    context: ApplyContext,
) -> TableResult | None:
    """Apply one topic's records of the batch to its Delta table (module docstring).

    Returns None only for a batch holding nothing but tombstones of a table that has no
    Delta table yet: there is nothing to record them in.
    """
    topic = topic_survey.topic
    table = table_of_topic(topic)
    name = str(table)
    path = table_path(context.lake_root, table)
    for partition, seen in sorted(topic_survey.partitions.items()):
        if seen.first_without_header is not None:
            raise BadRecordError(
                name,
                topic,
                partition,
                seen.first_without_header,
                "is not an Avro single-object encoding (no c3 01 header)",
            )
    schemas = [
        parse_value_schema(table, fingerprint, context.writer_schemas[fingerprint])
        for fingerprint in sorted(topic_survey.fingerprints)
    ]
    history = read_history(spark, path, name)
    existing = read_existing_table(spark, path, table) if history is not None else None
    if existing is None and not schemas:
        log.warning("tombstones for a table not created yet, nothing to record: %s", name)
        return None
    previous = history.state if history is not None else None
    plan = plan_columns(table, existing, schemas)

    decoded = decode_topic(batch, topic, schemas, plan.columns) if schemas else None
    measured = (
        measure(decoded, previous, topic)
        if decoded is not None
        else BatchMeasure(partitions={}, unchanged_columns=frozenset())
    )
    for partition, seen_decoded in sorted(measured.partitions.items()):
        if seen_decoded.first_malformed is not None:
            raise BadRecordError(
                name,
                topic,
                partition,
                seen_decoded.first_malformed,
                "does not decode with the writer schema its header names",
            )
    truncate = measured.truncate
    state = advance(previous, name, batch_id, _partition_batches(topic_survey, measured), truncate)

    ensure_table(spark, path, table, plan, existing)
    if history is None or plan.added:
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
            plan=plan,
            erased_before=state.truncated_at,
            unchanged_columns=measured.unchanged_columns,
        )
        if decoded is not None
        else empty_source(spark, plan)
    )
    outcome = merge_into(
        spark,
        path=path,
        table=name,
        source=source,
        plan=plan,
        truncate=truncate,
        version_before=version_before,
        app_id=context.txn_app_id,
        batch_id=batch_id,
        metadata=encode_state(state),
    )
    if not outcome.committed:
        # Delta skipped the MERGE: this txnAppId committed this batch id, or a later
        # one, before. Only the first is a replay; report what that commit recorded.
        recorded = recover_state(spark, path, name)
        if recorded is None or recorded.batch_id != batch_id:
            raise ConfigError(
                f"Delta skipped batch {batch_id} for table {name} as already written, but the "
                f"table's newest apply commit is from batch "
                f"{None if recorded is None else recorded.batch_id}: the streaming checkpoint "
                "was reset while keeping its location, so batch ids restarted under the same "
                "txnAppId; use a new checkpoint location"
            )
        state = recorded

    metrics = outcome.metrics
    replays = sum(m.replays for m in measured.partitions.values())
    truncates = sum(m.truncates for m in measured.partitions.values())
    source_rows = _metric(metrics, "numSourceRows")
    changes = topic_survey.records - topic_survey.tombstones - replays - truncates
    result = TableResult(
        table=name,
        topic=topic,
        path=path,
        batch_id=batch_id,
        committed=outcome.committed,
        version=outcome.version,
        records=topic_survey.records,
        tombstones=topic_survey.tombstones,
        replays=replays,
        superseded=changes - source_rows if outcome.committed else 0,
        truncates=truncates,
        source_rows=source_rows,
        rows_inserted=_metric(metrics, "numTargetRowsInserted"),
        rows_updated=_metric(metrics, "numTargetRowsUpdated"),
        rows_deleted=_metric(metrics, "numTargetRowsDeleted"),
        rows_truncated=_metric(metrics, "numTargetRowsNotMatchedBySourceDeleted"),
        table_created=plan.create,
        columns_added=tuple(column.name for column in plan.added),
        partitions=tuple(sorted((topic, partition) for partition in topic_survey.partitions)),
        state=state,
    )
    log.info(
        "batch %d to %s: version %d %s, %d records, %d replays, "
        "rows inserted %d, updated %d, deleted %d",
        batch_id,
        name,
        result.version,
        "committed" if result.committed else "skipped as already committed",
        result.records,
        result.replays,
        result.rows_inserted,
        result.rows_updated,
        result.rows_deleted,
    )
    return result
