"""The local stack: one PostgreSQL and one Kafka (and, when asked, an Apicurio Schema
Registry), started together, described in an env file.

``up`` is idempotent: services already running are kept, so ``make up`` twice is safe and
a test session can reuse a stack a developer started. The env file
(``.local/stack.env`` by default) holds ``KEY=value`` lines:

- ``CDC_POSTGRES_DSN`` and ``CDC_KAFKA_BOOTSTRAP_SERVERS``: the raw connection facts,
  read by the test fixtures and the demo;
- ``CAPTURE_POSTGRES__DSN``, ``CAPTURE_KAFKA__BOOTSTRAP_SERVERS`` and
  ``APPLY_KAFKA__BOOTSTRAP_SERVERS``: the same facts under the names the services'
  settings read, so ``set -a; . .local/stack.env`` configures both services;
- ``CDC_SCHEMA_REGISTRY_URL``: the registry's Confluent-compatible API, when the stack
  has one (``up(registry=True)``, ``make up``; :mod:`deploy.local.registry`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from deploy.local.jars import PROJECT_ROOT, resolve
from deploy.local.kafka import LocalKafka
from deploy.local.postgres import LocalPostgres, world_traversable
from deploy.local.process import free_port
from deploy.local.registry import LocalRegistry

STATE_ROOT = PROJECT_ROOT / ".local" / "stack"
ENV_FILE = PROJECT_ROOT / ".local" / "stack.env"


@dataclass(frozen=True, slots=True)
class StackState:
    postgres_root: str
    postgres_port: int
    kafka_root: str
    kafka_port: int
    kafka_controller_port: int
    # Set only by tests that put a proxy in front of the broker (LocalKafka).
    kafka_advertised_port: int | None = None
    # Set once the stack was asked for a registry.
    registry_port: int | None = None
    registry_management_port: int | None = None

    @property
    def postgres(self) -> LocalPostgres:
        return LocalPostgres(Path(self.postgres_root), self.postgres_port)

    @property
    def kafka(self) -> LocalKafka:
        return LocalKafka(
            Path(self.kafka_root),
            self.kafka_port,
            self.kafka_controller_port,
            advertised_port=self.kafka_advertised_port,
        )

    @property
    def registry(self) -> LocalRegistry | None:
        if self.registry_port is None or self.registry_management_port is None:
            return None
        return LocalRegistry(
            Path(self.kafka_root).parent / "registry",
            self.registry_port,
            self.registry_management_port,
        )

    def env(self) -> dict[str, str]:
        dsn = self.postgres.dsn
        bootstrap = self.kafka.bootstrap_servers
        env = {
            "CDC_POSTGRES_DSN": dsn,
            "CDC_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "CAPTURE_POSTGRES__DSN": dsn,
            "CAPTURE_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "APPLY_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        }
        if self.registry is not None:
            env["CDC_SCHEMA_REGISTRY_URL"] = self.registry.url
        return env


def _state_file(root: Path) -> Path:
    return root / "state.json"


def load(root: Path = STATE_ROOT) -> StackState | None:
    try:
        return StackState(**json.loads(_state_file(root).read_text()))
    except FileNotFoundError:
        return None


def up(
    root: Path = STATE_ROOT,
    env_file: Path | None = ENV_FILE,
    *,
    kafka_port: int | None = None,
    kafka_advertised_port: int | None = None,
    registry: bool = False,
) -> StackState:
    """Start whatever of the stack is not running; write the env file.

    ``kafka_port`` and ``kafka_advertised_port`` apply to a new stack only: a test that
    reaches the broker through a proxy listens on the advertised port and forwards to
    ``kafka_port`` (:class:`~deploy.local.kafka.LocalKafka`). ``registry`` adds an
    Apicurio Registry to the stack (kept from then on)."""
    resolve("kafka")
    state = load(root)
    if state is None:
        clear_orphaned_cluster(root)
        state = StackState(
            postgres_root=str(_postgres_root(root)),
            postgres_port=free_port(),
            kafka_root=str(root / "kafka"),
            kafka_port=kafka_port or free_port(),
            kafka_controller_port=free_port(),
            kafka_advertised_port=kafka_advertised_port,
        )
        root.mkdir(parents=True, exist_ok=True)
        _state_file(root).write_text(json.dumps(asdict(state), indent=2))
    if registry and state.registry is None:
        state = replace(state, registry_port=free_port(), registry_management_port=free_port())
        _state_file(root).write_text(json.dumps(asdict(state), indent=2))
    # Checked on a running cluster too: `up` would otherwise keep serving the old version.
    state.postgres.wanted_version()
    if not state.postgres.running():
        state.postgres.start()
    if not state.kafka.running():
        state.kafka.start()
    if state.registry is not None and not state.registry.running():
        state.registry.start()
    if env_file is not None:
        write_env(state, env_file)
    return state


def down(root: Path = STATE_ROOT, *, wipe: bool = False, env_file: Path | None = None) -> list[str]:
    """Stop the stack; with ``wipe``, delete its data too, and ``env_file`` if given (a
    stack of a test's own never deletes the developer's ``.local/stack.env``). Returns
    what was stopped."""
    state = load(root)
    if state is None:
        return []
    stopped = [
        name for name, svc in (("kafka", state.kafka), ("postgres", state.postgres)) if svc.stop()
    ]
    if state.registry is not None and state.registry.stop():
        stopped.append("registry")
    if wipe:
        shutil.rmtree(state.postgres_root, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
        if env_file is not None:
            env_file.unlink(missing_ok=True)
    return stopped


def write_env(state: StackState, env_file: Path) -> None:
    env_file.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Connection settings of the local stack (python -m deploy.local up).",
        "# Load with: set -a; . " + str(env_file) + "; set +a",
    ]
    lines += [f"{k}={v}" for k, v in state.env().items()]
    env_file.write_text("\n".join(lines) + "\n")


def clear_orphaned_cluster(root: Path) -> None:
    """Remove the PostgreSQL cluster a stack at ``root`` would use, when nothing at
    ``root`` records it: as root the cluster lives outside ``root``
    (:func:`_postgres_root`), so deleting ``root`` (``rm -rf .local``, or pytest reusing a
    ``--basetemp``) leaves it behind, and a new stack there would start the old cluster,
    tables and slots included, beside a new, empty Kafka. Stopped first if a killed run
    left it running."""
    cluster = _postgres_root(root)
    if cluster.exists():
        LocalPostgres(root=cluster, port=0).stop()
        shutil.rmtree(cluster)


def _postgres_root(root: Path) -> Path:
    """Where the cluster's files go.

    As root the server runs as the ``postgres`` user, which must be able to reach its data
    directory. A checkout under a private directory (``/root``, a 0700 home) is not
    reachable, so the cluster then lives under the system temp directory instead, in a
    folder named after this stack's root (which lies inside the checkout), so two
    checkouts, or two stacks of one checkout (a test module starts its own), never share
    one.
    """
    preferred = root / "postgres"
    if os.geteuid() != 0 or world_traversable(root):
        return preferred
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"cdc-postgres-{digest}"
