"""A primary fails over to a standby that has no copy of capture's slot: capture stops
with the resync and streams nothing from the promoted server.

Before PostgreSQL 17 a physical standby keeps no logical slot at all, so every failover
ends like this; from 17, one whose copy of the slot was not failover-ready yet (still
temporary: the promotion drops it). A primary and a standby made from it with
``pg_basebackup`` (:mod:`deploy.local.standby`); capture runs as its own process, as a
user runs it, and knows both servers through one multi-host DSN with
``target_session_attrs=read-write``, so it reaches the promoted standby by itself.

Capture streams a workload from the primary and checkpoints its slot; then the primary
is stopped in immediate mode, once the standby has received all its WAL, and the
standby promoted. Capture identifies the same cluster on a new timeline that forked
after everything it held (capture/source/server_identity.py), finds no slot there, and
must exit with a configuration error (status 2) that says why and names the resync:
never make a new slot, which would start at the new primary's current WAL and skip the
changes in between (capture/source/setup.py, ``check_slot_history``).

The cases: PostgreSQL 15 (the project's default server) with the workload applied (as
apply reports it on the control topic), and with it only published and checkpointed,
nothing applied yet; PostgreSQL 18 with a standby made after the workload, whose copy of
the slot stays temporary while nothing is applied (the slot does not move).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from capture.publish.control import ControlReader
from deploy.local.postgres import LocalPostgres
from deploy.local.standby import promote
from schemas.lsn import Lsn
from tests.plugins.failover import ServerPair, scalar, server_pair, wal_received
from tests.plugins.pipeline import Pipeline, create_database, current_wal, slot_confirmed
from tests.plugins.services import Services
from tests.plugins.topics import read_to_end, record_count, report_applied
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow

TRANSACTIONS = 10
ROWS_PER_TRANSACTION = 5
EXIT_CONFIG_ERROR = 2
"""``python -m capture``'s exit status for a configuration error (capture/__main__.py)."""


@dataclass(frozen=True)
class Case:
    version: int
    applied: bool
    """Whether apply reports the workload applied before the failover."""
    standby_after_workload: bool
    """Whether the standby is made once the workload is published (else before capture
    starts): on 17+ its copy of the slot then stays temporary, never failover-ready."""


CASES = {
    "pg15-applied": Case(15, applied=True, standby_after_workload=False),
    "pg15-checkpointed": Case(15, applied=False, standby_after_workload=False),
    "pg18-unsynchronized": Case(18, applied=False, standby_after_workload=True),
}


def _confirmed(dsn: str, slot: str) -> Lsn:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return slot_confirmed(conn, slot) or Lsn(0)


def _checkpoint(pipeline: Pipeline) -> Lsn | None:
    settings, _ = pipeline.settings()
    reader = ControlReader(settings.kafka, None)
    try:
        return reader.load(pipeline.name).checkpoint
    finally:
        reader.close()


