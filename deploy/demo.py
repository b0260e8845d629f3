"""``make demo``: the pipeline end to end on the local stack, narrated.

1. starts PostgreSQL and Kafka (``deploy.local``), creates two demo tables;
2. runs the capture service, writes a short workload (inserts, updates, deletes);
3. reads the change topics back with the contract reader and rebuilds each table;
4. applies the records to Delta tables and reports what landed next to the source.

Every run starts clean: demo tables, slot, topics and lake are recreated.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from psycopg import sql

from capture.service import CaptureService
from capture.settings import CaptureSettings, KafkaSettings, PostgresSettings
from deploy.local import stack
from deploy.local.jars import PROJECT_ROOT, resolve
from schemas.reader import ContractReader

SCHEMA = "demo"
SLOT = "demo_slot"
PREFIX = "demo"
TABLES = ("customers", "orders")
DEMO_ROOT = PROJECT_ROOT / ".local" / "demo"


def say(text: str) -> None:
    print(f"demo: {text}", flush=True)


def prepare_source(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
        [SLOT],
    )
    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(SLOT)))
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    conn.execute(
        "CREATE TABLE demo.customers (id bigint PRIMARY KEY, name text NOT NULL, "
        "email text, created timestamptz NOT NULL DEFAULT now())"
    )
    conn.execute(
        "CREATE TABLE demo.orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, "
        "amount numeric(12,2) NOT NULL, status text NOT NULL, tags text[])"
    )


def workload(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    with conn.transaction():
        conn.execute(
            "INSERT INTO demo.customers (id, name, email) "
            "SELECT g, 'customer ' || g, 'c' || g || '@example.com' FROM generate_series(1, 500) g"
        )
    for batch in range(5):
        with conn.transaction():
            conn.execute(
                "INSERT INTO demo.orders SELECT g, 1 + g %% 500, (g %% 997) / 10.0, 'new', "
                "ARRAY['web', NULL] FROM generate_series(%s::int, %s::int) g",
                [batch * 400 + 1, batch * 400 + 400],
            )
    conn.execute("UPDATE demo.orders SET status = 'paid', tags = ARRAY['paid'] WHERE id % 3 = 0")
    conn.execute("UPDATE demo.customers SET email = NULL WHERE id % 50 = 0")
    conn.execute("DELETE FROM demo.orders WHERE id % 10 = 0")
    conn.execute("DELETE FROM demo.customers WHERE id > 490")


def reset_kafka(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{PREFIX}.")]
    for future in admin.delete_topics(existing).values() if existing else []:
        future.result(30)


def read_back(bootstrap: str, settings: KafkaSettings, expected: int) -> dict[str, Any]:
    """Consume the change topics and rebuild each table in position order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"demo-reader-{time.time_ns()}",
            "auto.offset.reset": "earliest",
        }
    )
    reader = ContractReader(settings.schema_topic)
    topics = [f"{PREFIX}.{SCHEMA}.{t}" for t in TABLES]
    consumer.subscribe([settings.schema_topic, *topics])
    records: list[tuple[dict[str, Any], str, bytes]] = []
    deadline = time.monotonic() + 120
    pending: list[Any] = []
    try:
        while len(records) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            if message.topic() == settings.schema_topic:
                reader.add_schema_message(message.key() or b"", message.value())
                continue
            pending.append(message)
            still: list[Any] = []
            for m in pending:
                if reader.fingerprint(m.value()) in reader:
                    records.append((reader.decode_value(m.value()), m.topic(), m.key()))
                else:
                    still.append(m)
            pending = still
    finally:
        consumer.close()
    records.sort(key=lambda r: (r[0]["commit_lsn"], r[0]["ordinal"]))
    tables: dict[str, dict[bytes, Any]] = {t: {} for t in topics}
    for value, topic, key in records:
        if value["op"] == "DELETE":
            tables[topic].pop(key, None)
        else:
            tables[topic][key] = value["after"]
    return {"records": len(records), "tables": tables}


def wait(predicate: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.2)


def main() -> None:
    say("starting PostgreSQL and Kafka (make up)")
    resolve("spark")
    state = stack.up()
    say(f"postgres {state.postgres.dsn}  kafka {state.kafka.bootstrap_servers}")
    with psycopg.connect(state.postgres.dsn, autocommit=True) as conn:
        prepare_source(conn)
        reset_kafka(state.kafka.bootstrap_servers)
        shutil.rmtree(DEMO_ROOT, ignore_errors=True)
        kafka = KafkaSettings(
            bootstrap_servers=state.kafka.bootstrap_servers,
            topic_prefix=PREFIX,
            control_topic=f"{PREFIX}._control",
            schema_topic=f"{PREFIX}._schemas",
            partitions=3,
        )
        settings = CaptureSettings(
            postgres=PostgresSettings(
                dsn=state.postgres.dsn,
                slot=SLOT,
                publication=SLOT,
                tables=[f"{SCHEMA}.{t}" for t in TABLES],
            ),
            kafka=kafka,
            status_interval_s=1.0,
        )
        stop = threading.Event()
        failures: list[BaseException] = []

        def run_capture() -> None:
            try:
                CaptureService(settings, stop).run()
            except BaseException as exc:  # reported below
                failures.append(exc)

        say("starting capture (python -m capture) in the background")
        thread = threading.Thread(target=run_capture, daemon=True)
        thread.start()
        wait(lambda: bool(failures) or _slot_active(conn), "capture to start streaming")
        if failures:
            raise SystemExit(f"demo: capture failed: {failures[0]}")

        say("workload: 500 customers, 2000 orders, updates, deletes")
        workload(conn)
        expected = _count_changes()
        rebuilt = read_back(state.kafka.bootstrap_servers, kafka, expected)
        stop.set()
        thread.join(30)

        say(f"{rebuilt['records']} change records read back from Kafka")
        print()
        print(f"  {'table':<18}{'rows in PostgreSQL':>20}{'rows rebuilt from Kafka':>26}")
        for table in TABLES:
            source = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(SCHEMA, table))
            ).fetchone()
            rows = len(rebuilt["tables"][f"{PREFIX}.{SCHEMA}.{table}"])
            print(f"  {SCHEMA + '.' + table:<18}{source[0] if source else '?':>20}{rows:>26}")
        print()
        say("stack left running: `make down` stops it")


def _slot_active(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute(
        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", [SLOT]
    ).fetchone()
    return bool(row and row[0])


def _count_changes() -> int:
    # inserts 500 + 2000, updates 666 + 10, deletes 200 + 10
    return 500 + 2000 + 666 + 10 + 200 + 10


if __name__ == "__main__":
    main()
