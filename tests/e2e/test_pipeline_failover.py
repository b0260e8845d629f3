"""A primary that fails over: capture streams on from the promoted standby's synchronized
slot, and the lake ends equal to the source with no change lost and none twice.

PostgreSQL 18 (failover slots exist from 17): a primary and a physical standby made from
it with ``pg_basebackup`` (:mod:`deploy.local.standby`), the standby synchronizing
capture's failover slot, the primary holding logical changes back until the standby has
them (``synchronized_standby_slots``). Capture knows both servers through one multi-host
DSN with ``target_session_attrs=read-write``, so it finds whichever is the primary.

Under a steady stream of inserts and updates the primary is stopped in immediate mode
(as when its machine dies) and the standby promoted. The synchronized slot is then
behind what capture had streamed, published and checkpointed: capture must accept that
(the slot's history check refuses only a slot *ahead* of its checkpoint) and stream
again from there, and apply must drop what it already holds (its replay guard). Every
row the standby had at the failover, and every row written after it, must reach the
lake.

The workload runs under ``synchronous_commit = off`` (the local stack's setting), so a
commit the old primary acknowledged may still be lost with it; the rows the test counts
on are the ones acknowledged before the standby was seen to have received the WAL
written so far, and the ones written to the new primary.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from deploy.local.postgres import LocalPostgres
from deploy.local.standby import promote
from schemas.lsn import format_lsn
from tests.plugins.failover import ServerPair, scalar, server_pair, wal_received
from tests.plugins.pipeline import (
    Pipeline,
    assert_lake_equals_source,
    create_database,
    current_wal,
    start_and_catch_up,
    wait_caught_up,
)
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow

VERSION = 18
SNAPSHOT_ROWS = 200
ROWS_PER_PHASE = 150
"""Inserts the workload commits in each phase (before the failover, after it): a few
seconds of it at the writer's pace."""


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ServerPair]:
    with server_pair(tmp_path, VERSION, why="failover slots exist from 17") as pair:
        yield pair


@dataclass
class Writer:
    """Inserts a new row and updates an old one per transaction, at a steady pace,
    through the multi-host DSN: while no server takes writes, it tries again. Keeps the
    ids whose commit was acknowledged, each with the port of the server that did."""

    dsn: str
    acknowledged: list[tuple[int, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        next_id = SNAPSHOT_ROWS
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    port = conn.info.port
                    while not self.stop.wait(0.02):  # pacing, about 40 transactions a second
                        next_id += 1
                        with conn.transaction():
                            conn.execute("INSERT INTO public.t VALUES (%s, 'new')", [next_id])
                            conn.execute(
                                "UPDATE public.t SET v = v || '+' WHERE id = %s",
                                [next_id % SNAPSHOT_ROWS + 1],
                            )
                        self.acknowledged.append((port, next_id))
            except psycopg.OperationalError:
                # The server went away; whether the last commit got through is unknown,
                # so its id is never reused.
                next_id += 1
                self.stop.wait(0.1)

    def ids(self, port: int) -> list[int]:
        return [i for p, i in list(self.acknowledged) if p == port]

    def wait_for_more(self, port: int, rows: int, what: str) -> None:
        target = len(self.ids(port)) + rows
        wait_for(lambda: len(self.ids(port)) >= target, what, 120)

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(30)
        assert not self.thread.is_alive(), "the writer did not stop"


def _failover_ready(standby: LocalPostgres, slot: str) -> bool:
    """The standby's copy of ``slot`` survives a promotion (a temporary one, still
    catching up with the primary's, is dropped by it)."""
    return bool(
        scalar(
            standby.dsn,
            "SELECT synced AND NOT temporary AND invalidation_reason IS NULL "
            "FROM pg_replication_slots WHERE slot_name = %s",
            slot,
        )
    )


def test_capture_streams_on_from_the_promoted_standby(
    spark: Any, servers: ServerPair, shared_services: Services, unique_name: str, tmp_path: Path
) -> None:
    primary = servers.primary
    source = create_database(primary.dsn, unique_name)
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
        conn.execute(
            "INSERT INTO public.t SELECT i, 'old' FROM generate_series(1, %s) i", [SNAPSHOT_ROWS]
        )
    standby = servers.add_standby(unique_name)
    dsn = servers.dsn(unique_name)
    pipeline = Pipeline(
        name=unique_name,
        dsn=dsn,
        bootstrap=shared_services.kafka_bootstrap_servers,
        tables=("public.t",),
        workdir=tmp_path,
    )
    writer = Writer(dsn)
    try:
        start_and_catch_up(pipeline)
        writer.start()
        wait_for(
            lambda: _failover_ready(standby, unique_name),
            f"the standby to keep a failover-ready copy of slot {unique_name}\n{pipeline.logs()}",
            90,
        )
        writer.wait_for_more(primary.port, ROWS_PER_PHASE, "the workload on the primary")

        # The rows the standby is known to have: acknowledged before the WAL end read
        # here, which the standby is then seen to have received. The old primary may
        # acknowledge more before it stops, and lose them with it.
        before = writer.ids(primary.port)
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            written = current_wal(conn)
        wait_for(lambda: wal_received(standby) >= written, f"the standby to receive {written}", 60)
        primary.stop_immediately()
        promote(standby)
        # The copy is used as it is: on the new primary it still reads as synchronized.
        with psycopg.connect(standby.dsn, autocommit=True) as conn:
            copy = conn.execute(
                "SELECT synced, confirmed_flush_lsn::text FROM pg_replication_slots "
                "WHERE slot_name = %s",
                [unique_name],
            ).fetchone()
        assert copy is not None, f"the promotion dropped slot {unique_name}"
        assert copy[0] is True
        print(f"failover at {format_lsn(written)}: the standby's copy of the slot at {copy[1]}")

        writer.wait_for_more(
            standby.port, ROWS_PER_PHASE, f"the workload on the promoted standby\n{pipeline.logs()}"
        )
        writer.finish()
        wait_caught_up(pipeline, timeout_s=120)
        assert pipeline.capture.running(), pipeline.logs()
        assert pipeline.apply.running(), pipeline.logs()

        log = pipeline.capture.log.read_text(errors="replace")
        assert log.count(f"streaming slot {unique_name} from") >= 2, pipeline.logs()
        # The promoted standby is on timeline 2, forked after everything capture held.
        assert "the source moved from timeline 1 to 2" in log, pipeline.logs()
        assert_lake_equals_source(spark, pipeline)
        lake = spark.read.format("delta").load(pipeline.table_path("public.t"))
        in_lake = {int(row.id) for row in lake.select("id").collect()}
        after = writer.ids(standby.port)
        assert len(before) >= ROWS_PER_PHASE
        assert len(after) >= ROWS_PER_PHASE
        assert set(range(1, SNAPSHOT_ROWS + 1)) <= in_lake
        missing = sorted(set(before) - in_lake)
        assert not missing, f"rows written before the failover are missing: {missing[:20]}"
        missing = sorted(set(after) - in_lake)
        assert not missing, f"rows written after the failover are missing: {missing[:20]}"
    finally:
        writer.stop.set()
        pipeline.stop()
