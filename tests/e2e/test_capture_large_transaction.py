"""A transaction far larger than the in-flight bound streams through without stalling.

Backpressure pauses reading WAL once ``max_in_flight_records`` records are produced but
not applied. Within one transaction that only works if records are released as they are
applied, before the transaction's commit is even read; otherwise reading would pause for
good in the middle of the transaction. A stand-in for apply reports each partition as
applied up to its high watermark, as a keeping-up apply job would.
"""

from __future__ import annotations

import threading
import time

import psycopg
from confluent_kafka import Consumer, Producer
from psycopg import sql

from schemas.control import AppliedProgress
from schemas.lsn import parse_lsn
from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.services import Services
from tests.plugins.topics import end_offsets, record_count

Connection = psycopg.Connection[tuple[object, ...]]
ROWS = 120_000
BOUND = 5_000


def _report_applied(services: Services, topic: str, control: str, stop: threading.Event) -> None:
    consumer = Consumer({"bootstrap.servers": services.kafka_bootstrap_servers, "group.id": "x"})
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap_servers})
    try:
        while not stop.wait(0.2):
            for partition, high in end_offsets(consumer, topic).items():
                progress = AppliedProgress(topic, partition, high, None, None, "t", None, None)
                producer.produce(control, progress.value(), progress.key())
            producer.flush(10)
    finally:
        consumer.close()


def test_one_transaction_larger_than_the_bound_streams_through(
    services: Services, pg: Connection, unique_name: str
) -> None:
    schema = sql.Identifier(unique_name)
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
    pg.execute(sql.SQL("CREATE TABLE {}.events (id int PRIMARY KEY, body text)").format(schema))
    settings = capture_settings(services, unique_name, [f"{unique_name}.events"]).model_copy(
        update={"max_in_flight_records": BOUND}
    )
    runner = CaptureThread(settings)
    runner.start(pg)
    topic = f"{unique_name}.{unique_name}.events"
    stop = threading.Event()
    reporter = threading.Thread(
        target=_report_applied,
        args=(services, topic, settings.kafka.control_topic, stop),
        daemon=True,
    )
    reporter.start()
    try:
        pg.execute(
            sql.SQL(
                "INSERT INTO {}.events SELECT g, 'row ' || g FROM generate_series(1, %s) g"
            ).format(schema),
            [ROWS],
        )
        row = pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        end = parse_lsn(str(row[0]))
        deadline = time.monotonic() + 300
        while record_count(services.kafka_bootstrap_servers, topic) < ROWS:
            assert not runner.errors, runner.errors
            assert time.monotonic() < deadline, "reading stalled inside the transaction"
            time.sleep(0.5)

        def confirmed() -> int:
            found = pg.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                [unique_name],
            ).fetchone()
            assert found is not None
            return parse_lsn(str(found[0]))

        while confirmed() < end:
            assert time.monotonic() < deadline, "the slot never passed the big transaction"
            time.sleep(0.5)
        assert record_count(services.kafka_bootstrap_servers, topic) == ROWS
        assert not runner.errors, runner.errors
    finally:
        stop.set()
        reporter.join(30)
        runner.close(pg)
