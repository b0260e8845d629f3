"""Stage 2, plan: the table's columns for the batch, and what its decoded records hold.

- :func:`plan_batch`: create the table on first sight, add new columns, or replace it when
  a TRUNCATE in the batch lets it take a schema it cannot evolve to
  (:mod:`apply.lake.delta_schema`, :mod:`apply.batch.superseded`);
- :func:`measure_batch`: per partition, the newest position, replays, truncates and
  unchanged TOAST columns of the decoded records (:func:`apply.lake.spark_merge.measure`), and a
  record that does not decode raises (:func:`check_decoded`);
- :func:`partition_batches`: what each partition advances the applied state by
  (:mod:`apply.lake.positions`).
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame

from apply.batch.superseded import TablePlan, measure_supersession, plan_table
from apply.errors import BadRecordError, SchemaChangeError
from apply.lake.decode import TopicSurvey
from apply.lake.delta_schema import ExistingTable, ValueSchema, plan_columns
from apply.lake.positions import AppliedState, PartitionBatch, Position, TopicPartition
from apply.lake.spark_merge import BatchMeasure, measure
from apply.lake.tables import TableId
from schemas.lsn import format_lsn
from schemas.single_object import format_fingerprint

log = logging.getLogger(__name__)


def format_position(position: Position | None) -> str:
    """A position as logs show it: ``<commit LSN>#<ordinal>``."""
    return "-" if position is None else f"{format_lsn(position.commit_lsn)}#{position.ordinal}"


def plan_batch(
    batch: DataFrame,
    topic: str,
    *,
    table: TableId,
    existing: ExistingTable | None,
    schemas: list[ValueSchema],
    previous: AppliedState | None,
) -> TablePlan:
    """The table's columns for the batch. Records a TRUNCATE superseded are left out of
    planning (:mod:`apply.batch.superseded`); finding them costs a Spark job, so only when the
    plain plan fails or the batch holds more than one writer schema."""
    try:
        columns = plan_columns(table, existing, schemas)
    except SchemaChangeError:
        if not schemas:
            raise
    else:
        if len(schemas) <= 1:
            return TablePlan(columns, frozenset(), replace=False)
    supersession = measure_supersession(batch, topic, schemas, previous)
    plan = plan_table(table, existing, schemas, supersession, previous)
    if plan.superseded:
        log.info(
            "%s: writer schemas %s are superseded by the TRUNCATE at %s",
            table,
            ", ".join(sorted(format_fingerprint(f) for f in plan.superseded)),
            format_position(supersession.erased_before(previous)),
        )
    return plan


def measure_batch(
    decoded: DataFrame | None, previous: AppliedState | None, topic_survey: TopicSurvey, table: str
) -> BatchMeasure:
    """:func:`apply.lake.spark_merge.measure`, and a record that does not decode raises."""
    measured = (
        measure(decoded, previous, topic_survey.topic)
        if decoded is not None
        else BatchMeasure(partitions={}, unchanged_columns=frozenset())
    )
    check_decoded(measured, topic_survey, table)
    return measured


def check_decoded(measured: BatchMeasure, topic_survey: TopicSurvey, table: str) -> None:
    """Raise for the first record, in partition order, that did not decode."""
    for partition, seen_decoded in sorted(measured.partitions.items()):
        if seen_decoded.first_malformed is not None:
            raise BadRecordError(
                table,
                topic_survey.topic,
                partition,
                seen_decoded.first_malformed,
                "does not decode with the writer schema its header names",
            )


def partition_batches(
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
