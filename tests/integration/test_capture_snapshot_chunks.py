"""Chunked, parallel snapshots against the real PostgreSQL and Kafka.

With two worker processes and chunks of a few hundred rows, so every table of a few
thousand rows is many chunks:

- tables keyed by an int (under concurrent inserts, updates and deletes), a composite
  text and int key, a uuid, a very skewed bigint key range, and an empty table, all in
  one run: each topic replays to its source table, every partition's positions strictly
  increase (snapshot rows, then the streamed changes), and the rows carry the ordinals
  of several chunks;
- a capture stopped while its snapshot's workers are reading leaves no worker process,
  and no COPY of theirs, behind; so does a worker's lost connection, which fails the
  capture attempt with a transient error; and a capture process killed with SIGKILL
  takes its workers with it.
- the workers write the record headers the run's framer gave (a registry's ids), and a
  table's ``TableCopied`` follows its last record;
- a value the contract cannot carry, read by a worker, fails its table only.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from capture import admin
from capture.errors import TransientError
from capture.rows.describe import describe_columns
from capture.settings import CaptureSettings
from capture.snapshot.chunks import CHUNK_ORDINALS
from capture.snapshot.run import (
    RunFailed,
    RunFinished,
    SnapshotItem,
    SnapshotRecords,
    SnapshotRun,
    TableCopied,
    TableFailed,
)
from schemas.change_record import RecordFraming, TableSchemas
from schemas.control import TableState
from schemas.reader import ContractReader
from tests.plugins.capture import (
    CaptureThread,
    capture_settings,
    confirmed_lsn,
    current_lsn,
    slot_active,
)
from tests.plugins.services import Services
from tests.plugins.topics import (
    assert_positions_increase,
    read_to_end,
    record_count,
    replay,
    report_applied,
    schema_reader,
)
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]

TABLES = {
    # table: (columns, key columns)
    "t": ("id, n, note", "id"),
    "composite": ("region, id, v", "region, id"),
    "uuidkey": ("id, v", "id"),
    "skewed": ("id, v", "id"),
    "empty": ("id", "id"),
}


def _state(settings: CaptureSettings, table: str) -> TableState | None:
    statuses = {s.table: s for s in admin.table_statuses(settings)}
    status = statuses.get(table)
    return None if status is None else status.state


def _chunked(settings: CaptureSettings, **update: Any) -> CaptureSettings:
    return settings.model_copy(update={"snapshot_workers": 2, "snapshot_chunk_rows": 300, **update})


def _as_text(row: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in row)


def _source(pg: Connection, schema: str, table: str) -> set[tuple[str, ...]]:
    columns, _ = TABLES[table]
    rows = pg.execute(
        sql.SQL("SELECT {} FROM {}").format(sql.SQL(columns), sql.Identifier(schema, table))
    ).fetchall()
    return {_as_text(r) for r in rows}


def _lake(reader: ContractReader, messages: list[Any], topic: str, table: str) -> set[Any]:
    columns = [c.strip() for c in TABLES[table][0].split(",")]
    rows = replay(reader, messages).get(topic, {})
    return {_as_text(r[c] for c in columns) for r in rows.values()}


def _load(pg: Connection, name: str) -> None:
    schema = sql.Identifier(name)
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
    pg.execute(
        sql.SQL(
            "CREATE TABLE {s}.t (id int PRIMARY KEY, n int, note text);"
            "INSERT INTO {s}.t SELECT g, 0, CASE g % 3 WHEN 0 THEN NULL "
            "  WHEN 1 THEN E'tab\\there' ELSE 'plain' END FROM generate_series(1, 5000) g;"
            "CREATE TABLE {s}.composite (region text, id int, v text, PRIMARY KEY (region, id));"
            "INSERT INTO {s}.composite SELECT 'r' || (g % 7), g, repeat('v', g % 50) "
            "  FROM generate_series(1, 3000) g;"
            "CREATE TABLE {s}.uuidkey (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), v int);"
            "INSERT INTO {s}.uuidkey (v) SELECT g FROM generate_series(1, 3000) g;"
            "CREATE TABLE {s}.skewed (id bigint PRIMARY KEY, v int);"
            "INSERT INTO {s}.skewed SELECT g, g % 10 FROM generate_series(1, 1000) g;"
            "INSERT INTO {s}.skewed SELECT 1000000000000 + g, g % 10 "
            "  FROM generate_series(0, 1000) g;"
            "CREATE TABLE {s}.empty (id int PRIMARY KEY);"
            # Analyzed tables are chunked by their density, the others by the assumed one.
            "ANALYZE {s}.t; ANALYZE {s}.skewed;"
        ).format(s=schema)
    )


def test_chunked_parallel_snapshot_of_many_key_kinds_equals_the_source(
    services: Services, pg: Connection, unique_name: str
) -> None:
    name = unique_name
    _load(pg, name)
    t, composite = sql.Identifier(name, "t"), sql.Identifier(name, "composite")
    stop_writing = threading.Event()
    written = threading.Event()

    def write() -> None:
        rng = random.Random(11)
        next_id = 5001
        with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
            while not stop_writing.is_set():
                key = rng.randint(1, 5000)
                conn.execute(sql.SQL("UPDATE {} SET n = n + 1 WHERE id = %s").format(t), [key])
                if key % 5 == 0:
                    conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(t), [key])
                    conn.execute(
                        sql.SQL("INSERT INTO {} VALUES (%s, 1, 'new')").format(t), [next_id]
                    )
                    next_id += 1
                conn.execute(
                    sql.SQL("UPDATE {} SET v = v || 'u' WHERE region = %s AND id = %s").format(
                        composite
                    ),
                    [f"r{key % 7}", key % 3000],
                )
                if key % 11 == 0:
                    conn.execute(
                        sql.SQL("DELETE FROM {} WHERE region = %s AND id = %s").format(composite),
                        [f"r{key % 7}", key % 3000],
                    )
                written.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    written.wait(30)
    tables = [f"{name}.{table}" for table in TABLES]
    settings = _chunked(capture_settings(services, name, tables, snapshot_mode="initial"))
    runner = CaptureThread(settings)
    bootstrap = services.kafka_bootstrap_servers
    topics = {table: f"{name}.{name}.{table}" for table in TABLES}
    try:
        runner.start(pg)
        wait_for(
            lambda: all(_state(settings, table) is TableState.STREAMING for table in tables),
            "the tables never all reached streaming",
            120,
        )
        stop_writing.set()
        writer.join(10)
        reader = schema_reader(bootstrap, settings.kafka.schema_topic, len(TABLES))

        for table in TABLES:
            if table == "empty":  # no record: the topic may not even exist
                continue

            def caught_up(table: str = table) -> bool:
                messages = read_to_end(bootstrap, topics[table])
                return _lake(reader, messages, topics[table], table) == _source(pg, name, table)

            wait_for(caught_up, f"{table} never equalled its source", 120)
        runner.join()
        assert not runner.errors, runner.errors

        (status,) = [s for s in admin.table_statuses(settings) if s.table == f"{name}.t"]
        for table in TABLES:
            if table == "empty":
                continue
            messages = read_to_end(bootstrap, topics[table])
            assert_positions_increase(reader, messages)
            values = [reader.decode_value(m.value()) for m in messages]
            reads = [v for v in values if v["op"] == "READ"]
            assert not [v for v in values if v["op"] == "TRUNCATE"], "a first snapshot"
            ordinals = [v["ordinal"] for v in reads]
            assert len(set(ordinals)) == len(ordinals), f"{table}: ordinals are unique"
            chunks = {o // CHUNK_ORDINALS for o in ordinals}
            assert len(chunks) > 2, f"{table} was read in several chunks, not {chunks}"
            assert all(o % CHUNK_ORDINALS > 0 for o in ordinals)
        reads_t = [
            reader.decode_value(m.value())
            for m in read_to_end(bootstrap, topics["t"])
            if reader.decode_value(m.value())["op"] == "READ"
        ]
        assert {v["commit_lsn"] for v in reads_t} == {status.snapshot_lsn}
        assert _state(settings, f"{name}.empty") is TableState.STREAMING
    finally:
        stop_writing.set()
        runner.close(pg)


def _workers() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("snapshot-worker")]


def _stalled_snapshot(services: Services, pg: Connection, name: str) -> tuple[CaptureSettings, str]:
    """A 60,000-row table and settings under which its snapshot stalls: paced by the lake,
    where nothing applies the records, the snapshot stops at the in-flight bound with its
    workers busy, and whatever stops it finds them in the middle of their chunks."""
    big = sql.Identifier(name, "big")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(big))
    pg.execute(
        sql.SQL("INSERT INTO {} SELECT g, repeat('x', 50) FROM generate_series(1, 60000) g").format(
            big
        )
    )
    settings = _chunked(
        capture_settings(services, name, [f"{name}.big"], snapshot_mode="initial"),
        snapshot_chunk_rows=2000,
        max_in_flight_records=3000,
        snapshot_pace="lake",
    )
    return settings, f"{name}.{name}.big"


def _copies(pg: Connection, name: str) -> int:
    """COPY statements of the test's tables running on the server."""
    row = pg.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
        [f"COPY%{name}%"],
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def test_a_capture_stopped_mid_snapshot_leaves_no_worker_behind(
    services: Services, pg: Connection, unique_name: str
) -> None:
    name = unique_name
    settings, topic = _stalled_snapshot(services, pg, name)
    assert not _workers(), "no worker of an earlier test is left"
    runner = CaptureThread(settings)
    try:
        runner.start(pg)
        wait_for(lambda: len(_workers()) == 2, "the snapshot never started its two workers", 120)
        pids = [p.pid for p in _workers()]
        wait_for(
            lambda: record_count(services.kafka_bootstrap_servers, topic) > 0,
            "the workers never published a row",
            120,
        )
        assert _state(settings, f"{name}.big") is TableState.SNAPSHOT
        runner.join()
        assert not runner.errors, runner.errors
        assert runner.thread is not None
        assert not runner.thread.is_alive()
        assert not _workers(), "every worker ended with the capture"
        assert all(not Path(f"/proc/{pid}").exists() for pid in pids), "and was reaped"
        wait_for(lambda: _copies(pg, name) == 0, "a worker's COPY outlived it on the server", 30)
    finally:
        runner.close(pg)


