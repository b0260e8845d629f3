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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from deploy.local import stack
from pipeline.status import StatusReader
from schemas.control import TableState
from schemas.lsn import Lsn, format_lsn, parse_lsn
from tests.plugins.pipeline import (
    Pipeline,
    assert_lake_equals_source,
    create_database,
    current_wal,
    slot_confirmed,
    start_pgbench,
    wait_caught_up,
    watch_schemas,
)
from tests.plugins.waiting import wait_for

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
    """Start both services and wait until the initial snapshots are in the lake.

    The slot is created at the WAL's current end, so "confirmed past the WAL written so
    far" holds the moment it exists. A message written after that gives the wait a target
    beyond the point the snapshotted tables pin, which capture confirms only once apply
    has their rows."""
    pipeline.capture.start()
    pipeline.apply.start()
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        wait_for(lambda: slot_confirmed(conn, pipeline.name) is not None, "the slot", 300)
        conn.execute("SELECT pg_logical_emit_message(false, 'cdc-test', 'started')")
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
    unchanged_round()  # in a batch after or with the changed values: both must hold
    assert_lake_equals_source(spark, pipeline)


# 2. Retained WAL ------------------------------------------------------------------------

STANDBY_SNAPSHOT_S = 15
"""The background writer logs an xl_running_xacts record every 15 s while WAL is written
(LOG_SNAPSHOT_INTERVAL_MS in PostgreSQL's bgwriter.c); restart_lsn moves only to such a
record the slot has decoded, once the confirmed position passes it."""
HIBERNATE_FACTOR = 50
"""A background writer with no buffers to clean sleeps ``bgwriter_delay`` x 50 before it
looks at the clock again (HIBERNATE_FACTOR in bgwriter.c): a workload that updates rows
already in shared buffers gives it nothing to clean, so the records come up to 15 s +
50 x bgwriter_delay apart (10 s more at the default 200 ms)."""
SAMPLE_S = 2.0
NEAR_ZERO = 1 << 20
WORKLOAD_ROUND_S = 15
WORKLOAD_LIMIT_S = 300
JUDGED = 5
"""Samples older than the retained-WAL window that the workload runs on for: ten
seconds of them, so a pinned slot (whose retained WAL only grows) shows in several."""


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

    def row(self) -> str:
        return (
            f"{self.at:5.1f} {format_lsn(self.wal):>10} {self.retained:10d} {self.unconfirmed:12d}"
        )


def _sample(conn: psycopg.Connection[tuple[Any, ...]], slot: str, start: float) -> WalSample:
    row = conn.execute(
        "SELECT pg_current_wal_lsn()::text, restart_lsn::text, confirmed_flush_lsn::text "
        "FROM pg_replication_slots WHERE slot_name = %s",
        [slot],
    ).fetchone()
    assert row is not None, f"slot {slot} is gone"
    wal, restart, confirmed = (parse_lsn(str(v)) for v in row)
    return WalSample(time.monotonic() - start, wal, restart, confirmed)


def _standby_snapshot_interval(conn: psycopg.Connection[tuple[Any, ...]]) -> float:
    """The longest time between two xl_running_xacts records of a server writing WAL."""
    row = conn.execute(
        "SELECT setting::float / 1000 FROM pg_settings WHERE name = 'bgwriter_delay'"
    ).fetchone()
    assert row is not None
    delay_s = float(row[0])
    return STANDBY_SNAPSHOT_S + (HIBERNATE_FACTOR + 1) * delay_s


