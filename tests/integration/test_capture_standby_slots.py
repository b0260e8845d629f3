"""``synchronized_standby_slots`` naming a slot the server does not have stalls every
logical walsender of a failover slot; capture refuses to start on such a server and
names the fix (capture/source/standby_slots.py).

PostgreSQL 18, on a server of the test's own: the setting holds back the failover slots
of the whole server, so it must never be set on the run's shared one. The stall itself
is shown first (a failover slot's changes cannot even be peeked at), then capture's
refusal, then the fix.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from capture.errors import ConfigError
from capture.service import CaptureService
from capture.source.standby_slots import FIX, check_standby_slots
from deploy.local import stack
from deploy.local.errors import MissingPrerequisite
from deploy.local.postgres import LocalPostgres, find_bindir
from deploy.local.process import free_port
from tests.plugins.capture import capture_settings
from tests.plugins.prerequisites import missing
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow

VERSION = 18
STANDBY_SLOT = "standby1"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalPostgres]:
    try:
        find_bindir(VERSION)
    except MissingPrerequisite as exc:
        missing(
            f"synchronized_standby_slots needs PostgreSQL 17+; {VERSION} is missing: {exc}", exc
        )
    stack.clear_orphaned_cluster(tmp_path)
    postgres = LocalPostgres(stack._postgres_root(tmp_path), free_port(), version=VERSION)
    postgres.start()
    try:
        yield postgres
    finally:
        postgres.stop()
        shutil.rmtree(postgres.root, ignore_errors=True)


def _setting(dsn: str) -> str:
    """The value a new session sees (a reload reaches new sessions first)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW synchronized_standby_slots").fetchone()
    assert row is not None
    return str(row[0])


def _set(dsn: str, statement: sql.SQL | sql.Composed, expected: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)
        conn.execute("SELECT pg_reload_conf()")
    wait_for(lambda: _setting(dsn) == expected, f"synchronized_standby_slots = {expected!r}", 30)


def test_a_standby_slot_the_server_lacks_is_refused_with_the_fix(
    server: LocalPostgres,
    services: Services,
    unique_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = server.dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION stalled FOR TABLE public.t")
        # The server accepts the setting only while the slot exists (its check hook).
        conn.execute("SELECT pg_create_physical_replication_slot(%s)", [STANDBY_SLOT])
    _set(
        dsn,
        sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {}").format(
            sql.Literal(STANDBY_SLOT)
        ),
        STANDBY_SLOT,
    )

    with psycopg.connect(dsn, autocommit=True) as conn:
        # The standby is only away: a warning, no refusal.
        with caplog.at_level(logging.WARNING, logger="capture.source.standby_slots"):
            check_standby_slots(conn, unique_name)
        assert any("has no standby connected" in r.getMessage() for r in caplog.records)

        # Then its slot goes (the standby was removed; or this server is a promoted
        # standby, which never had its old primary's physical slot).
        conn.execute("SELECT pg_drop_replication_slot(%s)", [STANDBY_SLOT])
        conn.execute(
            "SELECT pg_create_logical_replication_slot('stalled', 'pgoutput', false, false, true)"
        )
        conn.execute("INSERT INTO public.t VALUES (1)")
        conn.execute("SET statement_timeout = '2s'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute(
                "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('stalled', NULL, "
                "NULL, 'proto_version', '1', 'publication_names', 'stalled')"
            )
        conn.execute("RESET statement_timeout")
        conn.execute("SELECT pg_drop_replication_slot('stalled')")

    local = Services(dsn, services.kafka_bootstrap_servers, services.mode)
    settings = capture_settings(local, unique_name, ["public.t"])
    with pytest.raises(ConfigError) as refused:
        CaptureService(settings, threading.Event()).run()
    message = str(refused.value)
    assert f'"{STANDBY_SLOT}" does not exist' in message
    assert FIX in message
    with psycopg.connect(dsn, autocommit=True) as conn:
        made = conn.execute(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [unique_name]
        ).fetchone()
        assert made is None, "capture made its slot on a server where it cannot stream"

    # The fix the message names.
    _set(dsn, sql.SQL("ALTER SYSTEM RESET synchronized_standby_slots"), "")
    with psycopg.connect(dsn, autocommit=True) as conn:
        check_standby_slots(conn, unique_name)