def test_paced_by_kafka_a_snapshot_bigger_than_the_bound_ends_with_nothing_applied(
    services: Services, pg: Connection, unique_name: str
) -> None:
    """The default pace: the 60,000-row snapshot goes past its in-flight bound of 3,000
    rows to its end although nothing applies them (they wait in Kafka, not behind the
    source's exported snapshot), and the slot still waits until the lake has them."""
    name = unique_name
    settings, topic = _stalled_snapshot(services, pg, name)
    settings = settings.model_copy(update={"snapshot_pace": "kafka"})
    bootstrap, slot = services.kafka_bootstrap_servers, settings.postgres.slot
    runner = CaptureThread(settings)
    try:
        runner.start(pg)
        start = confirmed_lsn(pg, slot)
        wait_for(
            lambda: _state(settings, f"{name}.big") is TableState.STREAMING,
            "the snapshot stopped at the in-flight bound",
            120,
        )
        assert record_count(bootstrap, topic) == 60_000
        pg.execute(
            sql.SQL("INSERT INTO {} VALUES (60001, 'new')").format(sql.Identifier(name, "big"))
        )
        written = current_lsn(pg)
        wait_for(
            lambda: record_count(bootstrap, topic) == 60_001,
            "the streamed insert never arrived",
            120,
        )
        time.sleep(2 * settings.status_interval_s)
        assert not runner.errors, runner.errors
        assert confirmed_lsn(pg, slot) == start, "nothing is applied: the slot waits"

        def confirmed_once_applied() -> bool:
            report_applied(bootstrap, settings.kafka.control_topic, read_to_end(bootstrap, topic))
            return confirmed_lsn(pg, slot) >= written

        wait_for(confirmed_once_applied, "applied, the slot never moved past the insert", 60)
        assert not runner.errors, runner.errors
    finally:
        runner.close(pg)


