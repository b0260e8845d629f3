"""The pipeline under pgbench, crashes and outages: the lake ends equal to the source.

Every scenario runs capture and apply as real processes (``tests/plugins/pipeline.py``)
on a PostgreSQL and a Kafka of this module's own, drives pgbench, does its worst, stops
the workload, waits until the slot has passed the WAL written (capture confirms an LSN
only once apply has it in Delta), and then checks that every table equals its source and
that no key appears twice in Delta.

pgbench's ``pgbench_history`` has no primary key. The documented rule
(docs/capture.md, tables without a primary key): such a table is captured with
``REPLICA IDENTITY FULL`` and keyed by its whole row, which for an append-only table like
this one is exact as long as no two rows are identical in every column.

Repeat counts come from the environment so ``make soak`` can run the long form:
``CDC_SOAK_KILLS`` (kills per service), ``CDC_SOAK_SECONDS`` (workload length).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from deploy.local import stack
from tests.plugins.capture import table_status
from tests.plugins.pipeline import (
    PGBENCH_TABLES,
    RATE,
    SECONDS,
    Pipeline,
    create_database,
    finish_workload,
    kafka_pid,
    kill_9_during_the_workload,
    pgbench,
    pgbench_pipeline,
    start_and_catch_up,
    start_pgbench,
    start_workload,
)
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def pipeline(own_stack: stack.StackState, unique_name: str, tmp_path: Path) -> Any:
    built = pgbench_pipeline(own_stack, unique_name, tmp_path)
    yield built
    built.stop()


def test_pgbench_through_the_pipeline(spark: Any, pipeline: Pipeline) -> None:
    start_and_catch_up(pipeline)
    bench = start_workload(pipeline, SECONDS // 2)
    finish_workload(spark, pipeline, bench)


def test_kill_9_of_capture_and_apply_during_the_workload(spark: Any, pipeline: Pipeline) -> None:
    kill_9_during_the_workload(spark, pipeline)


def test_kafka_stopped_and_killed_mid_workload(
    spark: Any, pipeline: Pipeline, own_stack: stack.StackState
) -> None:
    start_and_catch_up(pipeline)
    bench = start_workload(pipeline, SECONDS)
    kafka = own_stack.kafka
    time.sleep(SECONDS / 5)
    assert kafka.stop()  # SIGTERM: a controlled shutdown
    time.sleep(5)
    kafka.start()
    time.sleep(SECONDS / 5)
    os.kill(kafka_pid(own_stack), signal.SIGKILL)
    wait_for(lambda: not kafka.running(), "the killed broker to exit", 30)
    time.sleep(5)
    kafka.start()
    finish_workload(spark, pipeline, bench)


def test_postgres_restarted_mid_workload(
    spark: Any, pipeline: Pipeline, own_stack: stack.StackState
) -> None:
    start_and_catch_up(pipeline)
    postgres = own_stack.postgres
    log = pipeline.workdir / "pgbench.log"
    # pgbench ends when its server goes away, so the workload runs in two parts.
    first = start_workload(pipeline, SECONDS // 3)
    time.sleep(SECONDS / 6)
    pid = postgres.postmaster_pid()
    assert pid is not None
    os.kill(pid, signal.SIGINT)  # fast shutdown: sessions are cut
    # A logical walsender exits only once its client confirmed all it sent, which
    # capture does only as far as the lake applied; capture's stream lets go as soon as
    # its idle watch session is ended (capture/stream/replication.py), so the shutdown does not
    # wait for apply to catch up.
    try:
        wait_for(lambda: not postgres.running(), "PostgreSQL to shut down", 120)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n--- postgres log:\n{postgres.log_file.read_text()[-4000:]}\n{pipeline.logs()}"
        ) from exc
    first.wait(60)
    postgres.start()
    second = start_pgbench(
        pipeline.dsn, "-n", "-c", "2", "-j", "1", "-T", str(SECONDS // 3), "-R", RATE, log=log
    )
    finish_workload(spark, pipeline, second)


def test_kill_9_of_capture_mid_snapshot_resumes_and_ends_equal(
    spark: Any, own_stack: stack.StackState, unique_name: str, tmp_path: Path
) -> None:
    """A capture killed while its snapshot of ``pgbench_accounts`` (100,000 rows, 40 chunks)
    is part-way through resumes after the recorded chunks, under the workload, and
    ``verify`` finds the lake equal to the source (docs/capture.md, "Resuming a
    snapshot")."""
    dsn = create_database(own_stack.postgres.dsn, unique_name)
    pgbench(dsn, "-i", "-s", "1", "-q")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE public.pgbench_history REPLICA IDENTITY FULL")
        conn.execute("ANALYZE")
    pipeline = Pipeline(
        name=unique_name,
        dsn=dsn,
        bootstrap=own_stack.kafka.bootstrap_servers,
        tables=tuple(f"public.{t}" for t in PGBENCH_TABLES),
        workdir=tmp_path,
        capture_overrides={
            "CAPTURE_SNAPSHOT_WORKERS": "2",
            "CAPTURE_SNAPSHOT_CHUNK_ROWS": "2500",
            # Paced by the lake, the snapshot goes at apply's pace (four chunks ahead of
            # it at most), so it is still part-way through when the test sees five chunks
            # recorded.
            "CAPTURE_SNAPSHOT_PACE": "lake",
            "CAPTURE_MAX_IN_FLIGHT_RECORDS": "10000",
        },
    )
    try:
        bench = start_workload(pipeline, SECONDS)
        pipeline.capture.start()
        pipeline.apply.start()
        capture_settings, _ = pipeline.settings()

        def resume_recorded() -> int | None:
            accounts = table_status(capture_settings, "public.pgbench_accounts")
            return None if accounts is None or accounts.resume is None else accounts.resume.chunk

        wait_for(
            lambda: (resume_recorded() or 0) >= 5,
            f"no chunk of pgbench_accounts was recorded\n{pipeline.logs()}",
            300,
        )
        pipeline.capture.kill()
        cut = resume_recorded()
        assert cut is not None, "the kill came after the snapshot"
        pipeline.capture.start()
        finish_workload(spark, pipeline, bench)
        resumed = pipeline.capture.log.read_text(errors="replace").rsplit("==== start", 1)[-1]
        assert "snapshot of public.pgbench_accounts resumes at block" in resumed, resumed[-4000:]
        assert pipeline.capture.kills == 1
    finally:
        pipeline.stop()
