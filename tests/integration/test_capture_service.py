"""The capture service against the real PostgreSQL and Kafka.

Changes made in PostgreSQL are decoded back from Kafka and replayed per key; the result
must equal the source tables. The slot must not move before the control topic says the
records are applied, must move once it does, and must keep moving while idle.
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
from psycopg import sql

from capture.errors import ConfigError
from capture.service import CaptureService
from capture.settings import CaptureSettings
from schemas.lsn import parse_lsn
from schemas.reader import ContractReader
from tests.plugins.capture import CaptureThread, capture_settings, confirmed_lsn, slot_active
from tests.plugins.services import Services
from tests.plugins.topics import consume_all, replay, report_applied
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
