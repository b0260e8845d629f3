"""A physical standby of a local PostgreSQL, and the two moves of a failover: the
primary stopped hard, the standby promoted.

From PostgreSQL 17 the standby keeps capture's failover slot: it has what 17+ needs to
synchronize logical failover slots
(https://www.postgresql.org/docs/current/logicaldecoding-explanation.html#LOGICALDECODING-REPLICATION-SLOTS-SYNCHRONIZATION):

- a physical slot on the primary (:func:`create_standby` makes it before the base
  backup, so the primary keeps every WAL segment the copy still needs), named in the
  standby's ``primary_slot_name``;
- ``hot_standby_feedback = on`` and ``sync_replication_slots = on`` on the standby, and a
  ``dbname`` in its ``primary_conninfo`` (the slot-sync worker reads the primary's
  ``pg_replication_slots`` over an ordinary connection to that database);
- ``wal_level = logical`` on the standby too (its slot-sync worker refuses to run
  without it): it comes with the primary's ``postgresql.conf`` in the base backup.

On the primary, ``synchronized_standby_slots`` names the physical slot, so a logical
walsender sends capture no change the standby has not flushed: a change capture published
but the promoted standby never had would be in the lake and not in the source, and the
new primary would write other transactions at the LSNs it had. It is set only once the
base backup is taken: a standby that inherited it would, once promoted, name a physical
slot it does not have, and its logical walsenders would wait for that slot forever.

Before 17 none of this exists (``sync_replication_slots`` and
``synchronized_standby_slots`` are unknown settings there, and a server refuses to start
with an unknown one in its configuration): the standby streams the primary's WAL through
the same physical slot and keeps no logical slot at all, which is the failover capture
must refuse to stream on from (docs/capture.md, a primary that fails over).

Everything runs as the server's service user when we run as root
(:mod:`deploy.local.postgres`), like the primary.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
from psycopg import sql

from deploy.local.errors import LauncherError
from deploy.local.postgres import (
    SUPERUSER,
    LocalPostgres,
    chown_tree,
    find_bindir,
    reachable_bindir,
    service_user,
)

FAILOVER_SLOTS_SINCE = 17
"""The first major version whose standbys keep (synchronize) logical failover slots."""


def create_standby(
    primary: LocalPostgres, root: Path, port: int, *, slot: str, dbname: str = "postgres"
) -> LocalPostgres:
    """A running physical standby of the running ``primary``, under ``root`` on ``port``.

    ``slot`` names the physical slot made on the primary for it; ``dbname`` the database
    its slot-sync worker connects to (any database of the primary will do). From
    PostgreSQL 17 the standby keeps the primary's failover slots, and the primary then
    holds logical changes back until this standby has flushed them
    (``synchronized_standby_slots``); before 17 it is a plain physical standby with no
    logical slot (module docstring)."""
    version = primary.cluster_version()
    if version is None:
        raise LauncherError(f"no PostgreSQL cluster in {primary.data_dir} to make a standby of")
    standby = LocalPostgres(root=root, port=port, version=version)
    if standby.data_dir.exists():
        raise LauncherError(f"{standby.data_dir} exists: a base backup needs an empty place")
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
        if exists is None:
            # immediately_reserve: the slot holds WAL from now, before the copy starts.
            conn.execute("SELECT pg_create_physical_replication_slot(%s, true)", [slot])
    _base_backup(primary, standby, version, slot=slot, dbname=dbname)
    standby.start()
    if not keeps_failover_slots(version):
        return standby
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER SYSTEM SET synchronized_standby_slots = {}").format(sql.Literal(slot))
        )
        conn.execute("SELECT pg_reload_conf()")
    return standby


def keeps_failover_slots(version: int) -> bool:
    """Whether a standby of PostgreSQL ``version`` can keep its primary's failover slots
    (slot synchronization came with 17)."""
    return version >= FAILOVER_SLOTS_SINCE


def _base_backup(
    primary: LocalPostgres, standby: LocalPostgres, version: int, *, slot: str, dbname: str
) -> None:
    """``pg_basebackup -R`` of ``primary`` (PostgreSQL ``version``) into ``standby``'s data
    directory, then the standby's own settings (in ``postgresql.auto.conf``, after what
    ``-R`` wrote there, so they win)."""
    bindir = find_bindir(version)
    user = service_user()
    if user is not None:
        bindir = reachable_bindir(bindir, user)
    standby.root.mkdir(parents=True, exist_ok=True)
    if user is not None:
        chown_tree(standby.root, user)
    conninfo = psycopg.conninfo.make_conninfo(
        host="127.0.0.1", port=str(primary.port), user=SUPERUSER, dbname=dbname
    )
    command = [
        str(bindir / "pg_basebackup"),
        "--pgdata",
        str(standby.data_dir),
        "--dbname",
        conninfo,
        "--slot",
        slot,
        "--write-recovery-conf",
        "--wal-method=stream",
        "--checkpoint=fast",
        "--no-sync",
    ]
    if user is not None:
        command = ["runuser", "-u", user, "--", *command]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    if result.returncode != 0:
        raise LauncherError(f"pg_basebackup failed ({result.returncode}):\n{result.stderr}")
    with (standby.data_dir / "postgresql.auto.conf").open("a") as conf:
        conf.write(standby_settings(conninfo, slot, version=version))


def standby_settings(primary_conninfo: str, slot: str, *, version: int) -> str:
    """The ``postgresql.conf`` lines of a standby of PostgreSQL ``version`` streaming from
    the primary ``primary_conninfo`` reaches through the physical slot ``slot``. From 17
    it synchronizes failover slots, and ``primary_conninfo`` must name a ``dbname``;
    before, the settings that do not exist yet are left out."""
    syncs = keeps_failover_slots(version)
    if syncs and not psycopg.conninfo.conninfo_to_dict(primary_conninfo).get("dbname"):
        raise LauncherError(
            f"primary_conninfo {primary_conninfo!r} names no dbname: the standby's slot-sync "
            "worker connects to a database of the primary"
        )
    settings = {
        "primary_conninfo": primary_conninfo,
        "primary_slot_name": slot,
        "hot_standby_feedback": "on",
    }
    if syncs:
        settings["sync_replication_slots"] = "on"
    what = "that keeps failover slots" if syncs else "(no slot synchronization before 17)"
    lines = [f"# written by deploy.local for a PostgreSQL {version} standby {what}"]
    for key, value in settings.items():
        quoted = value.replace("'", "''")  # a string literal of the configuration file
        lines.append(f"{key} = '{quoted}'")
    return "\n".join(lines) + "\n"


def promote(standby: LocalPostgres, *, timeout_s: int = 60) -> None:
    """Promote ``standby`` to a primary; return once it accepts writes."""
    with psycopg.connect(standby.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_promote(true, %s)", [timeout_s]).fetchone()
    if row is None or not row[0]:
        raise LauncherError(
            f"the standby on port {standby.port} was not promoted within {timeout_s} s; see "
            f"{standby.log_file}"
        )
