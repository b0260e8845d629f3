"""Three end-to-end proofs on the real pipeline, each ending with verify reporting the
lake equal to the source and no key twice in Delta.

1. Unchanged TOAST: an UPDATE that leaves an out-of-line value alone sends it as
   "unchanged" (pgoutput's ``u`` column kind, REPLICA IDENTITY DEFAULT); the lake must
   keep the value it has, across later micro-batches and around a row whose big value
   does change.
2. Retained WAL: a busy table next to an idle one; the slot's retained WAL stays within
   what the pipeline's own latency explains and drops to near zero once the workload
   stops, so the idle table never pins the slot.
3. A table added while streaming: a new table of a captured schema is snapshotted and
   streamed while the other tables' changes keep reaching the lake.

Capture and apply run as real processes on a PostgreSQL and Kafka of this module's own
(``tests/plugins/pipeline.py``). Workload lengths come from ``CDC_SOAK_SECONDS`` (as in
``test_pipeline_faults.py``), so a soak run can make them longer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from deploy.local import stack
from pipeline.status import StatusReader
from schemas.control import TableState
from schemas.lsn import Lsn, format_lsn, parse_lsn
from tests.e2e.test_pipeline_faults import assert_lake_equals_source
from tests.plugins.pipeline import (
    Pipeline,
    create_database,
    start_pgbench,
    wait_caught_up,
    wait_for,
    watch_schemas,
)

pytestmark = pytest.mark.slow
SECONDS = int(os.environ.get("CDC_SOAK_SECONDS", "60"))


def _database(state: stack.StackState, name: str, *statements: str) -> str:
    dsn = create_database(state.postgres.dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.encode())
    return dsn


def _pipeline(
    state: stack.StackState, name: str, dsn: str, tables: tuple[str, ...], workdir: Path
) -> Pipeline:
    return Pipeline(
        name=name, dsn=dsn, bootstrap=state.kafka.bootstrap_servers, tables=tables, workdir=workdir
    )


def _started(pipeline: Pipeline) -> None:
    pipeline.capture.start()
    pipeline.apply.start()
    wait_caught_up(pipeline, timeout_s=600)


def _pgbench(pipeline: Pipeline, script: str, name: str, rate: int, seconds: int) -> Any:
    path = pipeline.workdir / f"{name}.pgbench"
    path.write_text(script)
    return start_pgbench(
        pipeline.dsn,
        "-n",
        "-c",
        "1",
        "-f",
        str(path),
        "-R",
        str(rate),
        "-T",
        str(seconds),
        log=pipeline.workdir / f"{name}.log",
    )


def _finished(pipeline: Pipeline, bench: Any, name: str, timeout_s: float) -> None:
    assert bench.wait(timeout_s) == 0, (pipeline.workdir / f"{name}.log").read_text()


@pytest.fixture
def cleanup() -> Any:
    pipelines: list[Pipeline] = []
    yield pipelines
    for pipeline in pipelines:
        pipeline.stop()


# 1. Unchanged TOAST ---------------------------------------------------------------------

BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 640))"
"""20,480 characters of hex: random, so compression cannot bring it inline."""
BIG_CHARS = 640 * 32


def _lake_bodies(spark: Any, pipeline: Pipeline, table: str) -> dict[int, tuple[int, str]]:
    from pyspark.sql import functions as sf  # noqa: PLC0415

    rows = (
        spark.read.format("delta")
        .load(pipeline.table_path(table))
        .select("id", sf.length("body").alias("chars"), sf.md5("body").alias("digest"))
        .collect()
    )
    return {int(r["id"]): (int(r["chars"]), str(r["digest"])) for r in rows}


def _source_bodies(dsn: str) -> dict[int, tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, length(body), md5(body) FROM public.docs").fetchall()
    return {int(r[0]): (int(r[1]), str(r[2])) for r in rows}


def test_unchanged_toast_survives_later_batches(
    spark: Any, own_stack: stack.StackState, unique_name: str, tmp_path: Path, cleanup: Any
) -> None:
    dsn = _database(
        own_stack,
        unique_name,
        "CREATE TABLE public.docs (id int PRIMARY KEY, n int NOT NULL, body text NOT NULL)",
        # EXTERNAL: out of line without compression, so every body is a TOAST pointer and
        # an UPDATE that leaves it alone sends it as unchanged.
        "ALTER TABLE public.docs ALTER COLUMN body SET STORAGE EXTERNAL",
        f"INSERT INTO public.docs SELECT i, 0, {BIG} FROM generate_series(1, 10) i",
    )
    pipeline = _pipeline(own_stack, unique_name, dsn, ("public.docs",), tmp_path)
    cleanup.append(pipeline)
    _started(pipeline)  # rows 1-10 come by the snapshot
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"INSERT INTO public.docs SELECT i, 0, {BIG} FROM generate_series(11, 20) i")
        toasted = conn.execute(
            "SELECT count(*) FROM public.docs WHERE pg_column_size(body) >= %s", [BIG_CHARS]
        ).fetchone()
        assert toasted == (20,), "every body is stored uncompressed out of line"
    wait_caught_up(pipeline)  # rows 11-20 come by the stream, whole

    def unchanged_round() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE public.docs SET n = n + 1")
        wait_caught_up(pipeline)
        lake = _lake_bodies(spark, pipeline, "public.docs")
        assert lake == _source_bodies(dsn), f"the lake lost unchanged values\n{pipeline.logs()}"
        assert lake[1][0] == BIG_CHARS

    unchanged_round()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE public.docs SET body = {BIG} WHERE id = 1")
        # Changed and then left alone in one transaction, and in two transactions of
        # what is likely one micro-batch: the second change's unchanged value is the
        # first one's new value, not the lake's old one.
        with conn.transaction():
            conn.execute(f"UPDATE public.docs SET body = {BIG} WHERE id = 2")
            conn.execute("UPDATE public.docs SET n = n + 10 WHERE id = 2")
        conn.execute(f"UPDATE public.docs SET body = {BIG} WHERE id = 3")
        conn.execute("UPDATE public.docs SET n = n + 10 WHERE id = 3")
    wait_caught_up(pipeline)
    unchanged_round()
    assert_lake_equals_source(spark, pipeline)


# 2. Retained WAL ------------------------------------------------------------------------

STANDBY_SNAPSHOT_S = 15
"""restart_lsn moves only to an xl_running_xacts record the slot has decoded and confirmed;
the background writer logs one every 15 s while WAL is written (LOG_SNAPSHOT_INTERVAL_MS
in PostgreSQL's bgwriter.c)."""
PIPELINE_LATENCY_S = 25
"""How far confirmed_flush_lsn may trail the WAL: capture's status interval (0.5 s here),
apply's 1 s trigger and a micro-batch of a few seconds on a loaded 2-core machine, with
room for a slow one. A slot pinned by the idle table trails by the whole run instead."""
SAMPLE_S = 2.0
NEAR_ZERO = 1 << 20


@dataclass(frozen=True, slots=True)
class WalSample:
    at: float
    wal: Lsn
    restart: Lsn
    confirmed: Lsn

    @property
    def retained(self) -> int:
        return self.wal - self.restart

    @property
    def unconfirmed(self) -> int:
        return self.wal - self.confirmed


def _sample(conn: psycopg.Connection[tuple[Any, ...]], slot: str, start: float) -> WalSample:
    row = conn.execute(
        "SELECT pg_current_wal_lsn()::text, restart_lsn::text, confirmed_flush_lsn::text "
        "FROM pg_replication_slots WHERE slot_name = %s",
        [slot],
    ).fetchone()
    assert row is not None, f"slot {slot} is gone"
    wal, restart, confirmed = (parse_lsn(str(v)) for v in row)
    return WalSample(time.monotonic() - start, wal, restart, confirmed)


def _written_within(samples: list[WalSample], sample: WalSample, window_s: float) -> int | None:
    """WAL written from the last sample at least ``window_s`` before ``sample`` up to it;
    None when the run is not that old yet."""
    before = [s for s in samples if s.at <= sample.at - window_s]
    return None if not before else sample.wal - before[-1].wal


def test_idle_table_does_not_pin_the_slot(
    spark: Any, own_stack: stack.StackState, unique_name: str, tmp_path: Path, cleanup: Any
) -> None:
    dsn = _database(
        own_stack,
        unique_name,
        "CREATE TABLE public.busy (id int PRIMARY KEY, n int NOT NULL, payload text)",
        "CREATE TABLE public.idle (id int PRIMARY KEY, v text)",
        "INSERT INTO public.busy SELECT i, 0, NULL FROM generate_series(1, 100) i",
        "INSERT INTO public.idle SELECT i, md5(i::text) FROM generate_series(1, 100) i",
    )
    pipeline = _pipeline(own_stack, unique_name, dsn, ("public.busy", "public.idle"), tmp_path)
    cleanup.append(pipeline)
    _started(pipeline)
    seconds = max(SECONDS, 2 * (STANDBY_SNAPSHOT_S + PIPELINE_LATENCY_S))
    bench = _pgbench(
        pipeline,
        "\\set id random(1, 100)\n"
        "UPDATE public.busy SET n = n + 1, payload = repeat(md5(random()::text), 48) "
        "WHERE id = :id;\n",
        "busy",
        rate=40,
        seconds=seconds,
    )
    samples: list[WalSample] = []
    start = time.monotonic()
    print("   at        wal   retained  unconfirmed")
    with psycopg.connect(dsn, autocommit=True) as conn:
        while bench.poll() is None:
            samples.append(_sample(conn, pipeline.name, start))
            s = samples[-1]
            print(f"{s.at:5.1f} {format_lsn(s.wal):>10} {s.retained:10d} {s.unconfirmed:12d}")
            time.sleep(SAMPLE_S)
        _finished(pipeline, bench, "busy", 30)
        written = samples[-1].wal - samples[0].wal
        print(f"written during the workload: {written} bytes in {samples[-1].at:.1f} s")
        assert pipeline.capture.running(), pipeline.logs()
        assert pipeline.apply.running(), pipeline.logs()

        judged = 0
        for s in samples:
            confirm_window = _written_within(samples, s, PIPELINE_LATENCY_S + SAMPLE_S)
            retain_window = _written_within(
                samples, s, STANDBY_SNAPSHOT_S + PIPELINE_LATENCY_S + SAMPLE_S
            )
            if confirm_window is not None:
                assert s.unconfirmed <= confirm_window, f"confirmed_flush_lsn trails at {s}"
            if retain_window is not None:
                assert s.retained <= retain_window, f"the slot retains too much WAL at {s}"
                judged += 1
        # The bound could fail: a pinned slot retains everything written since the start,
        # more than the window's share of it.
        assert judged >= 5, f"only {judged} samples were old enough to judge"
        assert written > 2 * NEAR_ZERO, "the workload wrote too little WAL to tell a pinned slot"

        def released() -> bool:
            s = _sample(conn, pipeline.name, start)
            print(f"{s.at:5.1f} {format_lsn(s.wal):>10} {s.retained:10d} {s.unconfirmed:12d}")
            return s.retained < NEAR_ZERO

        wait_for(released, "the retained WAL to drop below 1 MiB after the workload", 120)
    wait_caught_up(pipeline)
    assert_lake_equals_source(spark, pipeline)


# 3. A table added while streaming -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Progress:
    c_state: TableState | None
    c_applied: Lsn | None
    a_applied: Lsn | None
    b_applied: Lsn | None


def test_table_added_to_a_schema_while_streaming(
    spark: Any, own_stack: stack.StackState, unique_name: str, tmp_path: Path, cleanup: Any
) -> None:
    dsn = _database(
        own_stack,
        unique_name,
        "CREATE SCHEMA app",
        "CREATE TABLE app.a (id int PRIMARY KEY, n int NOT NULL)",
        "CREATE TABLE app.b (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO app.a SELECT i, 0 FROM generate_series(1, 1000) i",
        "INSERT INTO app.b SELECT i, 0 FROM generate_series(1, 1000) i",
    )
    pipeline = _pipeline(own_stack, unique_name, dsn, ("app.a", "app.b"), tmp_path)
    cleanup.append(pipeline)
    watch_schemas(pipeline, ["app"], refresh_s=2)
    _started(pipeline)
    ab = _pgbench(
        pipeline,
        "\\set id random(1, 1000)\n"
        "UPDATE app.a SET n = n + 1 WHERE id = :id;\n"
        "UPDATE app.b SET n = n + 1 WHERE id = :id;\n",
        "ab",
        rate=20,
        seconds=SECONDS,
    )
    time.sleep(3)  # let a and b stream for a while first: no condition to poll for
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE app.c (id int PRIMARY KEY, n int NOT NULL, pad text)")
        # Big enough that its snapshot takes a while to reach the lake.
        conn.execute(
            "INSERT INTO app.c SELECT i, 0, md5(i::text) FROM generate_series(1, 100000) i"
        )
    c = _pgbench(
        pipeline,
        "\\set id random(1, 200000)\n"
        "INSERT INTO app.c VALUES (:id, 0, md5(random()::text)) "
        "ON CONFLICT (id) DO UPDATE SET n = app.c.n + 1;\n",
        "c",
        rate=20,
        seconds=max(SECONDS - 10, 20),
    )
    capture_settings, apply_settings = pipeline.settings()
    history: list[Progress] = []
    with StatusReader(capture_settings, apply_settings) as reader:

        def c_in_lake() -> bool:
            tables = {t.table: t for t in reader.read().tables}
            a, b, new = tables.get("app.a"), tables.get("app.b"), tables.get("app.c")
            history.append(
                Progress(
                    None if new is None else new.capture_state,
                    None if new is None else new.applied_lsn,
                    None if a is None else a.applied_lsn,
                    None if b is None else b.applied_lsn,
                )
            )
            print(history[-1])
            return new is not None and new.applied_lsn is not None

        try:
            wait_for(c_in_lake, "app.c's snapshot to reach the lake", 300)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{pipeline.logs()}") from None
    # From capture's first record of app.c until its snapshot is in the lake, a and b
    # went on: their applied LSN moved.
    during = [p for p in history if p.c_state is not None and p.c_applied is None]
    assert len(during) >= 2, f"app.c's snapshot was never seen under way: {history}"
    for name, applied in (
        ("app.a", [p.a_applied for p in during]),
        ("app.b", [p.b_applied for p in during]),
    ):
        assert applied[0] is not None, f"{name}: nothing applied"
        assert applied[-1] is not None, f"{name}: nothing applied"
        assert applied[-1] > applied[0], (
            f"{name} stood still while app.c was snapshotted: {history}"
        )
    _finished(pipeline, ab, "ab", SECONDS + 120)
    _finished(pipeline, c, "c", SECONDS + 120)
    assert pipeline.capture.running(), pipeline.logs()
    assert pipeline.apply.running(), pipeline.logs()
    wait_caught_up(pipeline)
    pipeline.tables = ("app.a", "app.b", "app.c")  # what verify compares
    assert_lake_equals_source(spark, pipeline)
