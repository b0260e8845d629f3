"""The apply job's Spark schedules tables fairly: FAIR mode is on in the session the job
builds, and every table's jobs run in a scheduler pool of that table's own
(:mod:`apply.batch.table_pool`).

Which pool a job ran in is read back from Spark's own record of its stages (the status
store behind the UI and ``statusTracker``), once the listener bus has delivered every
event: the pool Spark scheduled the stage in, not the property the test set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError

from apply.batch import apply_batch
from apply.batch.table_pool import POOL_PROPERTY, SchedulerPools, run_per_table
from schemas import column_type as ct
from schemas.change_record import ChangeEncoder, Column, TableDescription, build_table_schemas
from tests.plugins.change_topics import INSERT, UPDATE, ChangeTopic, change, context
from tests.plugins.services import Services

pytestmark = pytest.mark.slow


def _settled(spark: Any) -> Any:
    """The JVM SparkContext once every listener event so far is in the status store."""
    context = spark.sparkContext._jsc.sc()
    context.listenerBus().waitUntilEmpty()
    return context


def _stage_pools(spark: Any, group: str | None) -> list[str]:
    """The scheduler pool of every stage that ran for the jobs of ``group`` (None: the
    jobs of no group)."""
    context = _settled(spark)
    tracker = spark.sparkContext.statusTracker()
    pools = []
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        assert info is not None
        for stage in info.stageIds:
            try:
                data = context.statusStore().lastStageAttempt(stage)
            except Py4JJavaError as exc:
                # Spark keeps spark.ui.retainedStages stages and drops the oldest
                # finished ones first, and stages it skipped (never scheduled) with
                # them: in a long test session some of them are gone. A stage that ran
                # for this test is among the newest and stays.
                if exc.java_exception.getClass().getName() == "java.util.NoSuchElementException":
                    continue
                raise
            # A stage a job skipped (its shuffle output was there already) was never
            # scheduled; Spark's record shows the pool ``default`` for it.
            if str(data.status()) == "COMPLETE":
                pools.append(str(data.schedulingPool()))
    return pools


def test_the_job_session_schedules_fairly(spark: Any) -> None:
    assert spark.sparkContext.getConf().get("spark.scheduler.mode") == "FAIR"
    assert str(spark.sparkContext._jsc.sc().getSchedulingMode()) == "FAIR"


def test_each_item_submits_its_jobs_to_its_own_pool(spark: Any, unique_name: str) -> None:
    tables = [f"{unique_name}.a", f"{unique_name}.b", f"{unique_name}.c"]
    context = spark.sparkContext

    def work(table: str) -> str | None:
        context.setJobGroup(f"group of {table}", "pool test")
        assert spark.range(100).repartition(2).count() == 100  # a job of two stages
        pool: str | None = context.getLocalProperty(POOL_PROPERTY)
        return pool

    # Two threads for three tables: one thread serves two tables in turn.
    futures = run_per_table(
        tables, work, parallelism=2, pools=SchedulerPools(context, lambda table: table)
    )

    assert [f.result() for f in futures] == tables
    for table in tables:
        assert set(_stage_pools(spark, f"group of {table}")) == {table}
    assert context.getLocalProperty(POOL_PROPERTY) is None, "the caller's thread is untouched"


def test_the_tables_of_a_batch_run_in_their_own_pools(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    schemas = [
        build_table_schemas(
            TableDescription(
                "public",
                f"{unique_name}_{suffix}",
                (Column("id", ct.LONG, nullable=False, key=True), Column("note", ct.STRING)),
            )
        )
        for suffix in ("a", "b")
    ]
    batches = []
    for table_schemas in schemas:
        topic = ChangeTopic(services, table_schemas.description.table, 1)
        encoder = ChangeEncoder(table_schemas)
        start = topic.mark()
        topic.send(encoder, 0, change(INSERT, 0x100, 0, after={"id": 1, "note": "one"}))
        topic.send(encoder, 0, change(UPDATE, 0x200, 0, after={"id": 1, "note": "uno"}))
        batches.append(topic.batch(spark, start, topic.mark()))

    result = apply_batch(batches[0].union(batches[1]), 0, context(tmp_path, *schemas))

    tables = [s.description.qualified_name for s in schemas]
    assert sorted(r.table for r in result.applied) == tables
    pools = _stage_pools(spark, None)
    for table in tables:
        # Reading the table's history, creating it, decoding and the MERGE: all jobs.
        assert pools.count(table) >= 3, f"{table}'s jobs ran outside its pool"
