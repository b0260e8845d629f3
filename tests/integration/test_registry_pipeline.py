"""Registry mode end to end, against the real Apicurio Registry, Kafka, Spark and Delta.

- A deployment switches from single-object encoding to the registry wire format without
  draining: capture streams a table single-object encoded, stops, and streams on in
  registry mode (re-sending, registry-framed, what the slot had not confirmed), with an
  ADD COLUMN mid-stream whose new value schema the registry accepts as a new version
  under FULL_TRANSITIVE. apply then reads the topic, both framings in one micro-batch,
  and the Delta table equals the PostgreSQL table.
- A retyped column is refused by the registry: the table goes to ``errored`` with a
  message naming the subject and the resync, and the other table streams on.
- A snapshot taken in registry mode is registry-framed too.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from apply.app import ApplyJob
from apply.settings import ApplySettings, LakeSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture.admin import table_statuses
from capture.settings import CaptureSettings
from runtime.schema_registry import SchemaRegistrySettings
from runtime.telemetry import MetricsSettings
from schemas.control import TableState
from schemas.naming import table_topic
from schemas.registry_framing import Framing, framing_of
from tests.plugins.capture import CaptureThread, capture_settings, slot_active
from tests.plugins.pipeline import current_wal, slot_confirmed
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow

Connection = psycopg.Connection[tuple[object, ...]]


def in_registry_mode(settings: CaptureSettings, url: str) -> CaptureSettings:
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(
                update={"encoding": "registry", "registry": SchemaRegistrySettings(url=url)}
            )
        }
    )


def apply_settings(services: Services, name: str, root: Path, url: str) -> ApplySettings:
    return ApplySettings(
        kafka=ApplyKafka(
            bootstrap_servers=services.kafka_bootstrap_servers,
            topic_prefix=name,
            control_topic=f"{name}._control",
            schema_topic=f"{name}._schemas",
            registry=SchemaRegistrySettings(url=url),
        ),
        lake=LakeSettings(root=str(root / "lake"), checkpoint_root=str(root / "checkpoints")),
        trigger=TriggerSettings(interval="1 second"),
        metrics=MetricsSettings(port=0),
        table_parallelism=1,
    )


def framings(bootstrap: str, topic: str) -> list[Framing]:
    """The framing of every non-null value on ``topic``, by partition and offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-framings",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found: list[tuple[int, int, Framing]] = []
        at_end: set[int] = set()
        while len(at_end) < len(partitions):
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is not None:
                    at_end.add(message.partition() or 0)
                    continue
                value = message.value()
                if value is not None:
                    found.append(
                        (message.partition() or 0, message.offset() or 0, framing_of(value))
                    )
        return [framing for _, _, framing in sorted(found)]
    finally:
        consumer.close()


def registry_get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def wait_applied(pg: Connection, slot: str, errors: list[BaseException]) -> None:
    """Until the slot is confirmed past the WAL written so far: capture confirms only
    what apply has in Delta, so the lake then holds every change committed before."""
    target = current_wal(pg)

    def applied() -> bool:
        assert not errors, errors
        confirmed = slot_confirmed(pg, slot)
        return confirmed is not None and confirmed >= target

    wait_for(applied, f"slot {slot} to pass {target}", 300)


LAKE_COLUMNS = (
    "id, CAST(amount AS STRING) AS amount, note, unix_micros(at) AS at, "
    "unix_date(day) AS day, tags, flag, u, extra"
)
PG_COLUMNS = sql.SQL(
    "id, amount::text, note, (extract(epoch FROM at) * 1000000)::int8, "
    "day - DATE '1970-01-01', tags, flag, u::text, extra"
)


