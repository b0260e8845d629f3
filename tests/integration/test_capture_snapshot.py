"""Snapshots against the real PostgreSQL and Kafka.

- A table with rows is snapshotted at first start while writers keep changing it; the
  topic replays to the source table, and per key no record is older than one before it
  in the partition (no snapshot row after a newer change).
- The slot waits for the snapshot to be applied, also while the source is idle.
- A table added to a running setup is snapshotted while the others keep streaming; a
  table that errors is visible as errored, the others go on; after the fix, a resync
  re-snapshots it starting with a TRUNCATE, and the topic replays to the source again.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from capture import admin
from capture.settings import CaptureSettings
from schemas.control import TableState
from schemas.reader import ContractReader
from tests.plugins.capture import CaptureThread, capture_settings, confirmed_lsn, current_lsn
from tests.plugins.services import Services
from tests.plugins.topics import (
    read_to_end,
    record_count,
    replay,
    report_applied,
    schema_reader,
)
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]


def _state(settings: CaptureSettings, table: str) -> TableState | None:
    statuses = {s.table: s for s in admin.table_statuses(settings)}
    status = statuses.get(table)
    return None if status is None else status.state


def _assert_per_key_order(reader: ContractReader, messages: list[Any]) -> None:
    """Within a partition, each key's positions only grow: nothing older follows newer."""
    last: dict[tuple[int, bytes], tuple[int, int]] = {}
    for m in messages:
        if m.value() is None:
            continue
        value = reader.decode_value(m.value())
        position = (value["commit_lsn"], value["ordinal"])
        slot = (m.partition(), m.key())
        assert slot not in last or last[slot] < position, (
            f"partition {m.partition()}: {value['op']} at {position} after {last[slot]}"
        )
        last[slot] = position


def _source_rows(pg: Connection, table: sql.Composable, columns: str) -> dict[Any, Any]:
    rows = pg.execute(sql.SQL("SELECT {} FROM {}").format(sql.SQL(columns), table)).fetchall()
    return {r[0]: r for r in rows}


def test_snapshot_under_concurrent_writes_keeps_per_key_order(
    services: Services, pg: Connection, unique_name: str
) -> None:
    schema = sql.Identifier(unique_name)
    table = sql.Identifier(unique_name, "t")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, n int, note text)").format(table))
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, 0, CASE g % 4 WHEN 0 THEN NULL WHEN 1 THEN E'tab\\there' "
            "WHEN 2 THEN E'line\\nbreak \\\\ slash' ELSE 'plain' END "
            "FROM generate_series(1, 5000) g"
        ).format(table)
    )
    stop_writing = threading.Event()

    def write() -> None:
        rng = random.Random(7)
        next_id = 5001
        with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
            while not stop_writing.is_set():
                key = rng.randint(1, 5000)
                conn.execute(sql.SQL("UPDATE {} SET n = n + 1 WHERE id = %s").format(table), [key])
                if key % 5 == 0:
                    conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(table), [key])
                    conn.execute(
                        sql.SQL("INSERT INTO {} VALUES (%s, 1, 'new')").format(table), [next_id]
                    )
                    next_id += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    settings = capture_settings(
        services, unique_name, [f"{unique_name}.t"], snapshot_mode="initial"
    )
    runner = CaptureThread(settings)
    try:
        runner.start(pg)
        wait_for(
            lambda: _state(settings, f"{unique_name}.t") is TableState.STREAMING,
            "the table never reached streaming",
            90,
        )
        time.sleep(1.0)  # changes made after the catch-up stream straight through
        stop_writing.set()
        writer.join(10)
        marker_end = current_lsn(pg)
        time.sleep(1.0)
        runner.join()
        assert not runner.errors, runner.errors

        topic = f"{unique_name}.{unique_name}.t"
        messages = read_to_end(services.kafka_bootstrap_servers, topic)
        reader = schema_reader(services.kafka_bootstrap_servers, settings.kafka.schema_topic, 2)
        values = [reader.decode_value(m.value()) for m in messages]
        reads = [v for v in values if v["op"] == "READ"]
        assert len(reads) >= 5000, "every row of the snapshot is published"
        assert not [v for v in values if v["op"] == "TRUNCATE"], (
            "a first snapshot truncates nothing"
        )
        (status,) = [s for s in admin.table_statuses(settings) if s.table == f"{unique_name}.t"]
        assert status.snapshot_lsn is not None
        assert {v["commit_lsn"] for v in reads} == {status.snapshot_lsn}
        assert all(v["commit_lsn"] > status.snapshot_lsn for v in values if v["op"] != "READ")
        assert any(v["op"] == "UPDATE" for v in values), "changes during the run streamed too"
        _assert_per_key_order(reader, messages)

        lake = replay(reader, messages)[topic]
        source = _source_rows(pg, table, "id, n, note")
        assert {k[0][1]: (r["id"], r["n"], r["note"]) for k, r in lake.items()} == source

        # The slot waits for the snapshot rows too: nothing is applied, so it has not
        # moved past where the table was pinned, however much WAL went by.
        start_lsn = min(v["commit_lsn"] for v in values)
        assert confirmed_lsn(pg, unique_name) <= start_lsn
        assert confirmed_lsn(pg, unique_name) < marker_end
    finally:
        stop_writing.set()
        runner.close(pg)


