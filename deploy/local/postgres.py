"""A local PostgreSQL cluster ready for logical replication.

The cluster is configured for what the pipeline needs (``wal_level=logical``, room for
many slots and WAL senders so every test can own its slot) and for a developer machine:
trust authentication on loopback only, and ``fsync=off`` because the data is
throw-away. ``wal_sender_timeout`` is short so a test that abandons a replication
connection frees its slot quickly.

PostgreSQL refuses to run as root, so when the launcher runs as root (CI, containers)
the server runs as the ``postgres`` system user that Debian's package creates.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

from deploy.local.errors import LauncherError, MissingPrerequisite
from deploy.local.process import alive, read_pid, spawn, stop, wait_until

SUPERUSER = "postgres"
SERVER_SETTINGS: dict[str, str] = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_replication_slots": "64",
    "max_wal_senders": "64",
    "max_connections": "200",
    "max_prepared_transactions": "16",
    "wal_sender_timeout": "'10s'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "'256MB'",
    "max_wal_size": "'4GB'",
    "log_min_messages": "warning",
    "log_line_prefix": "'%m [%p] %q%u@%d '",
}


def find_bindir() -> Path:
    """The directory holding ``initdb`` and ``postgres``.

    ``CDC_PG_BINDIR`` wins; then the newest Debian layout ``/usr/lib/postgresql/N/bin``;
    then whatever ``initdb`` is on PATH.
    """
    override = os.environ.get("CDC_PG_BINDIR")
    candidates: list[Path] = [Path(override)] if override else []
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted(
            (p for p in debian.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        candidates += [v / "bin" for v in reversed(versions)]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    raise MissingPrerequisite(
        "PostgreSQL server binaries (initdb, postgres) not found: install Debian's "
        "`postgresql` package (`apt-get install postgresql`, done by `make bootstrap` when "
        "run as root), or point CDC_PG_BINDIR at a directory that has them"
    )


@dataclass(frozen=True, slots=True)
class ServerTls:
    """TLS for a local cluster: PEM ``certificate`` and unencrypted ``key`` (copied into
    the data directory, where the server user can read them)."""

    certificate: Path
    key: Path


@dataclass(frozen=True, slots=True)
class LocalPostgres:
    """One cluster under ``root`` listening on ``127.0.0.1:port``.

    With ``tls`` the server also speaks TLS (``ssl = on``), and every role but the
    superuser must come over TLS with a SCRAM password from TCP: a client that connects
    without TLS, or with a wrong password, is refused, so a test proves its client used
    both. The superuser keeps trust on loopback for the launcher's readiness probe and
    the tests' own setup. These settings are written when the cluster is created."""

    root: Path
    port: int
    tls: ServerTls | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "postgres.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "launcher.pid"

    def postmaster_pid(self) -> int | None:
        """The postmaster's own pid, from ``postmaster.pid`` (first line).

        The launcher's pid file may name a ``runuser`` wrapper (when run as root), which
        does not pass SIGINT/SIGQUIT on; PostgreSQL's shutdown modes need the postmaster.
        """
        try:
            first_line = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except FileNotFoundError:
            return None
        return int(first_line) if first_line.strip().isdigit() else None

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def start(self, *, timeout_s: float = 60.0) -> None:
        bindir = find_bindir()
        user = _service_user()
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bindir, user)
        if user is not None:
            _chown_tree(self.root, user)
        pid = spawn(
            [
                str(bindir / "postgres"),
                "-D",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-k",
                str(self.data_dir),
            ],
            log_file=self.log_file,
            pid_file=self.pid_file,
            user=user,
        )
        wait_until(
            self.accepts_connections,
            what=f"PostgreSQL on port {self.port}",
            timeout_s=timeout_s,
            log_file=self.log_file,
            pid=pid,
        )

    def accepts_connections(self) -> bool:
        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def running(self) -> bool:
        pid = read_pid(self.pid_file)
        return pid is not None and alive(pid)

    def stop(self) -> bool:
        # SIGTERM is PostgreSQL's "smart" shutdown; the launcher escalates if it lingers.
        return stop(self.pid_file, what="PostgreSQL")

    def _initdb(self, bindir: Path, user: str | None) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if user is not None:
            _chown_tree(self.root, user)
        command = [
            str(bindir / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        ]
        if user is not None:
            command = ["runuser", "-u", user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise LauncherError(f"initdb failed ({result.returncode}):\n{result.stderr}")
        settings = dict(SERVER_SETTINGS)
        if self.tls is not None:
            shutil.copyfile(self.tls.certificate, self.data_dir / "server.crt")
            shutil.copyfile(self.tls.key, self.data_dir / "server.key")
            (self.data_dir / "server.key").chmod(0o600)  # the server refuses a readable key
            settings |= {
                "ssl": "on",
                "ssl_cert_file": "'server.crt'",
                "ssl_key_file": "'server.key'",
                "password_encryption": "'scram-sha-256'",
            }
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# written by deploy.local for the CDC pipeline\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")
        with (self.data_dir / "pg_hba.conf").open("w") as hba:
            # Loopback only; replication connections need their own line.
            hba.write("local all all trust\n")
            hba.write("local replication all trust\n")
            if self.tls is None:
                hba.write("host all all 127.0.0.1/32 trust\n")
                hba.write("host replication all 127.0.0.1/32 trust\n")
            else:
                # First match wins: the superuser as before, every other role over TLS
                # with a password, and nothing else (no line matches: refused).
                hba.write(f"host all {SUPERUSER} 127.0.0.1/32 trust\n")
                hba.write(f"host replication {SUPERUSER} 127.0.0.1/32 trust\n")
                hba.write("hostssl all all 127.0.0.1/32 scram-sha-256\n")
                hba.write("hostssl replication all 127.0.0.1/32 scram-sha-256\n")


def _service_user() -> str | None:
    """The unprivileged user to run PostgreSQL as, or None to run as ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise MissingPrerequisite(
            "running as root but there is no `postgres` system user to run the server as: "
            "install Debian's `postgresql` package, or run as a normal user"
        ) from None
    return SUPERUSER


def _chown_tree(root: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for path in [root, *root.rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
