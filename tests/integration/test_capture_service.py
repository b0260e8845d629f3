"""The capture service against the real PostgreSQL and Kafka.

Changes made in PostgreSQL are decoded back from Kafka and replayed per key; the result
must equal the source tables. The slot must not move before the control topic says the
records are applied, must move once it does, and must keep moving while idle. A slot
advanced or dropped behind capture's back is refused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql

from capture.errors import SLOT_RESYNC, ConfigError
from capture.publish.control import ControlReader
from capture.service import CaptureService
from capture.settings import CaptureSettings
from schemas.control import TableState
from schemas.lsn import format_lsn, parse_lsn
from schemas.reader import ContractReader
from tests.plugins.capture import (
    CaptureThread,
    capture_settings,
    confirmed_lsn,
    slot_active,
    table_status,
)
from tests.plugins.services import Services
from tests.plugins.topics import consume_all, read_to_end, replay, report_applied, schema_reader
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]


@dataclass
class RunningCapture:
    runner: CaptureThread
    schema: str

    @property
    def settings(self) -> CaptureSettings:
        return self.runner.settings

    @property
    def errors(self) -> list[BaseException]:
        return self.runner.errors

    def stop_and_join(self) -> None:
        self.runner.join()


@pytest.fixture
def capture(services: Services, pg: Connection, unique_name: str) -> Iterator[RunningCapture]:
    schema = unique_name
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pg.execute(
        sql.SQL(
            "CREATE TABLE {s}.orders (id bigint PRIMARY KEY, note text, amount numeric(10,2));"
            "CREATE TABLE {s}.items (order_id bigint, line int, sku text, "
            "PRIMARY KEY (order_id, line));"
            "CREATE TABLE {s}.uncaptured (id int PRIMARY KEY)"
        ).format(s=sql.Identifier(schema))
    )
    runner = CaptureThread(
        capture_settings(services, unique_name, [f"{schema}.orders", f"{schema}.items"])
    )
    runner.start(pg)
    yield RunningCapture(runner, schema)
    runner.close(pg)


def test_changes_round_trip_and_slot_follows_the_control_topic(
    capture: RunningCapture, pg: Connection, services: Services, unique_name: str
) -> None:
    s = sql.Identifier(capture.schema)
    pg.execute(
        sql.SQL(
            "INSERT INTO {}.orders VALUES (1, 'one', 1.50), (2, 'two', 2.00), (3, 'three', 3.25)"
        ).format(s)
    )
    with pg.transaction():
        pg.execute(
            sql.SQL("INSERT INTO {}.items VALUES (1, 1, 'a'), (1, 2, 'b'), (2, 1, 'c')").format(s)
        )
        pg.execute(
            sql.SQL("UPDATE {}.orders SET note = 'uno', amount = 10.01 WHERE id = 1").format(s)
        )
        pg.execute(sql.SQL("DELETE FROM {}.items WHERE order_id = 1 AND line = 2").format(s))
    pg.execute(sql.SQL("UPDATE {}.orders SET id = 30 WHERE id = 3").format(s))
    pg.execute(sql.SQL("DELETE FROM {}.orders WHERE id = 2").format(s))
    pg.execute(sql.SQL("TRUNCATE {}.items").format(s))
    pg.execute(sql.SQL("INSERT INTO {}.items VALUES (9, 9, 'z')").format(s))
    last_end = parse_lsn(str(pg.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]))  # type: ignore[index]
    start = confirmed_lsn(pg, unique_name)

    orders_topic, items_topic = (
        f"{unique_name}.{capture.schema}.orders",
        f"{unique_name}.{capture.schema}.items",
    )
    # orders: 3 inserts, update, key change (delete + insert), delete
    # items: 3 inserts, delete, truncate, insert
    messages = consume_all(services.kafka_bootstrap_servers, [orders_topic, items_topic], 13)
    assert len(messages) == 13, [m.topic() for m in messages]
    assert not capture.errors

    reader = ContractReader(capture.settings.kafka.schema_topic)
    for schema_msg in consume_all(
        services.kafka_bootstrap_servers, [capture.settings.kafka.schema_topic], 4
    ):
        reader.add_schema_message(schema_msg.key(), schema_msg.value())
    tables = replay(reader, messages)

    def key(**cols: Any) -> tuple[Any, ...]:
        return tuple(sorted(cols.items()))

    assert tables[orders_topic] == {
        key(id=1): {"id": 1, "note": "uno", "amount": Decimal("10.01")},
        key(id=30): {"id": 30, "note": "three", "amount": Decimal("3.25")},
    }
    assert tables[items_topic] == {key(order_id=9, line=9): {"order_id": 9, "line": 9, "sku": "z"}}
    source = pg.execute(
        sql.SQL("SELECT id, note, amount FROM {}.orders ORDER BY id").format(s)
    ).fetchall()
    assert source == [(1, "uno", Decimal("10.01")), (30, "three", Decimal("3.25"))]

    # Nothing applied yet: the slot may pass WAL that carries no change of ours, but
    # never the commit of a transaction whose records are unapplied.
    time.sleep(1.0)
    first_commit = min(reader.decode_value(m.value())["commit_lsn"] for m in messages)
    assert start <= confirmed_lsn(pg, unique_name) <= first_commit

    # Report every partition as applied up to its end: the slot catches up.
    report_applied(services.kafka_bootstrap_servers, capture.settings.kafka.control_topic, messages)
    wait_for(
        lambda: confirmed_lsn(pg, unique_name) >= last_end, "slot never reached the applied LSN", 30
    )

    # Idle: writes to an uncaptured table move WAL; the slot follows without new records.
    pg.execute(sql.SQL("INSERT INTO {}.uncaptured SELECT generate_series(1, 100)").format(s))
    idle_end = parse_lsn(str(pg.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]))  # type: ignore[index]
    wait_for(
        lambda: confirmed_lsn(pg, unique_name) >= idle_end,
        "an idle publication pinned the slot",
        30,
    )
    assert not capture.errors


def test_graceful_stop_confirms_nothing_unapplied(
    capture: RunningCapture, pg: Connection, services: Services, unique_name: str
) -> None:
    s = sql.Identifier(capture.schema)
    pg.execute(
        sql.SQL("INSERT INTO {}.orders SELECT g, 'n', 1 FROM generate_series(1, 500) g").format(s)
    )
    topic = f"{unique_name}.{capture.schema}.orders"
    messages = consume_all(services.kafka_bootstrap_servers, [topic], 500)
    assert len(messages) == 500
    capture.stop_and_join()
    assert capture.runner.thread is not None
    assert not capture.runner.thread.is_alive()
    assert not capture.errors, capture.errors

    reader = ContractReader(capture.settings.kafka.schema_topic)
    for schema_msg in consume_all(
        services.kafka_bootstrap_servers, [capture.settings.kafka.schema_topic], 2
    ):
        reader.add_schema_message(schema_msg.key(), schema_msg.value())
    commit_lsn = reader.decode_value(messages[0].value())["commit_lsn"]
    assert confirmed_lsn(pg, unique_name) <= commit_lsn, "the final status confirmed unapplied data"


def test_slot_advanced_behind_our_back_is_refused(
    capture: RunningCapture, pg: Connection, unique_name: str
) -> None:
    s = sql.Identifier(capture.schema)
    # WAL with nothing for us moves the slot by idle confirmation, behind a checkpoint.
    start = confirmed_lsn(pg, unique_name)
    pg.execute(sql.SQL("INSERT INTO {}.uncaptured VALUES (1)").format(s))
    wait_for(lambda: confirmed_lsn(pg, unique_name) > start, "idle confirmation never came", 30)
    capture.stop_and_join()
    assert not capture.errors, capture.errors

    wait_for(lambda: not slot_active(pg, unique_name), "the walsender never let go", 30)
    before = confirmed_lsn(pg, unique_name)
    # A slot advances at most to the flushed WAL, so this commit waits for its flush.
    pg.execute("SET synchronous_commit = on")
    pg.execute(sql.SQL("INSERT INTO {}.orders VALUES (7, 'lost?', 1)").format(s))
    pg.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_flush_lsn())", [unique_name])
    assert confirmed_lsn(pg, unique_name) > before
    # A capture that wrongly started streaming would stop itself after 20 s.
    timer_stop = threading.Event()
    timer = threading.Timer(20, timer_stop.set)
    timer.start()
    try:
        with pytest.raises(ConfigError, match="someone else advanced it"):
            CaptureService(capture.settings, timer_stop).run()
    finally:
        timer.cancel()


def _delete_pipeline_topics(bootstrap: str, prefix: str) -> None:
    """Step 4 of the resync after a lost slot: every topic of the pipeline (change,
    schema and control topics), waited for until the broker has let go of them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def pipeline_topics() -> list[str]:
        return [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{prefix}.")]

    for future in admin.delete_topics(pipeline_topics(), operation_timeout=30).values():
        future.result(30)
    wait_for(lambda: not pipeline_topics(), "the pipeline's topics were never deleted", 60)


def test_slot_dropped_before_anything_was_applied_is_refused_until_a_fresh_start(
    capture: RunningCapture, pg: Connection, services: Services, unique_name: str
) -> None:
    """A slot dropped on the same server and timeline after capture checkpointed it, with
    nothing applied yet: a new slot would start at the server's current WAL and skip the
    changes in between, while the records already in Kafka would reach the lake with the
    gap after them. Capture refuses; the resync (which deletes the control topic, so the
    next start finds no history of the slot) is the fresh start that proceeds."""
    s = sql.Identifier(capture.schema)
    bootstrap = services.kafka_bootstrap_servers
    topic = f"{unique_name}.{capture.schema}.orders"
    # WAL with nothing for capture lets it confirm, so it checkpoints the slot.
    start = confirmed_lsn(pg, unique_name)
    pg.execute(sql.SQL("INSERT INTO {}.uncaptured VALUES (1)").format(s))
    wait_for(lambda: confirmed_lsn(pg, unique_name) > start, "idle confirmation never came", 30)
    # Published, never applied: the slot stays behind it.
    pg.execute(sql.SQL("INSERT INTO {}.orders VALUES (7, 'published', 1)").format(s))
    assert len(consume_all(bootstrap, [topic], 1)) == 1
    capture.stop_and_join()
    assert not capture.errors, capture.errors
    reader = ControlReader(capture.settings.kafka, None)
    try:
        state = reader.load(unique_name)
    finally:
        reader.close()
    assert state.checkpoint is not None, "capture wrote no slot checkpoint"
    assert not state.applied_topics(unique_name)

    wait_for(lambda: not slot_active(pg, unique_name), "the walsender never let go", 30)
    pg.execute("SELECT pg_drop_replication_slot(%s)", [unique_name])
    # The change a new slot would skip.
    pg.execute(sql.SQL("INSERT INTO {}.orders VALUES (8, 'while the slot was gone', 2)").format(s))
    # A capture that wrongly started streaming would stop itself after 20 s.
    timer_stop = threading.Event()
    timer = threading.Timer(20, timer_stop.set)
    timer.start()
    try:
        with pytest.raises(ConfigError) as refused:
            CaptureService(capture.settings, timer_stop).run()
    finally:
        timer.cancel()
    message = str(refused.value)
    assert message.startswith(f"replication slot {unique_name} does not exist, but capture ")
    assert f"streamed it up to {format_lsn(state.checkpoint)} (its last checkpoint" in message
    assert "the slot was dropped (this is the server and the timeline capture last " in message
    assert "would silently skip every change made since" in message
    assert "delete this pipeline's change, schema and control topics" in message
    assert "CAPTURE_SNAPSHOT_MODE=initial" in message
    assert message.endswith(f"({SLOT_RESYNC})")
    made = pg.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [unique_name]
    ).fetchone()
    assert made is None, "capture made a slot it refused to trust"

    # The fresh start: the resync's topics deleted (nothing was applied, so the lake
    # holds nothing of them), capture started with a snapshot (read in this process:
    # worker processes would only add their start-up).
    _delete_pipeline_topics(bootstrap, unique_name)
    fresh = capture.settings.model_copy(update={"snapshot_mode": "initial", "snapshot_workers": 1})
    runner = CaptureThread(fresh)
    try:
        runner.start(pg)
        orders = f"{capture.schema}.orders"
        wait_for(
            lambda: (
                (found := table_status(fresh, orders)) is not None
                and found.state is TableState.STREAMING
            ),
            "the fresh start never snapshotted the table",
            90,
        )
        assert not runner.errors, runner.errors
        messages = read_to_end(bootstrap, topic)
        rows = replay(schema_reader(bootstrap, fresh.kafka.schema_topic, 1), messages)
        assert sorted(int(row["id"]) for row in rows[topic].values()) == [7, 8]
    finally:
        runner.close(pg)