def test_a_switch_to_registry_mode_and_an_added_column_reach_the_lake(
    spark: Any,
    services: Services,
    pg: Connection,
    unique_name: str,
    tmp_path: Path,
    schema_registry_url: str,
) -> None:
    schema = unique_name
    table = f"{schema}.items"
    items = sql.Identifier(schema, "items")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pg.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, amount numeric(12,2), note text, "
            "at timestamptz, day date, tags text[], flag boolean, u uuid)"
        ).format(items)
    )
    single_object = capture_settings(services, unique_name, [table])
    topic = table_topic(unique_name, schema, "items")

    # Single-object encoded: 30 inserts, 10 updates, 5 deletes. apply is not running, so
    # the slot stays where it was and the next capture sends them again.
    first = CaptureThread(single_object)
    first.start(pg)
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, g * 1.25, 'n' || g, "
            "TIMESTAMPTZ '2024-01-01 00:00:00+00' + g * INTERVAL '1 hour', "
            "DATE '2024-01-01' + g, ARRAY['a', NULL, g::text], g % 2 = 0, "
            "md5(g::text)::uuid FROM generate_series(1, 30) g"
        ).format(items)
    )
    pg.execute(sql.SQL("UPDATE {} SET note = NULL, amount = -1.5 WHERE id <= 10").format(items))
    pg.execute(sql.SQL("DELETE FROM {} WHERE id > 25").format(items))
    wait_for(
        lambda: len(framings(services.kafka_bootstrap_servers, topic)) == 45, "45 records", 120
    )
    first.join()
    assert not first.errors, first.errors
    wait_for(
        lambda: not slot_active(pg, unique_name), "the first capture to let go of the slot", 120
    )

    # Registry mode from here on: the 45 changes again, then an added column.
    second = CaptureThread(in_registry_mode(single_object, schema_registry_url))
    second.start(pg)
    stop = threading.Event()
    errors: list[BaseException] = []
    try:
        pg.execute(
            sql.SQL("INSERT INTO {} (id, note) VALUES (100, 'before the column')").format(items)
        )
        pg.execute(sql.SQL("ALTER TABLE {} ADD COLUMN extra int").format(items))
        pg.execute(sql.SQL("INSERT INTO {} (id, extra) VALUES (101, 7), (102, NULL)").format(items))
        pg.execute(sql.SQL("UPDATE {} SET extra = id WHERE id BETWEEN 5 AND 8").format(items))
        wait_for(
            lambda: len(framings(services.kafka_bootstrap_servers, topic)) == 45 + 45 + 7,
            "the registry-framed records",
            120,
        )
        seen = framings(services.kafka_bootstrap_servers, topic)
        assert seen.count(Framing.SINGLE_OBJECT) == 45
        assert seen.count(Framing.REGISTRY) == 45 + 7

        # Every record in one micro-batch: both framings, replays, two value schemas.
        settings = apply_settings(services, unique_name, tmp_path, schema_registry_url)

        def run() -> None:
            job = ApplyJob(settings, spark)
            try:
                job.run(stop)
            except BaseException as exc:  # surfaced by wait_applied and below
                errors.append(exc)
            finally:
                job.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        wait_applied(pg, unique_name, errors)
    finally:
        stop.set()
        second.close(pg)
    assert not errors, errors
    assert not second.errors, second.errors

    lake = spark.read.format("delta").load(str(tmp_path / "lake" / schema / "items"))
    got = sorted(tuple(row) for row in lake.selectExpr(*LAKE_COLUMNS.split(", ")).collect())
    rows = pg.execute(sql.SQL("SELECT {} FROM {} ORDER BY id").format(PG_COLUMNS, items))
    expected = sorted(tuple(row) for row in rows.fetchall())
    assert len(expected) == 28
    assert got == expected

    # The value subject has one version per table version, checked FULL_TRANSITIVE.
    subject = f"{schema_registry_url}/subjects/{topic}-value"
    assert registry_get(f"{subject}/versions") == [1, 2]
    assert (
        registry_get(f"{schema_registry_url}/config/{topic}-value")["compatibilityLevel"]
        == "FULL_TRANSITIVE"
    )


def test_a_retyped_column_errors_its_table_naming_the_subject(
    services: Services, pg: Connection, unique_name: str, schema_registry_url: str
) -> None:
    schema = unique_name
    retyped, other = sql.Identifier(schema, "retyped"), sql.Identifier(schema, "other")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for name in (retyped, other):
        pg.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v int)").format(name))
    settings = in_registry_mode(
        capture_settings(services, unique_name, [f"{schema}.retyped", f"{schema}.other"]),
        schema_registry_url,
    )
    runner = CaptureThread(settings)
    runner.start(pg)
    other_topic = table_topic(unique_name, schema, "other")
    try:
        pg.execute(sql.SQL("INSERT INTO {} VALUES (1, 1)").format(retyped))
        pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN v TYPE text").format(retyped))
        pg.execute(sql.SQL("INSERT INTO {} VALUES (2, 'two')").format(retyped))
        pg.execute(sql.SQL("INSERT INTO {} VALUES (1, 1)").format(other))

        def errored() -> bool:
            states = {s.table: s for s in table_statuses(settings)}
            found = states.get(f"{schema}.retyped")
            return found is not None and found.state is TableState.ERRORED

        wait_for(errored, "the retyped table to be errored", 60)
        wait_for(
            lambda: len(framings(services.kafka_bootstrap_servers, other_topic)) == 1,
            "the other table's record",
            60,
        )
    finally:
        runner.close(pg)
    assert not runner.errors, runner.errors
    status = {s.table: s for s in table_statuses(settings)}[f"{schema}.retyped"]
    subject = f"{table_topic(unique_name, schema, 'retyped')}-value"
    assert status.message is not None
    assert subject in status.message
    assert f"python -m capture resync {schema}.retyped" in status.message
    assert registry_get(f"{schema_registry_url}/subjects/{subject}/versions") == [1]


def test_a_snapshot_in_registry_mode_is_registry_framed(
    services: Services, pg: Connection, unique_name: str, schema_registry_url: str
) -> None:
    schema = unique_name
    items = sql.Identifier(schema, "items")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v text)").format(items))
    pg.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'v' || g FROM generate_series(1, 5) g").format(items)
    )
    settings = in_registry_mode(
        capture_settings(services, unique_name, [f"{schema}.items"], snapshot_mode="initial"),
        schema_registry_url,
    )
    topic = table_topic(unique_name, schema, "items")
    runner = CaptureThread(settings)
    runner.start(pg)
    try:
        pg.execute(sql.SQL("INSERT INTO {} VALUES (6, 'v6')").format(items))
        wait_for(
            lambda: len(framings(services.kafka_bootstrap_servers, topic)) == 6,
            "the snapshot's rows and the insert",
            120,
        )
    finally:
        runner.close(pg)
    assert not runner.errors, runner.errors
    assert framings(services.kafka_bootstrap_servers, topic) == [Framing.REGISTRY] * 6
    # The snapshot's codec registered the same table version the stream's did.
    subject = f"{schema_registry_url}/subjects/{topic}-value"
    assert registry_get(f"{subject}/versions") == [1]