def _age(samples: list[WalSample], sample: WalSample, lsn: Lsn) -> float:
    """Seconds since the WAL reached ``lsn``, as the samples up to ``sample`` tell it (an
    upper bound: the first sample at or past it)."""
    reached = next((s for s in samples if s.wal >= lsn), sample)
    return sample.at - reached.at + SAMPLE_S


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
    script = (
        "\\set id random(1, 100)\n"
        "UPDATE public.busy SET n = n + 1, payload = repeat(md5(random()::text), 48) "
        "WHERE id = :id;\n"
    )
    samples: list[WalSample] = []
    start = time.monotonic()
    print("   at        wal   retained  unconfirmed")
    with psycopg.connect(dsn, autocommit=True) as conn:
        interval = _standby_snapshot_interval(conn)

        def window_s() -> float:
            # restart_lsn takes a candidate xl_running_xacts only when the previous one is
            # confirmed: a candidate is decoded up to lag + the records' interval after the
            # last one was taken and is itself taken one lag later, so the slot retains at
            # most the WAL written in 2 x lag + that interval (ReplicationSlot
            # candidate_restart_* in logical.c). The lag is this run's, measured.
            lags = [_age(samples[: i + 1], s, s.confirmed) for i, s in enumerate(samples)]
            return 2 * max(lags) + interval + SAMPLE_S

        def judged() -> int:
            window = window_s()
            return sum(_written_within(samples, s, window) is not None for s in samples)

        # The workload runs in rounds until the samples older than the window are enough
        # to judge (at least SECONDS, at most WORKLOAD_LIMIT_S): a loaded machine's longer
        # lag widens the window, and the run grows with it instead of failing.
        while True:
            bench = _pgbench(pipeline, script, "busy", rate=40, seconds=WORKLOAD_ROUND_S)
            while bench.poll() is None:
                samples.append(_sample(conn, pipeline.name, start))
                print(samples[-1].row())
                time.sleep(SAMPLE_S)
            _finished(pipeline, bench, "busy", 30)
            elapsed = samples[-1].at
            if elapsed >= WORKLOAD_LIMIT_S or (elapsed >= SECONDS and judged() >= JUDGED):
                break
        written = samples[-1].wal - samples[0].wal
        print(f"written during the workload: {written} bytes in {samples[-1].at:.1f} s")
        assert pipeline.capture.running(), pipeline.logs()
        assert pipeline.apply.running(), pipeline.logs()

        # confirmed_flush_lsn follows the WAL while the workload runs: it passes the WAL
        # of the workload's start before the workload ends. A slot pinned by the idle
        # table stands still for the whole run. (How far it trails is the pipeline's
        # latency on this machine at this moment: printed, never asserted.)
        lags = [_age(samples[: i + 1], s, s.confirmed) for i, s in enumerate(samples)]
        print(f"age of the confirmed WAL: {max(lags):.1f} s at most")
        assert samples[-1].confirmed > samples[0].wal, f"confirmed_flush_lsn stood still: {lags}"
        window = window_s()
        judged_now = 0
        for s in samples:
            bound = _written_within(samples, s, window)
            if bound is not None:
                assert s.retained <= bound, f"retains more than {window:.0f} s of WAL: {s}"
                judged_now += 1
        # A pinned slot retains everything written since the start: more than the last
        # window's share once the run is longer than the window.
        assert judged_now >= 1, f"the run was shorter than the {window:.0f} s window"
        assert written > 2 * NEAR_ZERO, "the workload wrote too little WAL to tell a pinned slot"

        # After the workload the slot lets go of its WAL only at the next xl_running_xacts
        # it decodes and then sees confirmed. The last record the workload left may have
        # been decoded while an earlier candidate still waited for its confirmation, and
        # such a record is dropped, not queued (LogicalIncreaseRestartDecodingForSlot in
        # logical.c); on a server with no other writes the background writer then logs
        # no further one (it does only after new WAL), and restart_lsn stays a window
        # behind for good. That is PostgreSQL's bound, not a pin. A trickle of writes, as
        # any live database has, makes the records that let it move on.
        trickled = [0.0]

        def released() -> bool:
            now = time.monotonic()
            if now - trickled[0] >= SAMPLE_S:
                conn.execute("UPDATE public.busy SET n = n + 1 WHERE id = 1")
                trickled[0] = now
            s = _sample(conn, pipeline.name, start)
            print(s.row())
            return s.retained < NEAR_ZERO

        wait_for(
            released,
            "the retained WAL to drop below 1 MiB after the workload, under a trickle",
            120,
        )
    wait_caught_up(pipeline)
    assert_lake_equals_source(spark, pipeline)


# 3. A table added while streaming -------------------------------------------------------


OFFSETS_PER_TRIGGER = 4000
"""Apply's batches are bounded (``APPLY_KAFKA__MAX_OFFSETS_PER_TRIGGER``), so the new
table's snapshot rows are applied over several batches, each carrying the other tables'
changes too. Unbounded, one batch takes the whole snapshot and every table waits for it
(docs/e2e-scenarios.md)."""


