"""``make demo``: the pipeline end to end on the local stack, narrated.

1. starts PostgreSQL and Kafka (``deploy.local``), creates two demo tables;
2. runs the capture service, writes a short workload (inserts, updates, deletes);
3. waits until the change records are on Kafka;
4. runs the apply job (catch-up trigger) into Delta tables, and prints what landed next
   to the source, and how far the slot was confirmed once apply reported back.

Every run starts clean: demo tables, slot, topics and lake are recreated.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable

import psycopg
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import TopicPartition
from psycopg import sql

from apply.app import ApplyJob
from apply.settings import ApplySettings, LakeSettings, SparkSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from apply.spark_jars import configured_jars
from apply.spark_session import build_session
from capture import admin
from capture.service import CaptureService
from capture.settings import CaptureSettings, KafkaSettings, PostgresSettings
from deploy.local import stack
from deploy.local.jars import PROJECT_ROOT, resolve
from schemas.control import TableState
from schemas.lsn import Lsn, format_lsn, parse_lsn

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
    # Rows that exist before capture starts: they reach Kafka through the snapshot.
    conn.execute(
        "INSERT INTO demo.customers (id, name, email) "
        "SELECT g, 'customer ' || g, 'c' || g || '@example.com' FROM generate_series(1, 500) g"
    )


def workload(conn: psycopg.Connection[tuple[object, ...]]) -> None:
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


def topic_records(bootstrap: str, topic: str) -> int:
    """Records in a topic right now (high minus low watermark over its partitions)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-counter"})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return 0
        total = 0
        for partition in metadata.partitions:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
            except KafkaException:
                continue  # a topic created a moment ago may have no leader yet; asked again
            total += high - low
        return total
    finally:
        consumer.close()


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
        wait(
            lambda: (
                bool(failures)
                or {s.state for s in admin.table_statuses(settings)} == {TableState.STREAMING}
            ),
            "the initial snapshot",
        )
        say("snapshot: the 500 existing customers published as READ records; tables streaming")

        say("workload: 2000 orders, updates, deletes")
        workload(conn)
        end = _wal_lsn(conn)
        topics = {t: f"{PREFIX}.{SCHEMA}.{t}" for t in TABLES}
        expected = _count_changes()
        wait(
            lambda: (
                sum(topic_records(state.kafka.bootstrap_servers, t) for t in topics.values())
                >= expected
            ),
            "capture to publish the workload",
        )
        say(f"{expected} change records on Kafka: {', '.join(topics.values())}")

        say("running apply (python -m apply, trigger available_now) into Delta")
        lake = DEMO_ROOT / "lake"
        apply_settings = ApplySettings(
            kafka=ApplyKafka(
                bootstrap_servers=state.kafka.bootstrap_servers,
                topic_prefix=PREFIX,
                control_topic=kafka.control_topic,
                schema_topic=kafka.schema_topic,
            ),
            lake=LakeSettings(root=str(lake), checkpoint_root=str(DEMO_ROOT / "checkpoints")),
            trigger=TriggerSettings(mode="available_now"),
            spark=SparkSettings(master="local[2]", conf={"spark.sql.shuffle.partitions": "2"}),
        )
        spark = build_session(apply_settings.spark, configured_jars(apply_settings.spark))
        spark.sparkContext.setLogLevel("ERROR")
        try:
            ApplyJob(apply_settings, spark).run(threading.Event())
            wait(lambda: _confirmed(conn) >= end, "the slot to follow the applied LSN", 60)
            print()
            print(f"  {'table':<18}{'PostgreSQL rows':>16}{'Kafka records':>15}{'Delta rows':>12}")
            for table in TABLES:
                source = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(SCHEMA, table))
                ).fetchone()
                records = topic_records(state.kafka.bootstrap_servers, topics[table])
                delta = spark.read.format("delta").load(str(lake / SCHEMA / table)).count()
                name = f"{SCHEMA}.{table}"
                print(f"  {name:<18}{source[0] if source else '?':>16}{records:>15}{delta:>12}")
            print()
            say(
                f"slot {SLOT} confirmed up to {format_lsn(_confirmed(conn))} (workload ended at "
                f"{format_lsn(end)}): WAL is released only once Delta has the data"
            )
            say(f"Delta tables under {lake}")
        finally:
            spark.stop()
            stop.set()
            thread.join(30)
        say("stack left running: `make down` stops it")


def _slot_active(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute(
        "SELECT active FROM pg_replication_slots WHERE slot_name = %s", [SLOT]
    ).fetchone()
    return bool(row and row[0])


def _wal_lsn(conn: psycopg.Connection[tuple[object, ...]]) -> Lsn:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))


def _confirmed(conn: psycopg.Connection[tuple[object, ...]]) -> Lsn:
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [SLOT]
    ).fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))


def _count_changes() -> int:
    # snapshot reads 500, inserts 2000, updates 666 + 10, deletes 200 + 10
    return 500 + 2000 + 666 + 10 + 200 + 10


if __name__ == "__main__":
    main()