def test_a_lost_worker_connection_fails_the_attempt_and_stops_every_worker(
    services: Services, pg: Connection, unique_name: str
) -> None:
    name = unique_name
    settings, topic = _stalled_snapshot(services, pg, name)
    bootstrap = services.kafka_bootstrap_servers
    runner = CaptureThread(settings)
    try:
        runner.start(pg)
        wait_for(lambda: len(_workers()) == 2, "the snapshot never started its two workers", 120)
        wait_for(
            lambda: record_count(bootstrap, topic) > 0, "the workers never published a row", 120
        )
        row = pg.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE query LIKE %s AND pid <> pg_backend_pid()",
            [f"COPY%{name}%"],
        ).fetchone()
        assert row is not None
        assert int(str(row[0])) >= 1, "a worker's COPY was running"

        def attempt_failed() -> bool:
            # Applied, as apply would report it: the snapshot goes on, and a worker reads
            # from its lost connection.
            if not runner.errors:
                report_applied(
                    bootstrap, settings.kafka.control_topic, read_to_end(bootstrap, topic)
                )
            return bool(runner.errors)

        wait_for(attempt_failed, "the lost connection never failed the attempt", 120)
        assert runner.thread is not None
        runner.thread.join(30)
        assert not runner.thread.is_alive()
        (error,) = runner.errors
        assert isinstance(error, TransientError), error
        assert "snapshot worker lost PostgreSQL" in str(error)
        assert not _workers(), "every worker ended with the failed attempt"
        wait_for(lambda: _copies(pg, name) == 0, "a worker's COPY outlived it on the server", 30)
    finally:
        runner.close(pg)