def _copy_of_slot(standby: LocalPostgres, slot: str) -> tuple[object, object] | None:
    """``(synced, temporary)`` of the standby's copy of ``slot``; None without one."""
    with psycopg.connect(standby.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
    return None if row is None else (row[0], row[1])


def _transient_failures(pipeline: Pipeline) -> int:
    """The attempts capture has logged as failed and to be retried, so far."""
    return pipeline.capture.log.read_text(errors="replace").count("transient failure")


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_capture_refuses_a_promoted_standby_without_its_slot(
    shared_services: Services, unique_name: str, tmp_path: Path, case: Case
) -> None:
    why = "a standby with no copy of capture's slot"
    with server_pair(tmp_path / "servers", case.version, why=why) as servers:
        _refused_after_failover(servers, shared_services, unique_name, tmp_path, case)


def _refused_after_failover(
    servers: ServerPair, shared_services: Services, unique_name: str, tmp_path: Path, case: Case
) -> None:
    primary = servers.primary
    source = create_database(primary.dsn, unique_name)
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    if not case.standby_after_workload:
        servers.add_standby(unique_name)
    pipeline = Pipeline(
        name=unique_name,
        dsn=servers.dsn(unique_name),
        bootstrap=shared_services.kafka_bootstrap_servers,
        tables=("public.t",),
        workdir=tmp_path,
        capture_overrides={"CAPTURE_SNAPSHOT_MODE": "never"},
    )
    bootstrap = shared_services.kafka_bootstrap_servers
    topic = f"{unique_name}.public.t"
    control = f"{unique_name}._control"
    rows = TRANSACTIONS * ROWS_PER_TRANSACTION
    try:
        pipeline.capture.start()
        wait_for(
            lambda: _confirmed(source, unique_name) > 0,
            "capture to create its slot",
            60,
            detail=pipeline.logs,
        )
        # WAL with nothing for capture lets it confirm, so it checkpoints the slot before
        # the workload (which, unapplied, holds the slot where it is).
        start = _confirmed(source, unique_name)
        with psycopg.connect(source, autocommit=True) as conn:
            conn.execute("SELECT pg_logical_emit_message(true, 'test', 'before the workload')")
        wait_for(
            lambda: _confirmed(source, unique_name) > start,
            "capture to checkpoint its slot",
            30,
            detail=pipeline.logs,
        )
        with psycopg.connect(source, autocommit=True) as conn:
            for first in range(0, rows, ROWS_PER_TRANSACTION):
                conn.execute(
                    "INSERT INTO public.t SELECT i, 'on the old primary' "
                    "FROM generate_series(%s::int, %s::int) i",
                    [first + 1, first + ROWS_PER_TRANSACTION],
                )
            workload_end = current_wal(conn)
        wait_for(
            lambda: record_count(bootstrap, topic) >= rows,
            "capture to publish the workload",
            60,
            detail=pipeline.logs,
        )
        if case.applied:
            report_applied(bootstrap, control, read_to_end(bootstrap, topic))
            # Once applied, capture confirms past the workload, its checkpoint first.
            wait_for(
                lambda: _confirmed(source, unique_name) >= workload_end,
                "capture to confirm the applied workload",
                30,
                detail=pipeline.logs,
            )
        standby = servers.standby or servers.add_standby(unique_name)
        assert scalar(standby.dsn, "SELECT pg_is_in_recovery()") is True
        if case.standby_after_workload and case.version >= 17:
            # The slot-sync worker copies the slot, but the copy stays temporary: the
            # primary's slot has not moved past a point the standby can decode from.
            wait_for(
                lambda: _copy_of_slot(standby, unique_name) == (True, True),
                f"the standby to keep a temporary copy of slot {unique_name}",
                30,
            )
        # The standby has every change capture saw: the timeline forks after all of them,
        # so the server identity check lets the new primary through, and the slot's
        # absence is what stops capture.
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            written = current_wal(conn)
        wait_for(lambda: wal_received(standby) >= written, f"the standby to receive {written}", 30)
        failures = _transient_failures(pipeline)
        primary.stop_immediately()
        wait_for(
            lambda: _transient_failures(pipeline) > failures,
            "capture to lose the primary",
            30,
            detail=pipeline.logs,
        )
        # What capture had when the primary died: nothing may follow it.
        published = record_count(bootstrap, topic)
        control_records = record_count(bootstrap, control)
        checkpoint = _checkpoint(pipeline)
        assert published == rows
        assert checkpoint is not None, "capture wrote no slot checkpoint"
        if case.applied:
            assert checkpoint >= workload_end
        promote(standby)
        standby_dsn = psycopg.conninfo.make_conninfo(
            host="127.0.0.1", port=str(standby.port), user="postgres", dbname=unique_name
        )
        with psycopg.connect(standby_dsn, autocommit=True) as conn:
            # Changes on the new primary that a new slot would have streamed from, with
            # the gap before them.
            conn.execute("INSERT INTO public.t VALUES (0, 'on the new primary')")

        assert pipeline.capture.process is not None
        try:
            status = pipeline.capture.process.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"capture kept running on the promoted standby\n{pipeline.logs()}")
        log = pipeline.capture.log.read_text(errors="replace")
        assert status == EXIT_CONFIG_ERROR, log[-4000:]
        assert "the source moved from timeline 1 to 2" in log, log[-4000:]
        refusal = log[log.rindex("configuration error: ") :]
        assert f"replication slot {unique_name} does not exist" in refusal
        assert "this server is a promoted standby" in refusal
        assert "before PostgreSQL 17 a standby keeps no logical slots" in refusal
        if case.applied:
            assert f"the control topic shows applied changes for {topic}" in refusal
        else:
            assert "capture streamed it up to" in refusal
        assert "Resync the pipeline: stop capture and apply" in refusal
        assert "apply and apply-* under APPLY_LAKE__CHECKPOINT_ROOT" in refusal
        assert "CAPTURE_SNAPSHOT_MODE=initial" in refusal
        # It streamed once, from the old primary, and never from the new one.
        assert log.count(f"streaming slot {unique_name} from") == 1, log[-4000:]

        slots = scalar(
            standby_dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'"
        )
        assert slots == 0, "capture made a slot on the promoted standby"
        assert record_count(bootstrap, topic) == published
        assert record_count(bootstrap, control) == control_records
        assert _checkpoint(pipeline) == checkpoint
        assert scalar(standby_dsn, "SELECT count(*) FROM public.t") == rows + 1
    finally:
        pipeline.stop()
