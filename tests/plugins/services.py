"""PostgreSQL and Kafka for the tests, from the first source that answers:

1. connection settings in the environment (``CDC_POSTGRES_DSN``,
   ``CDC_KAFKA_BOOTSTRAP_SERVERS``): external services, e.g. a stack started by
   ``make up`` or a CI service container;
2. testcontainers, when a Docker engine answers;
3. the project's local launcher (``deploy.local``), which starts real processes.

The same tests run in all three modes. Containers are created lazily inside the fixture
so collection never needs Docker. Each test names its own slots, publications and topics
(:func:`unique_name`) so tests never interfere through shared services.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from deploy.local import stack
from deploy.local.postgres import LocalPostgres
from deploy.local.process import free_port

PG_SERVER_ARGS = (
    "-c wal_level=logical -c max_replication_slots=64 -c max_wal_senders=64 "
    "-c max_prepared_transactions=16 -c wal_sender_timeout=10s"
)
KAFKA_IMAGE = "apache/kafka:4.1.1"
POSTGRES_IMAGE = "postgres:17"
TEST_STACK_ROOT = Path(stack.STATE_ROOT).parent / "test-stack"


@dataclass(frozen=True, slots=True)
class Services:
    postgres_dsn: str
    kafka_bootstrap_servers: str
    mode: str


def _docker_answers() -> bool:
    """Whether a Docker engine answers; asks the CLI so no client socket is left open."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=15,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    dsn = os.environ.get("CDC_POSTGRES_DSN")
    bootstrap = os.environ.get("CDC_KAFKA_BOOTSTRAP_SERVERS")
    if dsn and bootstrap:
        yield Services(dsn, bootstrap, "environment")
        return
    with ExitStack() as cleanup:
        if _docker_answers():
            yield _containers(cleanup, dsn, bootstrap)
            return
        state = stack.load(TEST_STACK_ROOT)
        was_running = state is not None and state.postgres.running() and state.kafka.running()
        state = stack.up(TEST_STACK_ROOT, env_file=None)
        if not was_running:
            cleanup.callback(stack.down, TEST_STACK_ROOT)
        yield Services(
            dsn or state.postgres.dsn, bootstrap or state.kafka.bootstrap_servers, "local"
        )


def _containers(cleanup: ExitStack, dsn: str | None, bootstrap: str | None) -> Services:
    if dsn is None:
        from testcontainers.postgres import PostgresContainer  # noqa: PLC0415

        pg = PostgresContainer(POSTGRES_IMAGE, driver=None).with_command(
            f"postgres {PG_SERVER_ARGS}"
        )
        cleanup.enter_context(pg)
        dsn = pg.get_connection_url()
    if bootstrap is None:
        from testcontainers.kafka import KafkaContainer  # noqa: PLC0415

        kafka = KafkaContainer(KAFKA_IMAGE).with_kraft()
        cleanup.enter_context(kafka)
        bootstrap = kafka.get_bootstrap_server()
    return Services(dsn, bootstrap, "containers")


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A short lowercase identifier unique to this test, usable as a slot, publication,
    table or topic name."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:24]
    return f"t_{base}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pg(services: Services) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the test database."""
    with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def pgoutput_slot(pg: psycopg.Connection[tuple[object, ...]], unique_name: str) -> Iterator[str]:
    """A table ``(id int PRIMARY KEY, label text)``, a publication of it and a pgoutput
    slot, all named ``unique_name``; dropped after the test, the slot once its walsender
    has exited (a test's replication connection may take a moment to go)."""
    pg.execute(f"CREATE TABLE {unique_name} (id int PRIMARY KEY, label text)")
    pg.execute(f"CREATE PUBLICATION {unique_name} FOR TABLE {unique_name}")
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [unique_name])
    yield unique_name
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            pg.execute("SELECT pg_drop_replication_slot(%s)", [unique_name])
            break
        except psycopg.errors.ObjectInUse:
            time.sleep(0.5)
    pg.execute(f"DROP PUBLICATION {unique_name}")
    pg.execute(f"DROP TABLE {unique_name}")


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[LocalPostgres]:
    """A PostgreSQL of this test's own, for tests that shut it down or break its WAL."""
    stack.clear_orphaned_cluster(tmp_path)
    server = LocalPostgres(root=stack._postgres_root(tmp_path), port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