def test_added_table_errored_table_and_resync(
    services: Services, pg: Connection, unique_name: str
) -> None:
    name = unique_name
    a, b = sql.Identifier(name, "a"), sql.Identifier(name, "b")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int)").format(a))
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, amount numeric(6,2))").format(b))
    pg.execute(sql.SQL("CREATE TABLE {}.quiet (id int PRIMARY KEY)").format(sql.Identifier(name)))
    pg.execute(sql.SQL("INSERT INTO {} SELECT g, g FROM generate_series(1, 50) g").format(a))
    pg.execute(sql.SQL("INSERT INTO {} SELECT g, g / 4.0 FROM generate_series(1, 80) g").format(b))
    topic_a, topic_b = f"{name}.{name}.a", f"{name}.{name}.b"
    bootstrap = services.kafka_bootstrap_servers
    only_a = capture_settings(services, name, [f"{name}.a"], snapshot_mode="initial")
    both = capture_settings(services, name, [f"{name}.a", f"{name}.b"], snapshot_mode="initial")
    runner = CaptureThread(only_a)
    try:
        # 1. Only a: snapshotted, then streaming. The slot waits for its snapshot rows
        #    to be applied even while the database is idle, then follows.
        runner.start(pg)
        wait_for(
            lambda: _state(only_a, f"{name}.a") is TableState.STREAMING, "a never streamed", 90
        )
        pg.execute(sql.SQL("INSERT INTO {}.quiet VALUES (1)").format(sql.Identifier(name)))
        idle_end = current_lsn(pg)
        time.sleep(1.5)
        snapshot_a = read_to_end(bootstrap, topic_a)
        assert len(snapshot_a) == 50
        assert confirmed_lsn(pg, name) < idle_end, "unapplied snapshot rows must pin the slot"
        report_applied(bootstrap, only_a.kafka.control_topic, snapshot_a)
        wait_for(
            lambda: confirmed_lsn(pg, name) >= idle_end, "the slot never followed once applied", 90
        )
        runner.join()

        # 2. b is added: snapshotted while a streams; then b errors (NaN in a
        #    numeric(6,2) column has no Avro decimal) and a keeps streaming.
        runner = CaptureThread(both)
        runner.start(pg)
        pg.execute(sql.SQL("UPDATE {} SET v = -v WHERE id <= 10").format(a))
        pg.execute(sql.SQL("UPDATE {} SET amount = amount + 1 WHERE id <= 10").format(b))
        wait_for(lambda: _state(both, f"{name}.b") is TableState.STREAMING, "b never streamed", 90)
        pg.execute(sql.SQL("UPDATE {} SET amount = 'NaN' WHERE id = 80").format(b))
        pg.execute(sql.SQL("INSERT INTO {} VALUES (1000, 1000)").format(a))
        wait_for(lambda: _state(both, f"{name}.b") is TableState.ERRORED, "b never errored", 90)
        (status_b,) = [s for s in admin.table_statuses(both) if s.table == f"{name}.b"]
        assert status_b.message is not None
        assert "NaN" in status_b.message
        wait_for(
            lambda: (
                any(m.value() is not None for m in read_to_end(bootstrap, topic_a)[50:])
                and len(read_to_end(bootstrap, topic_a)) >= 50 + 10 + 1
            ),
            "a stopped streaming when b errored",
            90,
        )
        runner.join()
        assert not runner.errors, runner.errors

        # 3. Fix, resync, restart: b starts over with a TRUNCATE and a new snapshot.
        pg.execute(sql.SQL("UPDATE {} SET amount = 1 WHERE id = 80").format(b))
        admin.request_resync(both, [f"{name}.b"])
        assert _state(both, f"{name}.b") is TableState.PENDING
        runner = CaptureThread(both)
        runner.start(pg)
        pg.execute(sql.SQL("DELETE FROM {} WHERE id = 1").format(b))
        wait_for(
            lambda: _state(both, f"{name}.b") is TableState.STREAMING, "b never streamed again", 90
        )
        time.sleep(1.0)
        runner.join()
        assert not runner.errors, runner.errors

        reader = schema_reader(bootstrap, both.kafka.schema_topic, 4)
        messages_b = read_to_end(bootstrap, topic_b)
        ops_b = [reader.decode_value(m.value())["op"] for m in messages_b]
        assert "TRUNCATE" in ops_b, "a resync starts with a TRUNCATE"
        messages_a = read_to_end(bootstrap, topic_a)
        lake = replay(reader, messages_a + messages_b)
        assert {k[0][1]: (r["id"], r["v"]) for k, r in lake[topic_a].items()} == _source_rows(
            pg, a, "id, v"
        )
        assert {k[0][1]: (r["id"], r["amount"]) for k, r in lake[topic_b].items()} == _source_rows(
            pg, b, "id, amount"
        )
    finally:
        runner.close(pg)


