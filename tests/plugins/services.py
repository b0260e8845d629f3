"""PostgreSQL and Kafka for the tests, from the first source that answers:

1. connection settings in the environment (``CDC_POSTGRES_DSN``,
   ``CDC_KAFKA_BOOTSTRAP_SERVERS``): external services, e.g. a stack started by
   ``make up`` or a CI service container;
2. testcontainers, when a Docker engine answers;
3. the project's local launcher (``deploy.local``), which starts real processes.

The same tests run in all three modes. ``shared_services`` (session) is that choice;
``services``, what tests ask for, is per module: a module that runs on several
PostgreSQL major versions gets each version's server there
(:mod:`tests.plugins.postgres_versions`). Containers are created lazily inside the fixture
so collection never needs Docker. Each test names its own slots, publications and topics
(:func:`unique_name`) so tests never interfere through shared services.

The suite runs in several worker processes at once (pytest-xdist, see
:mod:`tests.plugins.parallel`), and every worker asks for the same local stack. The first
to ask starts it under a file lock, the others find it running; the run that started it
(named by ``CDC_TEST_RUN_ID``, which the controlling process sets and its workers inherit)
stops it when the whole run ends, in the controlling process, after every worker is done.
A stack that was already running (``make up``, or a developer's earlier run) is left
running, as before.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from deploy.local import stack
from deploy.local.postgres import LocalPostgres, configured_version, find_bindir, server_version
from deploy.local.process import free_port

PG_SERVER_ARGS = (
    "-c wal_level=logical -c max_replication_slots=64 -c max_wal_senders=64 "
    "-c max_prepared_transactions=16 -c wal_sender_timeout=10s"
)
KAFKA_IMAGE = "apache/kafka:4.1.1"
POSTGRES_IMAGE = "postgres:17"
TEST_STACK_ROOT = Path(stack.STATE_ROOT).parent / "test-stack"
# Beside the stack's root, not in it: ``stack.down(wipe=True)`` deletes the root.
_STACK_LOCK = TEST_STACK_ROOT.parent / "test-stack.lock"
_STACK_OWNER = TEST_STACK_ROOT.parent / "test-stack.owner"
RUN_ID_ENV = "CDC_TEST_RUN_ID"


def pytest_configure(config: pytest.Config) -> None:
    """Name this run once, in the controlling process; xdist workers inherit the name."""
    os.environ.setdefault(RUN_ID_ENV, uuid.uuid4().hex)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the shared stack if this run started it: in the controlling process only
    (a worker finishing early must not stop what the others still use)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with _stack_lock():
        owner = _STACK_OWNER.read_text() if _STACK_OWNER.exists() else None
        if owner is not None and owner == os.environ.get(RUN_ID_ENV):
            stack.down(TEST_STACK_ROOT)
            _STACK_OWNER.unlink()


def _stack_lock() -> AbstractContextManager[None]:
    """Held while the shared stack is started or stopped, by any process of any run."""
    return file_lock(_STACK_LOCK)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing), across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
def shared_services() -> Iterator[Services]:
    """The run's PostgreSQL and Kafka (module docstring); a session-scoped fixture that
    needs them asks for this one (``services`` is per module)."""
    dsn = os.environ.get("CDC_POSTGRES_DSN")
    bootstrap = os.environ.get("CDC_KAFKA_BOOTSTRAP_SERVERS")
    if dsn and bootstrap:
        yield Services(dsn, bootstrap, "environment")
        return
    with ExitStack() as cleanup:
        if _docker_answers():
            yield _containers(cleanup, dsn, bootstrap)
            return
        with _stack_lock():
            state = stack.load(TEST_STACK_ROOT)
            was_running = state is not None and state.postgres.running() and state.kafka.running()
            if state is not None and not was_running and _other_version(state.postgres):
                # Test data only: a run asking for another CDC_POSTGRES_VERSION starts over.
                stack.down(TEST_STACK_ROOT, wipe=True)
            state = stack.up(TEST_STACK_ROOT, env_file=None)
            if not was_running:
                _STACK_OWNER.write_text(os.environ[RUN_ID_ENV])
        yield Services(
            dsn or state.postgres.dsn, bootstrap or state.kafka.bootstrap_servers, "local"
        )


def _other_version(postgres: LocalPostgres) -> bool:
    """Whether the run wants another major version than the cluster's: the one
    CDC_POSTGRES_VERSION names, else the default build's (a cluster made by an earlier
    run on 18 must not carry a plain run to 18 too)."""
    made_by = postgres.cluster_version()
    if made_by is None:
        return False
    wanted = configured_version()
    return made_by != (wanted if wanted is not None else server_version(find_bindir()))


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
