"""A slot PostgreSQL invalidated (``wal_status = 'lost'``) stops capture with a
configuration error naming the resync, instead of a retry that could never succeed.

The test starts a PostgreSQL of its own: it lowers ``max_slot_wal_keep_size`` and
forces the server to remove WAL a slot still needs, which must not touch the slots of
the shared server.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from capture.metrics import CaptureMetrics
from capture.service import CaptureService
from capture.source.wal_safety import SlotLostError, read_keep_size, read_slot_wal
from deploy.local.postgres import LocalPostgres
from tests.plugins.capture import capture_settings
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def postgres(private_postgres: LocalPostgres) -> LocalPostgres:
    return private_postgres


def _keep_size(dsn: str) -> int:
    """The cap a new session sees (a reload reaches new sessions first)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return read_keep_size(conn)


def _lose_slot(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> None:
    """Write WAL past the cap and checkpoint until the server invalidates ``slot``."""
    deadline = time.monotonic() + 60
    while True:
        reading = read_slot_wal(conn, slot)
        assert reading is not None
        if reading.wal_status == "lost":
            return
        assert time.monotonic() < deadline, f"the slot was never invalidated: {reading}"
        conn.execute("SELECT pg_logical_emit_message(false, 'test', repeat('x', 1000))")
        conn.execute("SELECT pg_switch_wal()")
        conn.execute("CHECKPOINT")


def test_a_lost_slot_is_a_config_error_naming_the_resync(
    postgres: LocalPostgres, services: Services, unique_name: str
) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [unique_name])
    # pg_reload_conf() only signals the postmaster; a session sees the cap once the
    # reload reached it, which on a busy machine can take longer than two statements.
    wait_for(lambda: _keep_size(postgres.dsn) == 1024 * 1024, "max_slot_wal_keep_size = 1MB", 30)
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        _lose_slot(conn, unique_name)

    local = Services(postgres.dsn, services.kafka_bootstrap_servers, services.mode)
    settings = capture_settings(local, unique_name, ["public.t"])
    metrics = CaptureMetrics()
    service = CaptureService(settings, threading.Event(), metrics=metrics)
    with pytest.raises(SlotLostError) as raised:
        service.run()
    message = str(raised.value)
    assert f"replication slot {unique_name} was invalidated" in message
    assert f"pg_drop_replication_slot('{unique_name}')" in message
    assert metrics.registry.get_sample_value("cdc_capture_slot_wal_status", {"status": "lost"}) == 1
    assert (
        metrics.registry.get_sample_value("cdc_capture_errors_total", {"kind": "SlotLostError"})
        == 1
    )
    assert metrics.registry.get_sample_value("cdc_capture_max_slot_wal_keep_size_bytes") == (
        1024 * 1024
    )