def test_a_table_created_in_a_captured_schema_joins_while_running(
    services: Services, pg: Connection, unique_name: str
) -> None:
    name = unique_name
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    pg.execute(sql.SQL("CREATE TABLE {}.first (id int PRIMARY KEY)").format(sql.Identifier(name)))
    settings = capture_settings(services, name, [], snapshot_mode="initial").model_copy(
        update={
            "postgres": capture_settings(services, name, []).postgres.model_copy(
                update={"tables": [], "schemas": [name]}
            ),
            "table_refresh_s": 0.5,
        }
    )
    runner = CaptureThread(settings)
    try:
        runner.start(pg)
        wait_for(
            lambda: _state(settings, f"{name}.first") is TableState.STREAMING, "never started", 90
        )
        late = sql.Identifier(name, "late")
        pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(late))
        pg.execute(
            sql.SQL("INSERT INTO {} SELECT g, 'v' || g FROM generate_series(1, 40) g").format(late)
        )
        wait_for(
            lambda: _state(settings, f"{name}.late") is TableState.STREAMING,
            "late never joined",
            90,
        )
        pg.execute(sql.SQL("UPDATE {} SET v = 'changed' WHERE id <= 3").format(late))
        pg.execute(sql.SQL("DELETE FROM {} WHERE id = 40").format(late))
        topic = f"{name}.{name}.late"
        wait_for(
            lambda: len(read_to_end(services.kafka_bootstrap_servers, topic)) >= 40 + 3 + 1,
            "changes after the join never arrived",
            90,
        )
        runner.join()
        assert not runner.errors, runner.errors
        reader = schema_reader(services.kafka_bootstrap_servers, settings.kafka.schema_topic, 4)
        messages = read_to_end(services.kafka_bootstrap_servers, topic)
        _assert_per_key_order(reader, messages)
        lake = replay(reader, messages)[topic]
        assert {k[0][1]: (r["id"], r["v"]) for k, r in lake.items()} == _source_rows(
            pg, late, "id, v"
        )
    finally:
        runner.close(pg)


