"""Lanes against the real PostgreSQL, capture, Kafka and Delta: a table in a lane of its
own commits independently of the default lane's tables, and tables move between lanes
by a restart with new settings, without losing, duplicating or refusing anything."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame

from apply.app import ApplyJob, lanes_of
from apply.batch.table_pool import POOL_PROPERTY
from apply.control.progress import BatchResult
from apply.lake.history import recover_state
from apply.lake.spark_merge import transaction_app_id
from apply.lake.tables import TableId, table_path
from apply.lanes import DEFAULT_LANE
from apply.settings import ApplySettings, LakeSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.lake import wait_applied
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]


class HoldingJob(ApplyJob):
    """The apply job, with every batch of one lane held until ``release`` is set."""

    def __init__(self, settings: ApplySettings, spark: Any, held_lane: str) -> None:
        super().__init__(settings, spark)
        self.held_lane = held_lane
        self.holding = threading.Event()
        self.release = threading.Event()
        self.context = spark.sparkContext
        self.pools: dict[str, set[str | None]] = {}

    def apply(self, batch: DataFrame, batch_id: int, lane: str = DEFAULT_LANE) -> BatchResult:
        # The scheduler pool the batch's own jobs are submitted to (the query's thread).
        self.pools.setdefault(lane, set()).add(self.context.getLocalProperty(POOL_PROPERTY))
        if lane == self.held_lane and not self.release.is_set():
            self.holding.set()
            assert self.release.wait(300), "the held lane was never released"
        return super().apply(batch, batch_id, lane)


@contextmanager
def running(job: ApplyJob) -> Iterator[list[BaseException]]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            job.run(stop)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        if isinstance(job, HoldingJob):
            job.release.set()
        stop.set()
        thread.join(120)
        job.close()
    assert not thread.is_alive(), "the apply job did not stop"
    assert not errors, "\n".join(map(str, errors))


def lake_rows(spark: Any, root: str, schema: str, table: str) -> dict[int, str]:
    path = table_path(root, TableId(schema, table))
    # The log directory appears before its first commit: the table exists once that has.
    if not Path(path, "_delta_log", f"{0:020d}.json").exists():
        return {}
    return {row["id"]: row["v"] for row in spark.read.format("delta").load(path).collect()}


def source_rows(pg: Connection, schema: str, table: str) -> dict[int, str]:
    query = sql.SQL("SELECT id, v FROM {}").format(sql.Identifier(schema, table))
    return {int(r[0]): str(r[1]) for r in pg.execute(query).fetchall()}  # type: ignore[call-overload]


def writer(spark: Any, root: str, schema: str, table: str) -> str | None:
    """The ``txnAppId`` the table's newest apply commit records."""
    name = f"{schema}.{table}"
    state = recover_state(spark, table_path(root, TableId(schema, table)), name)
    assert state is not None, f"{name} has no apply commit"
    return state.txn_app_id


def test_tables_in_lanes_commit_independently_and_move_between_lanes(
    spark: Any, services: Services, pg: Connection, unique_name: str, tmp_path: Path
) -> None:
    schema = unique_name
    big, small = "big", "small"
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for table in (big, small):
        pg.execute(
            sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v text)").format(
                sql.Identifier(schema, table)
            )
        )
    capture = CaptureThread(
        capture_settings(services, unique_name, [f"{schema}.{big}", f"{schema}.{small}"])
    )
    capture.start(pg)
    root, checkpoints = str(tmp_path / "lake"), str(tmp_path / "cp")
    base = ApplySettings(
        kafka=ApplyKafka(
            bootstrap_servers=services.kafka_bootstrap_servers,
            topic_prefix=unique_name,
            control_topic=f"{unique_name}._control",
            schema_topic=f"{unique_name}._schemas",
        ),
        lake=LakeSettings(root=root, checkpoint_root=checkpoints),
        trigger=TriggerSettings(interval="1 second"),
        table_parallelism=1,
    )
    first = base.model_copy(update={"lanes": {"heavy": [f"{schema}.{big}"]}})
    second = base.model_copy(update={"lanes": {"light": [f"{schema}.{small}"]}})
    ids = {
        (run, lane.name): transaction_app_id(lane.checkpoint)
        for run, settings in (("first", first), ("second", second))
        for lane in lanes_of(settings)
    }

    def write(table: str, statement: str) -> None:
        pg.execute(sql.SQL(statement).format(sql.Identifier(schema, table)))

    try:
        # 1. The big table in a lane whose batches are held: the small table, in the
        # default lane, is applied all the same, which one query could not do.
        job = HoldingJob(first, spark, "heavy")
        with running(job) as errors:
            write(big, "INSERT INTO {} SELECT g, 'a' FROM generate_series(1, 300) g")
            write(small, "INSERT INTO {} SELECT g, 'a' FROM generate_series(1, 20) g")
            wait_for(job.holding.is_set, "the big table's lane to start a batch", 180)
            wait_for(
                lambda: (
                    not errors
                    and lake_rows(spark, root, schema, small) == source_rows(pg, schema, small)
                ),
                "the small table to be applied while the big table's lane is held",
                180,
            )
            assert lake_rows(spark, root, schema, big) == {}, "the held lane committed nothing"
            assert job.holding.is_set()
            assert not job.release.is_set()
            job.release.set()
            wait_applied(pg, unique_name, errors)
            # More batches of the small table in the default lane: its newest commit
            # comes from a batch id above 0.
            write(small, "UPDATE {} SET v = 'b' WHERE id <= 5")
            wait_applied(pg, unique_name, errors)
            write(small, "DELETE FROM {} WHERE id > 15")
            wait_applied(pg, unique_name, errors)
        small_state = recover_state(
            spark, table_path(root, TableId(schema, small)), f"{schema}.{small}"
        )
        assert small_state is not None
        assert small_state.batch_id > 0
        assert lake_rows(spark, root, schema, big) == source_rows(pg, schema, big)
        assert job.pools == {"heavy": {"lane:heavy"}, DEFAULT_LANE: {"lane:default"}}
        assert writer(spark, root, schema, big) == ids["first", "heavy"]
        assert writer(spark, root, schema, small) == ids["first", DEFAULT_LANE]

        # 2. While apply is down, changes to the big table. Then it goes back to the
        # default lane, and the small table to a new lane. Both lanes start new
        # checkpoints and re-read their topics from the start; the replay guard drops
        # what is applied. The small table's first batch in its lane holds nothing new,
        # and its batch id, 0, is below the default lane's that wrote the table: not a
        # checkpoint reset, since another query wrote that commit.
        write(big, "UPDATE {} SET v = 'b' WHERE id % 3 = 0")
        write(big, "DELETE FROM {} WHERE id > 280")
        moved = ApplyJob(second, spark)
        with running(moved) as errors:
            wait_applied(pg, unique_name, errors)
            write(small, "INSERT INTO {} VALUES (100, 'c')")
            write(big, "INSERT INTO {} VALUES (1000, 'c')")
            wait_applied(pg, unique_name, errors)
        for table in (big, small):
            assert lake_rows(spark, root, schema, table) == source_rows(pg, schema, table)
        assert writer(spark, root, schema, big) == ids["second", DEFAULT_LANE]
        assert writer(spark, root, schema, small) == ids["second", "light"]
    finally:
        capture.close(pg)
