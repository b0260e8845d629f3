"""The capture service records the server with its slot checkpoints, and refuses to
stream from another database cluster than the one they were taken on
(capture/source/server_identity.py), on the real PostgreSQL and Kafka."""

from __future__ import annotations

import threading

import psycopg
import pytest
from confluent_kafka import Producer
from psycopg import sql

from capture.errors import ConfigError, TransientError
from capture.publish.control import ControlReader
from capture.publish.publisher import Topics
from capture.rows.typemap import SESSION_SETTINGS
from capture.service import CaptureService
from capture.settings import CaptureSettings
from capture.source.server_identity import read_source_server
from capture.stream.replication import ReplicationStream
from schemas.control import ServerIdentity, SlotCheckpoint
from schemas.lsn import Lsn
from tests.plugins.capture import CaptureThread, capture_settings, confirmed_lsn, slot_active
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def settings(pg: Connection, services: Services, unique_name: str) -> CaptureSettings:
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(unique_name)))
    for ddl in ("CREATE TABLE {}.orders (id int PRIMARY KEY)", "CREATE TABLE {}.other (id int)"):
        pg.execute(sql.SQL(ddl).format(sql.Identifier(unique_name)))
    return capture_settings(services, unique_name, [f"{unique_name}.orders"])


def _recorded(settings: CaptureSettings) -> ServerIdentity | None:
    reader = ControlReader(settings.kafka, None)
    try:
        return reader.load(settings.postgres.slot).server
    finally:
        reader.close()


def test_checkpoints_record_the_server_and_the_same_server_is_streamed_on(
    settings: CaptureSettings, pg: Connection, services: Services, unique_name: str
) -> None:
    server = read_source_server(services.postgres_dsn, None, recorded=None)
    runner = CaptureThread(settings)
    runner.start(pg)
    try:
        # WAL with nothing for capture lets it confirm, so it writes a checkpoint first.
        start = confirmed_lsn(pg, unique_name)
        pg.execute(sql.SQL("INSERT INTO {}.other VALUES (1)").format(sql.Identifier(unique_name)))
        wait_for(lambda: confirmed_lsn(pg, unique_name) > start, "no idle confirmation", 30)
        assert _recorded(settings) == server.identity
        runner.join()
        assert not runner.errors, runner.errors
        wait_for(lambda: not slot_active(pg, unique_name), "the walsender never let go", 30)
        again = CaptureThread(settings)
        again.start(pg)  # the same server, recorded: streams
        again.join()
        assert not again.errors, again.errors
    finally:
        runner.close(pg)


def test_a_checkpoint_of_another_cluster_stops_capture_before_it_makes_a_slot(
    settings: CaptureSettings, pg: Connection, services: Services, unique_name: str
) -> None:
    server = read_source_server(services.postgres_dsn, None, recorded=None).identity
    elsewhere = ServerIdentity(server.system_identifier ^ 0xFFFF, server.timeline)
    control = settings.kafka.control_topic
    Topics(settings.kafka).ensure(control, compacted=True)
    checkpoint = SlotCheckpoint(unique_name, Lsn(0x1_0000_0000), elsewhere)
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap_servers})
    producer.produce(control, checkpoint.value(), checkpoint.key())
    assert producer.flush(30) == 0

    # A capture that wrongly started streaming would stop itself after 20 s.
    stop = threading.Event()
    timer = threading.Timer(20, stop.set)
    timer.start()
    try:
        with pytest.raises(ConfigError) as refused:
            CaptureService(settings, stop).run()
    finally:
        timer.cancel()
    message = str(refused.value)
    assert f"system identifier {elsewhere.system_identifier}" in message
    assert f"system identifier {server.system_identifier}" in message
    assert "Resync" in message
    made = pg.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [unique_name]
    ).fetchone()
    assert made is None, "capture made a slot on a server it refused"


def test_a_replication_connection_that_reaches_another_server_ends_the_attempt(
    services: Services, unique_name: str
) -> None:
    # As when a failover moves a multi-host DSN between the checks and the stream.
    server = read_source_server(services.postgres_dsn, None, recorded=None).identity
    checked = ServerIdentity(server.system_identifier, server.timeline + 1)
    with pytest.raises(TransientError, match="reached another server"):
        ReplicationStream.start(
            services.postgres_dsn,
            password=None,
            slot=unique_name,
            publication=unique_name,
            start_lsn=Lsn(0),
            settings=SESSION_SETTINGS,
            server=checked,
        )