def test_replica_identity_full_keeps_the_primary_key_as_key(
    services: Services, pg: Connection, unique_name: str
) -> None:
    name = unique_name
    full = sql.Identifier(name, "full_pk")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(full))
    pg.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(full))
    pg.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a'), (2, 'b')").format(full))
    settings = capture_settings(services, name, [f"{name}.full_pk"], snapshot_mode="initial")
    runner = CaptureThread(settings)
    try:
        runner.start(pg)
        wait_for(
            lambda: _state(settings, f"{name}.full_pk") is TableState.STREAMING, "no snapshot", 90
        )
        pg.execute(sql.SQL("UPDATE {} SET v = 'changed' WHERE id = 1").format(full))
        topic = f"{name}.{name}.full_pk"
        wait_for(
            lambda: len(read_to_end(services.kafka_bootstrap_servers, topic)) >= 3, "no update", 90
        )
        runner.join()
        reader = schema_reader(services.kafka_bootstrap_servers, settings.kafka.schema_topic, 2)
        messages = read_to_end(services.kafka_bootstrap_servers, topic)
        decoded = [(reader.decode_key(m.key()), reader.decode_value(m.value())) for m in messages]
        assert {tuple(k) for k, _ in decoded} == {("id",)}, "the key is the primary key only"
        (update,) = [v for _, v in decoded if v["op"] == "UPDATE"]
        assert update["before"] == {"id": 1, "v": "a"}, "FULL still sends the whole old row"
        assert update["after"] == {"id": 1, "v": "changed"}
    finally:
        runner.close(pg)


def test_a_snapshot_cut_short_is_taken_again_with_a_truncate(
    services: Services, pg: Connection, unique_name: str
) -> None:
    name = unique_name
    big = sql.Identifier(name, "big")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(big))
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, repeat('x', 200) FROM generate_series(1, 100000) g"
        ).format(big)
    )
    settings = capture_settings(services, name, [f"{name}.big"], snapshot_mode="initial")
    # One chunk for the whole table: a snapshot stopped after a published chunk resumes
    # instead (test_capture_snapshot_resume.py), and how many chunks 100k rows make
    # depends on whether autovacuum has analyzed the table yet.
    settings = settings.model_copy(update={"snapshot_chunk_rows": 100_000_000})
    topic = f"{name}.{name}.big"
    # Paced by the lake, where nothing reports records applied, the first run holds at
    # 2,000 records in flight: its snapshot cannot end before the stop, however fast it
    # reads.
    held = settings.model_copy(update={"max_in_flight_records": 2000, "snapshot_pace": "lake"})
    runner = CaptureThread(held)
    try:
        runner.start(pg)
        wait_for(
            lambda: _state(settings, f"{name}.big") is TableState.SNAPSHOT, "no snapshot began", 90
        )
        # The table is in its snapshot before its topic exists: the topic is made with the
        # first record, so the count is 0 until then.
        wait_for(lambda: record_count(services.kafka_bootstrap_servers, topic) > 0, "no rows", 90)
        runner.join()  # a graceful stop in the middle of the snapshot
        assert not runner.errors, runner.errors
        first = len(read_to_end(services.kafka_bootstrap_servers, topic))
        assert _state(settings, f"{name}.big") is TableState.SNAPSHOT
        # Rows deleted after the first attempt must not survive in a consumer's replay.
        pg.execute(sql.SQL("DELETE FROM {} WHERE id <= 1000").format(big))

        runner = CaptureThread(settings)
        runner.start(pg)
        wait_for(
            lambda: _state(settings, f"{name}.big") is TableState.STREAMING, "never finished", 90
        )
        runner.join()
        messages = read_to_end(services.kafka_bootstrap_servers, topic)
        reader = schema_reader(services.kafka_bootstrap_servers, settings.kafka.schema_topic, 2)
        ops = [reader.decode_value(m.value())["op"] for m in messages]
        assert ops.count("TRUNCATE") == 1, "the second attempt starts with a TRUNCATE"
        assert len(messages) == first + 1 + 99000
        lake = replay(reader, messages)[topic]
        assert len(lake) == 99000
        assert min(k[0][1] for k in lake) == 1001
    finally:
        runner.close(pg)
