"""Errored tables: a table task's verdict to park, and the one commit that parks every
parked table's records of a batch in the dead-letter table (:mod:`apply.lake.dead_letter`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from apply.batch.context import ApplyContext
from apply.control.progress import ParkedTable
from apply.errors import TableError
from apply.lake.dead_letter import ParkRequest, park
from apply.lake.decode import TopicSurvey
from apply.lake.delta_schema import ValueSchema, parse_value_schema
from apply.lake.positions import AppliedState
from apply.lake.tables import table_of_topic

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Park:
    """A table task's verdict: park the table's records of the batch."""

    survey: TopicSurvey
    error: str
    error_kind: str
    newly_errored: bool
    state: AppliedState | None
    schemas: tuple[ValueSchema, ...]


def parsable_schemas(topic_survey: TopicSurvey, context: ApplyContext) -> tuple[ValueSchema, ...]:
    """The writer schemas of the topic's records that parse, for the parked positions."""
    table = table_of_topic(topic_survey.topic)
    schemas = []
    for fingerprint in sorted(topic_survey.fingerprints):
        schema_json = context.writer_schemas.get(fingerprint)
        if schema_json is None:
            continue  # a missing schema: its records are parked without a position
        try:
            schemas.append(parse_value_schema(table, fingerprint, schema_json))
        except TableError:
            continue  # its records are parked without a position
    return tuple(schemas)


def park_tables(
    spark: SparkSession,
    batch: DataFrame,
    batch_id: int,
    context: ApplyContext,
    to_park: list[Park],
) -> tuple[ParkedTable, ...]:
    requests = [
        ParkRequest(
            table=str(table_of_topic(p.survey.topic)),
            topic=p.survey.topic,
            error=p.error,
            error_kind=p.error_kind,
            schemas=p.schemas,
        )
        for p in to_park
    ]
    written = park(spark, context.dead_letter, batch, batch_id, requests)
    parked = []
    for request, p in zip(requests, to_park, strict=True):
        result = ParkedTable(
            table=request.table,
            topic=request.topic,
            batch_id=batch_id,
            error=p.error,
            error_kind=p.error_kind,
            newly_errored=p.newly_errored,
            records=p.survey.records,
            parked=written[request.table],
            next_offsets={
                (request.topic, partition): seen.next_offset
                for partition, seen in p.survey.partitions.items()
            },
            state=p.state,
        )
        log.warning(
            "batch %d to %s: parked %d of %d records in %s (table errored since %s: %s)",
            batch_id,
            result.table,
            result.parked,
            result.records,
            context.dead_letter,
            "this batch" if result.newly_errored else "an earlier batch",
            result.error_kind,
        )
        parked.append(result)
    return tuple(parked)
