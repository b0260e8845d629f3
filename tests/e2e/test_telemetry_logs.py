"""The logs of a real capture + apply run, in text and then in JSON, never hold a row's
value nor the PostgreSQL password; the processes serve their probes on ports of their
own and log progress.

A sentinel string is written into the key and into a column of rows that flow the whole
way (the slot is confirmed past them only once apply has them in Delta), once while both
services log text and once after a restart in JSON; the password is given to capture
the way a deployment gives it (``CAPTURE_POSTGRES__PASSWORD``) for a role it connects as.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.plugins.pipeline import Pipeline, create_database, wait_caught_up
from tests.plugins.services import Services
from tests.plugins.telemetry import status
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow
Connection = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def role(pg: Connection, unique_name: str) -> Iterator[tuple[str, str]]:
    """A login role with a password (its name, the password), dropped afterwards."""
    name, password = f"{unique_name}_r", f"pw-{uuid.uuid4().hex}"
    pg.execute(
        sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(password)
        )
    )
    yield name, password
    pg.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def _write_sentinel(dsn: str, sentinel: str, first_id: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO public.notes SELECT %s || '-' || g, %s "
            "FROM generate_series(%s::int, %s::int) g",
            [sentinel, sentinel, first_id, first_id + 9],
        )
        conn.execute(
            "UPDATE public.notes SET body = body || %s WHERE key = %s",
            [sentinel, f"{sentinel}-{first_id}"],
        )


def _answers(url: str, path: str) -> bool:
    return status(url, path) == 200


def _restart_section(log: Path, name: str) -> str:
    return log.read_text(errors="replace").rsplit(f"==== start {name} at", 1)[-1]


def test_logs_hold_no_row_value_and_no_password(
    services: Services,
    pg: Connection,
    unique_name: str,
    role: tuple[str, str],
    tmp_path: Path,
) -> None:
    user, password = role
    dsn = create_database(services.postgres_dsn, unique_name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.notes (key text PRIMARY KEY, body text)")
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        info["user"] = user
        role_dsn = psycopg.conninfo.make_conninfo(
            **{k: str(v) for k, v in info.items() if v is not None}
        )
        pipeline = Pipeline(
            name=unique_name,
            dsn=dsn,
            bootstrap=services.kafka_bootstrap_servers,
            tables=("public.notes",),
            workdir=tmp_path,
            capture_dsn=role_dsn,
        )
        pipeline.capture.env["CAPTURE_POSTGRES__PASSWORD"] = password
        pipeline.capture.env["CAPTURE_LOG__PROGRESS_INTERVAL_S"] = "1"
        sentinel = f"sentinel{uuid.uuid4().hex}"
        try:
            # Text logs.
            pipeline.capture.start()
            pipeline.apply.start()
            for url in (pipeline.capture.metrics_url(300), pipeline.apply.metrics_url(300)):
                wait_for(partial(_answers, url, "/healthz"), f"{url} alive", 60)
            _write_sentinel(dsn, sentinel, 1)
            wait_caught_up(pipeline, timeout_s=300)
            pipeline.stop()
            assert "progress: " in _restart_section(pipeline.capture.log, "capture")

            # JSON logs, after a restart.
            for service, prefix in ((pipeline.capture, "CAPTURE"), (pipeline.apply, "APPLY")):
                service.env[f"{prefix}_LOG__FORMAT"] = "json"
                service.start()
            capture_url = pipeline.capture.metrics_url(300)
            apply_url = pipeline.apply.metrics_url(300)
            assert capture_url != apply_url
            wait_for(partial(_answers, apply_url, "/readyz"), "apply ready", 300)
            _write_sentinel(dsn, sentinel, 100)
            wait_caught_up(pipeline, timeout_s=300)
            pipeline.stop()
        finally:
            pipeline.stop()

        logs = {
            service.name: service.log.read_text(errors="replace")
            for service in (pipeline.capture, pipeline.apply)
        }
        for name, text in logs.items():
            assert sentinel not in text, f"a row value is in {name}'s log"
            assert password not in text, f"the password is in {name}'s log"
        entries = [
            json.loads(line)
            for name in ("capture", "apply")
            for line in _restart_section(tmp_path / f"{name}.log", name).splitlines()
            if line.startswith("{")
        ]
        assert entries, "no JSON lines after the restart"
        assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
        assert any(e.get("table") == "public.notes" and "batch_id" in e for e in entries)
        assert any(e["message"].startswith("progress: ") and "lsn" in e for e in entries)
    finally:
        with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s AND NOT active",
                [unique_name],
            )
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(unique_name)
                )
            )