@dataclass(frozen=True, slots=True)
class Progress:
    c_state: TableState | None
    c_applied: Lsn | None
    a_applied: Lsn | None
    b_applied: Lsn | None


def _progress(reader: StatusReader) -> Progress:
    tables = {t.table: t for t in reader.read().tables}
    a, b, c = tables.get("app.a"), tables.get("app.b"), tables.get("app.c")
    return Progress(
        None if c is None else c.capture_state,
        None if c is None else c.applied_lsn,
        None if a is None else a.applied_lsn,
        None if b is None else b.applied_lsn,
    )


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
    pipeline.apply.env["APPLY_KAFKA__MAX_OFFSETS_PER_TRIGGER"] = str(OFFSETS_PER_TRIGGER)
    _started(pipeline)
    ab = _pgbench(
        pipeline,
        "\\set id random(1, 1000)\n"
        "UPDATE app.a SET n = n + 1 WHERE id = :id;\n"
        "UPDATE app.b SET n = n + 1 WHERE id = :id;\n",
        "ab",
        rate=20,
        seconds=max(SECONDS, 60),
    )
    capture_settings, apply_settings = pipeline.settings()
    history: list[Progress] = []
    with StatusReader(capture_settings, apply_settings) as reader:

        def streamed(done: Callable[[Progress], bool]) -> Callable[[], bool]:
            def check() -> bool:
                history.append(_progress(reader))
                print(history[-1])
                return done(history[-1])

            return check

        # a's and b's changes reach the lake before app.c exists.
        with psycopg.connect(dsn, autocommit=True) as conn:
            written = current_wal(conn)
        wait_for(
            streamed(
                lambda p: all(x is not None and x > written for x in (p.a_applied, p.b_applied))
            ),
            "app.a's and app.b's changes in the lake",
            300,
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE app.c (id int PRIMARY KEY, n int NOT NULL, pad text)")
            # Several apply batches' worth of snapshot rows.
            conn.execute(
                "INSERT INTO app.c SELECT i, 0, md5(i::text) FROM generate_series(1, 12000) i"
            )
        c = _pgbench(
            pipeline,
            "\\set id random(1, 24000)\n"
            "INSERT INTO app.c VALUES (:id, 0, md5(random()::text)) "
            "ON CONFLICT (id) DO UPDATE SET n = app.c.n + 1;\n",
            "c",
            rate=20,
            seconds=max(SECONDS - 20, 30),
        )
        before = len(history)
        try:
            wait_for(
                streamed(lambda p: p.c_state is TableState.STREAMING),
                "app.c's snapshot to be published",
                300,
            )
            # A change of app.c newer than this is applied after every snapshot row.
            with psycopg.connect(dsn, autocommit=True) as conn:
                published = current_wal(conn)
            wait_for(
                streamed(lambda p: p.c_applied is not None and p.c_applied > published),
                "app.c's snapshot and a change after it in the lake",
                300,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{pipeline.logs()}") from None
    # Between capture's first record of app.c and the first of its streamed changes in
    # the lake, a and b went on: their applied LSN moved before app.c's snapshot was all
    # applied (the last read, where app.c is done, does not count).
    during = [p for p in history[before:-1] if p.c_state is not None]
    assert len(during) >= 2, f"app.c's snapshot was never seen under way: {history}"
    for name, applied in (
        ("app.a", [p.a_applied for p in during]),
        ("app.b", [p.b_applied for p in during]),
    ):
        assert applied[0] is not None, f"{name}: nothing applied"
        assert applied[-1] is not None, f"{name}: nothing applied"
        assert applied[-1] > applied[0], f"{name} stood still during app.c's snapshot: {history}"
    _finished(pipeline, ab, "ab", SECONDS + 120)
    _finished(pipeline, c, "c", SECONDS + 120)
    assert pipeline.capture.running(), pipeline.logs()
    assert pipeline.apply.running(), pipeline.logs()
    wait_caught_up(pipeline)
    pipeline.tables = ("app.a", "app.b", "app.c")  # what verify compares
    assert_lake_equals_source(spark, pipeline)