def _descendants(pid: int) -> dict[int, str]:
    """Live processes whose parent is ``pid``: their command lines."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile
        # Fields after the command name, which is in parentheses and may hold spaces.
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found[int(entry.name)] = cmdline
    return found


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":  # a zombie runs nothing: only its exit status is left to reap
            alive.append(pid)
    return alive


_RUN_CAPTURE = """
import sys, threading
from capture.service import CaptureService
from capture.settings import CaptureSettings
CaptureService(CaptureSettings.model_validate_json(sys.argv[1]), threading.Event()).run()
"""


def test_a_killed_capture_takes_its_workers_with_it(
    services: Services, pg: Connection, unique_name: str
) -> None:
    name = unique_name
    settings, topic = _stalled_snapshot(services, pg, name)
    repo = Path(__file__).resolve().parents[2]
    capture = subprocess.Popen(
        [sys.executable, "-c", _RUN_CAPTURE, settings.model_dump_json()],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    try:
        wait_for(
            lambda: sum("spawn_main" in c for c in _descendants(capture.pid).values()) == 2,
            "the snapshot never started its two workers",
            120,
        )
        wait_for(
            lambda: record_count(services.kafka_bootstrap_servers, topic) > 0,
            "the workers never published a row",
            120,
        )
        children = list(_descendants(capture.pid))
        capture.send_signal(signal.SIGKILL)
        capture.wait(30)
        wait_for(lambda: not _alive(children), "a worker outlived the killed capture", 60)
        wait_for(lambda: _copies(pg, name) == 0, "a worker's COPY outlived it on the server", 30)
    finally:
        if capture.poll() is None:
            capture.kill()
            capture.wait(30)
        slot = settings.postgres.slot
        wait_for(lambda: not slot_active(pg, slot), "the slot stayed active", 30)
        pg.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            [slot],
        )


def test_workers_frame_records_as_the_run_framed_them_and_copied_comes_last(
    services: Services, pg: Connection, unique_name: str
) -> None:
    """The framer (a registry's, in production) is asked once per table, by the run;
    the workers write the headers it gave. A table's ``TableCopied`` follows its last
    record, and a table's batches arrive in position order."""
    name = unique_name
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    for table, rows in (("a", 4000), ("b", 1500)):
        pg.execute(
            sql.SQL(
                "CREATE TABLE {t} (id int PRIMARY KEY, v text);"
                "INSERT INTO {t} SELECT g, md5(g::text) FROM generate_series(1, {n}) g"
            ).format(t=sql.Identifier(name, table), n=sql.Literal(rows))
        )
    asked: list[str] = []

    def framer(schemas: TableSchemas, topic: str) -> RecordFraming:
        asked.append(topic)
        return RecordFraming(key=b"\x00KEY!", value=b"\x00VAL!", table_key=b"\x00TBL!")

    run = SnapshotRun(
        dsn=services.postgres_dsn,
        password=None,
        slot=name,
        tables=[f"{name}.a", f"{name}.b"],
        truncate=[f"{name}.b"],
        describe=describe_columns,
        topic_prefix=name,
        framer=framer,
        workers=2,
        chunk_rows=250,
        # One item at a time: the run waits for each get, so its workers (stopped after
        # its last record) are surely there when the first item is taken.
        queue_size=1,
    )
    run.start()
    items: list[SnapshotItem] = []
    workers_seen = 0
    try:
        deadline = time.monotonic() + 120
        while not items or not isinstance(items[-1], RunFinished | RunFailed):
            assert time.monotonic() < deadline, "the run never finished"
            with contextlib.suppress(queue.Empty):
                items.append(run.items.get(timeout=1))
                workers_seen = max(workers_seen, len(_workers()))
    finally:
        run.cancel()
    assert workers_seen == 2, "the chunks were read by two worker processes"
    assert not [i for i in items if isinstance(i, RunFailed | TableFailed)], items
    assert isinstance(items[-1], RunFinished)
    assert sorted(asked) == [f"{name}.{name}.a", f"{name}.{name}.b"], "once per table"
    for table, rows in ((f"{name}.a", 4000), (f"{name}.b", 1500)):
        batches = [i for i in items if isinstance(i, SnapshotRecords) and i.table == table]
        records = [r for b in batches for r in b.records]
        (copied,) = [
            n for n, i in enumerate(items) if isinstance(i, TableCopied) and i.table == table
        ]
        last_batch = max(n for n, i in enumerate(items) if i in batches)
        assert last_batch < copied, "TableCopied after the table's last record"
        item = items[copied]
        assert isinstance(item, TableCopied)
        assert item.rows == rows
        reads = [r for r in records if not r.key.startswith(b"\x00TBL!")]
        assert len(reads) == rows
        assert all(r.key.startswith(b"\x00KEY!") for r in reads)
        assert all(r.value is not None and r.value.startswith(b"\x00VAL!") for r in records)
        truncates = [r for r in records if r.key.startswith(b"\x00TBL!")]
        assert len(truncates) == (1 if table.endswith(".b") else 0)
        if truncates:
            assert records[0] is truncates[0], "the TRUNCATE comes first"
    assert not _workers(), "the finished run's workers ended"


def test_a_value_the_contract_cannot_carry_fails_its_table_only(
    services: Services, pg: Connection, unique_name: str
) -> None:
    """NaN has no Avro decimal: the chunk holding it fails its table, whose other chunks
    are skipped, while the other table of the run is read in full."""
    name = unique_name
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    bad, good = sql.Identifier(name, "bad"), sql.Identifier(name, "good")
    pg.execute(
        sql.SQL(
            "CREATE TABLE {bad} (id int PRIMARY KEY, amount numeric(6,2));"
            "INSERT INTO {bad} SELECT g, g / 4.0 FROM generate_series(1, 3000) g;"
            "UPDATE {bad} SET amount = 'NaN' WHERE id = 2500;"
            "CREATE TABLE {good} (id int PRIMARY KEY, v text);"
            "INSERT INTO {good} SELECT g, 'v' || g FROM generate_series(1, 3000) g;"
        ).format(bad=bad, good=good)
    )
    run = SnapshotRun(
        dsn=services.postgres_dsn,
        password=None,
        slot=name,
        tables=[f"{name}.bad", f"{name}.good"],
        truncate=[],
        describe=describe_columns,
        topic_prefix=name,
        workers=2,
        chunk_rows=250,
    )
    run.start()
    items: list[SnapshotItem] = []
    try:
        deadline = time.monotonic() + 120
        while not items or not isinstance(items[-1], RunFinished | RunFailed):
            assert time.monotonic() < deadline, "the run never finished"
            with contextlib.suppress(queue.Empty):
                items.append(run.items.get(timeout=1))
    finally:
        run.cancel()
    assert isinstance(items[-1], RunFinished), items[-1]
    failed = [i for i in items if isinstance(i, TableFailed)]
    assert [f.error.table for f in failed] == [f"{name}.bad"]
    assert "NaN" in str(failed[0].error)
    copied = {i.table: i.rows for i in items if isinstance(i, TableCopied)}
    assert copied == {f"{name}.good": 3000}
    good_rows = [
        r
        for i in items
        if isinstance(i, SnapshotRecords) and i.table == f"{name}.good"
        for r in i.records
    ]
    assert len(good_rows) == 3000
    assert not _workers()
