"""``python -m capture`` as a real process: kill -9 in the middle loses nothing, and
SIGTERM stops it cleanly with exit status 0.

Nothing is applied in these tests, so the slot never moves: a restart streams every
transaction again. That is the worst case for duplicates, and each duplicate must carry
the same position and the same bytes as the first copy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer
from psycopg import sql

from tests.plugins.capture import slot_active, slot_streaming
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]
ROOT = Path(__file__).resolve().parents[2]
ROWS = 3000


def _env(services: Services, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPTURE_")}
    env.update(
        {
            "CAPTURE_POSTGRES__DSN": services.postgres_dsn,
            "CAPTURE_POSTGRES__SLOT": name,
            "CAPTURE_POSTGRES__PUBLICATION": name,
            "CAPTURE_POSTGRES__TABLES": f'["{name}.orders"]',
            "CAPTURE_KAFKA__BOOTSTRAP_SERVERS": services.kafka_bootstrap_servers,
            "CAPTURE_KAFKA__TOPIC_PREFIX": name,
            "CAPTURE_KAFKA__CONTROL_TOPIC": f"{name}._control",
            "CAPTURE_KAFKA__SCHEMA_TOPIC": f"{name}._schemas",
            "CAPTURE_KAFKA__PARTITIONS": "2",
            "CAPTURE_STATUS_INTERVAL_S": "0.5",
            # Streaming is what this file is about: no snapshot folding early inserts.
            "CAPTURE_SNAPSHOT_MODE": "never",
            # Any free port: the default one may be held by another capture.
            "CAPTURE_METRICS__PORT": "0",
        }
    )
    return env


def _start(services: Services, name: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "capture"],
            cwd=ROOT,
            env=_env(services, name),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _capture_log(log: Path) -> Callable[[], str]:
    """The tail of capture's log, for a wait that fails."""
    return lambda: f"capture log:\n{log.read_text()[-3000:]}"


@pytest.fixture
def source(pg: Connection, unique_name: str) -> Iterator[str]:
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(unique_name)))
    pg.execute(
        sql.SQL("CREATE TABLE {}.orders (id int PRIMARY KEY, note text)").format(
            sql.Identifier(unique_name)
        )
    )
    yield unique_name
    deadline = time.monotonic() + 20
    while slot_active(pg, unique_name) and time.monotonic() < deadline:
        time.sleep(0.2)
    pg.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
        "WHERE slot_name = %s AND NOT active",
        [unique_name],
    )


def _records(bootstrap: str, topic: str, at_least: int) -> list[tuple[bytes, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"r{time.time_ns()}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    out: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + 90
    idle_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                if len(out) >= at_least and time.monotonic() - idle_since > 3:
                    break
                continue
            idle_since = time.monotonic()
            key, value = msg.key(), msg.value()
            assert key is not None
            assert value is not None
            out.append((key, value))
    finally:
        consumer.close()
    return out


def test_kill_9_then_restart_loses_nothing(
    services: Services, pg: Connection, source: str, tmp_path: Path
) -> None:
    from schemas.reader import ContractReader  # noqa: PLC0415

    log = tmp_path / "capture.log"
    first = _start(services, source, log)
    wait_for(
        lambda: slot_streaming(pg, source),
        "capture never started streaming",
        60,
        detail=_capture_log(log),
    )
    table = sql.Identifier(source, "orders")
    topic = f"{source}.{source}.orders"
    insert = sql.SQL(
        "INSERT INTO {} SELECT g, 'n' || g FROM generate_series(%s::int, %s::int) g"
    ).format(table)
    for start in range(0, ROWS // 2, 100):
        pg.execute(insert, [start + 1, start + 100])
    # Some records are in Kafka before the kill, so the restart must duplicate them.
    assert len(_records(services.kafka_bootstrap_servers, topic, 100)) >= 100
    first.send_signal(signal.SIGKILL)
    for start in range(ROWS // 2, ROWS, 100):
        pg.execute(insert, [start + 1, start + 100])
    first.wait(30)
    assert first.returncode == -signal.SIGKILL

    second = _start(services, source, log)
    try:
        records = _records(services.kafka_bootstrap_servers, topic, ROWS)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(60)

    reader = ContractReader(f"{source}._schemas")
    schema_records = _records(services.kafka_bootstrap_servers, f"{source}._schemas", 2)
    for key, value in schema_records:
        reader.add_schema_message(key, value)
    by_key: dict[int, set[bytes]] = {}
    positions: dict[int, set[tuple[int, int]]] = {}
    for key, value in records:
        row_id = reader.decode_key(key)["id"]
        decoded = reader.decode_value(value)
        by_key.setdefault(row_id, set()).add(value)
        positions.setdefault(row_id, set()).add((decoded["commit_lsn"], decoded["ordinal"]))
    assert sorted(by_key) == list(range(1, ROWS + 1)), "a committed row is missing"
    assert all(len(v) == 1 for v in by_key.values()), "a duplicate differs from its original"
    assert all(len(p) == 1 for p in positions.values())
    assert len(records) > ROWS, "the restart re-published nothing: the kill came too late"
    assert second.returncode == 0, log.read_text()[-3000:]


def test_sigterm_stops_cleanly(
    services: Services, pg: Connection, source: str, tmp_path: Path
) -> None:
    log = tmp_path / "capture.log"
    proc = _start(services, source, log)
    wait_for(
        lambda: slot_streaming(pg, source),
        "capture never started streaming",
        60,
        detail=_capture_log(log),
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, log.read_text()[-3000:]
    assert "stopped at confirmed" in log.read_text()


def test_bad_settings_exit_2_with_the_reason(
    services: Services, source: str, tmp_path: Path
) -> None:
    env = _env(services, source)
    env["CAPTURE_POSTGRES__TABLES"] = '["orders"]'
    result = subprocess.run(
        [sys.executable, "-m", "capture"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "must be schema-qualified" in result.stderr
