"""Re-apply an errored table's parked records, after the cause was fixed, and release it.

``python -m apply reapply <schema.table>`` (docs/apply.md, errored tables) runs
:func:`reapply_table`. Each pass:

1. reads the table's parked records that are still waiting (:mod:`apply.lake.dead_letter`),
   as the same columns Spark's Kafka source hands to a micro-batch;
2. applies them with :func:`apply.batch.apply_table`, the path of every micro-batch:
   replay filter, latest change per key by position, TRUNCATEs by position, one MERGE
   with the new state in the commit. So records parked over many batches land in
   position order, exactly as if they had arrived in one batch, and the table's state
   moves past their offsets;
3. releases them: marks them re-applied, in one commit of the dead-letter table.

A pass that fails the same way again (the cause is not fixed) raises the table's
:class:`~apply.errors.TableError`: nothing is released, the table stays errored.

Idempotent when interrupted and run again: a pass that dies after its MERGE finds the
table's state covering the records' offsets on the next run, so it commits nothing to
the lake table and only releases them; one that dies during the release finds them
waiting and does the same. The MERGE runs under its own Delta ``txnAppId`` (the
streaming query's with ``-reapply`` appended) and the highest micro-batch id among the
records as ``txnVersion``, so the streaming query's transaction ids on the table are
left alone.

The streaming job may keep running: while the table is errored it only parks records
and never writes the lake table, so the reapply is the table's only writer. Records
the job parks while a pass runs stay waiting (a release covers only the micro-batches
the pass read), and the next pass takes them; passes repeat until none is waiting. A
micro-batch that checked the table's state before the last release and parks after it
leaves the table errored again with only its own records: the command then reports
them as still waiting, and running it again applies them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from apply.batch import ApplyContext, apply_table
from apply.control.progress import TableResult
from apply.errors import UnknownSchemaError
from apply.lake.dead_letter import BATCH_ID, errored_tables, release, waiting_records
from apply.lake.decode import survey
from schemas.single_object import format_fingerprint

log = logging.getLogger(__name__)

REAPPLY_SUFFIX = "-reapply"
_MAX_PASSES = 5


def reapply_app_id(streaming_app_id: str) -> str:
    """The Delta ``txnAppId`` of re-applied records (module docstring)."""
    return streaming_app_id + REAPPLY_SUFFIX


@dataclass(frozen=True, slots=True)
class ReapplyPass:
    records: int
    """Parked records the pass re-applied."""
    up_to_batch: int
    """The newest micro-batch among them."""
    results: tuple[TableResult, ...]
    """The apply result per topic of the table (one, unless the topic prefix changed)."""


@dataclass(frozen=True, slots=True)
class ReapplyOutcome:
    table: str
    passes: tuple[ReapplyPass, ...]
    still_waiting: int
    """Records parked after the last release (module docstring); 0 when the table is
    no longer errored."""


def apply_parked(spark: SparkSession, table: str, context: ApplyContext) -> ReapplyPass | None:
    """Steps 1 and 2 of the module docstring; None when nothing of ``table`` waits."""
    waiting = waiting_records(spark, context.dead_letter, table).persist()
    try:
        summary = waiting.agg(sf.count(sf.lit(1)).alias("n"), sf.max(BATCH_ID).alias("b")).head()
        if summary is None or summary["n"] == 0:
            return None
        up_to_batch = int(summary["b"])
        records = waiting.drop(BATCH_ID)
        surveys = survey(records)
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
            result = apply_table(spark, records, up_to_batch, surveys[topic], context)
            if result is not None:
                results.append(result)
        return ReapplyPass(int(summary["n"]), up_to_batch, tuple(results))
    finally:
        waiting.unpersist()


def reapply_table(spark: SparkSession, table: str, context: ApplyContext) -> ReapplyOutcome:
    """Re-apply and release every waiting record of ``table`` (module docstring).
    ``context.txn_app_id`` must be :func:`reapply_app_id` of the streaming query's."""
    passes = []
    for _ in range(_MAX_PASSES):
        applied = apply_parked(spark, table, context)
        if applied is None:
            break
        version = max((r.version for r in applied.results), default=None)
        release(spark, context.dead_letter, table, applied.up_to_batch, version)
        log.info(
            "re-applied %d parked records of %s (micro-batches up to %d) into version %s",
            applied.records,
            table,
            applied.up_to_batch,
            version,
        )
        passes.append(applied)
    still = errored_tables(spark, context.dead_letter).get(table)
    return ReapplyOutcome(
        table=table, passes=tuple(passes), still_waiting=0 if still is None else still.records
    )
