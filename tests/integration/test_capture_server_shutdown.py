"""A fast shutdown of the source is not held up by capture's stream.

A logical walsender told to stop waits until its client confirmed everything it sent,
and capture confirms only what the lake applied, so an open stream would keep
PostgreSQL from shutting down. The stream's idle watch connection notices the shutdown
(ordinary sessions are ended first) and the stream ends with a TransientError; once it
is closed, the server finishes shutting down. This test starts a PostgreSQL of its own,
since it shuts it down.
"""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest

from capture.errors import TransientError
from capture.rows.typemap import SESSION_SETTINGS
from capture.stream.copy_data import XLogData
from capture.stream.replication import ReplicationStream
from deploy.local.postgres import LocalPostgres
from schemas.lsn import Lsn
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def postgres(private_postgres: LocalPostgres) -> LocalPostgres:
    return private_postgres


def _read_for(stream: ReplicationStream, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stream.read(0.5)


def test_the_stream_ends_when_the_server_shuts_down_and_then_lets_it_go(
    postgres: LocalPostgres,
) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
    stream = ReplicationStream.start(
        postgres.dsn,
        password=None,
        slot="s",
        publication="p",
        start_lsn=Lsn(0),
        settings=SESSION_SETTINGS,
    )
    try:
        # Read the insert, and confirm nothing: the walsender has sent what we never
        # confirm, so it would hold the shutdown for as long as the stream stays open.
        deadline = time.monotonic() + 30
        while not isinstance(stream.read(0.5), XLogData):
            assert time.monotonic() < deadline, "no change arrived"
        pid = postgres.postmaster_pid()
        assert pid is not None
        os.kill(pid, signal.SIGINT)  # fast shutdown
        with pytest.raises(TransientError, match="shutting down"):
            _read_for(stream, 30)
        time.sleep(2)  # a negative check: the server must still be up after a while
        assert postgres.running(), "the open stream holds the shutdown, as PostgreSQL does"
    finally:
        stream.close()
    wait_for(lambda: not postgres.running(), "PostgreSQL to finish shutting down", 30)
