"""A primary and a physical standby of it, for the tests of a primary that fails over
(:mod:`deploy.local.standby`): each on a cluster of the test's own (a failover stops one
and promotes the other), of the major version the test names.

:func:`server_pair` starts the primary and skips the test when that version is not
installed; :meth:`ServerPair.add_standby` makes the standby from it once the test has set
the primary up, and :meth:`ServerPair.dsn` reaches whichever of the two takes writes, as
capture's DSN does in a failover (docs/capture.md, a primary that fails over).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from deploy.local import stack
from deploy.local.errors import MissingPrerequisite
from deploy.local.postgres import SUPERUSER, LocalPostgres, find_bindir
from deploy.local.process import free_port
from deploy.local.standby import create_standby
from schemas.lsn import Lsn, parse_lsn
from tests.plugins.prerequisites import missing

PHYSICAL_SLOT = "standby1"
"""The primary's physical slot the standby streams through."""


@dataclass
class ServerPair:
    primary: LocalPostgres
    root: Path
    standby: LocalPostgres | None = None
    standby_port: int = field(default_factory=free_port)
    """Chosen up front, so :meth:`dsn` names the standby before it is made."""

    def add_standby(self, dbname: str) -> LocalPostgres:
        """A running standby of the primary; ``dbname`` is the database its slot-sync
        worker connects to (17+)."""
        self.standby = create_standby(
            self.primary,
            stack._postgres_root(self.root / "standby"),
            self.standby_port,
            slot=PHYSICAL_SLOT,
            dbname=dbname,
        )
        return self.standby

    def dsn(self, dbname: str) -> str:
        """Both servers, the writable one chosen (``target_session_attrs=read-write``);
        the standby may come later (until then libpq finds nothing on its port)."""
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1,127.0.0.1",
            port=f"{self.primary.port},{self.standby_port}",
            user=SUPERUSER,
            dbname=dbname,
            target_session_attrs="read-write",
        )

    def stop(self) -> None:
        for server in (self.primary, self.standby):
            if server is not None:
                server.stop()
                shutil.rmtree(server.root, ignore_errors=True)


@contextmanager
def server_pair(root: Path, version: int, *, why: str) -> Iterator[ServerPair]:
    """A running primary of PostgreSQL ``version`` under ``root`` (the standby comes
    later); both stopped and deleted afterwards. Without that version the test is
    skipped, saying ``why`` it needs that one."""
    try:
        find_bindir(version)
    except MissingPrerequisite as exc:
        missing(f"PostgreSQL {version} is not installed ({why}): {exc}", exc)
    for place in (root / "primary", root / "standby"):
        stack.clear_orphaned_cluster(place)
    primary = LocalPostgres(stack._postgres_root(root / "primary"), free_port(), version=version)
    pair = ServerPair(primary, root)
    try:
        primary.start()
        yield pair
    finally:
        pair.stop()


def scalar(dsn: str, query: str, *args: object) -> object:
    """The first column of the first row ``query`` returns, None without a row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query.encode(), list(args)).fetchone()
    return None if row is None else row[0]


def wal_received(standby: LocalPostgres) -> Lsn:
    """How far the standby has received the primary's WAL."""
    found = scalar(standby.dsn, "SELECT pg_last_wal_receive_lsn()::text")
    return parse_lsn(str(found)) if found is not None else Lsn(0)
