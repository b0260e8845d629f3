"""``python -m pipeline status`` against a real capture, a real apply job (Spark) and a
cluster without a control topic.

The status must read, never write: a cluster without the control topic still has none
afterwards; an errored table's parked records are shown from the control topic by a
process that never imports Spark.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql

from apply.control.table_status import read_table_statuses
from apply.errors import ConfigError as ApplyConfigError
from capture import admin
from capture.publish.control import ControlTopicMissingError
from capture.settings import CaptureSettings
from pipeline.status import PipelineStatus, StatusReader, TableView, main
from schemas.control import TableState
from tests.plugins.capture import CaptureThread, apply_settings_for, capture_settings, current_lsn
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]
REPO = Path(__file__).resolve().parents[2]


def topic_exists(bootstrap: str, topic: str) -> bool:
    return topic in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics


def wait_for_status(
    reader: StatusReader, predicate: Callable[[PipelineStatus], bool], what: str
) -> PipelineStatus:
    """The first status read that satisfies ``predicate``, within 60 s."""
    last: list[PipelineStatus] = []

    def satisfied() -> bool:
        last[:] = [reader.read()]
        return predicate(last[0])

    wait_for(satisfied, what, 60, detail=lambda: f"last status: {last[0]}")
    return last[0]


def table(status: PipelineStatus, name: str) -> TableView:
    (found,) = [t for t in status.tables if t.table == name]
    return found


def test_no_control_topic_is_reported_and_never_created(
    services: Services, pg: Connection, unique_name: str, tmp_path: Path, capsys: Any
) -> None:
    capture = capture_settings(services, unique_name, [])
    apply = apply_settings_for(capture, tmp_path)
    control = capture.kafka.control_topic

    assert main([], capture, apply) == 1
    assert capsys.readouterr().out == f"capture has not started yet (no control topic {control})\n"
    assert main(["--json"], capture, apply) == 1
    document = json.loads(capsys.readouterr().out)
    assert (document["capture_started"], document["healthy"], document["tables"]) == (
        False,
        False,
        [],
    )
    assert document["slot"]["exists"] is False
    # The services' own read-only commands do not create it either.
    with pytest.raises(ControlTopicMissingError, match="capture has not started yet"):
        admin.table_statuses(capture)
    with pytest.raises(ApplyConfigError, match="capture has not started yet"):
        read_table_statuses(apply.kafka)

    assert not topic_exists(services.kafka_bootstrap_servers, control)


def _status_in_a_process_without_spark(capture: CaptureSettings) -> tuple[int, dict[str, Any]]:
    """``main(["--json"])`` in a fresh interpreter; it reports whether pyspark was ever
    imported there."""
    script = (
        "import sys\n"
        "from apply.settings import ApplySettings\n"
        "from capture.settings import CaptureSettings\n"
        "from pipeline.status import main\n"
        "code = main(['--json'], CaptureSettings(), ApplySettings())\n"
        "print('pyspark imported:', 'pyspark' in sys.modules)\n"
        "sys.exit(code)\n"
    )
    kafka = capture.kafka
    env = {
        **os.environ,
        "CAPTURE_POSTGRES__DSN": capture.postgres.dsn,
        "CAPTURE_POSTGRES__SLOT": capture.postgres.slot,
        "CAPTURE_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "CAPTURE_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "CAPTURE_KAFKA__CONTROL_TOPIC": kafka.control_topic,
        "CAPTURE_KAFKA__SCHEMA_TOPIC": kafka.schema_topic,
        "APPLY_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "APPLY_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "APPLY_KAFKA__CONTROL_TOPIC": kafka.control_topic,
        "APPLY_KAFKA__SCHEMA_TOPIC": kafka.schema_topic,
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output, _, marker = done.stdout.rstrip("\n").rpartition("\n")
    assert marker == "pyspark imported: False", done.stdout + done.stderr
    return done.returncode, json.loads(output)


@pytest.mark.slow
def test_status_follows_capture_and_apply_and_shows_an_errored_table(
    spark: Any, services: Services, pg: Connection, unique_name: str, tmp_path: Path, capsys: Any
) -> None:
    schema = unique_name
    s = sql.Identifier(schema)
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    pg.execute(
        sql.SQL(
            "CREATE TABLE {s}.orders (id bigint PRIMARY KEY, amount bigint);"
            "CREATE TABLE {s}.items (id bigint PRIMARY KEY, note text)"
        ).format(s=s)
    )
    orders, items = f"{schema}.orders", f"{schema}.items"
    capture = capture_settings(services, unique_name, [orders, items])
    apply = apply_settings_for(capture, tmp_path)
    from apply.app import ApplyJob  # noqa: PLC0415 - Spark only in this test's process

    runner = CaptureThread(capture)
    runner.start(pg)
    reader = StatusReader(capture, apply)
    try:
        pg.execute(
            sql.SQL("INSERT INTO {}.orders SELECT g, g FROM generate_series(1, 20) g").format(s)
        )
        pg.execute(sql.SQL("INSERT INTO {}.items VALUES (1, 'one'), (2, 'two')").format(s))

        # Captured, not applied: everything waits, and the lag shows it.
        before = wait_for_status(
            reader,
            lambda st: [t.waiting for t in st.tables] == [2, 20],
            "the changes never reached Kafka",
        )
        assert [(t.table, t.capture_state) for t in before.tables] == [
            (items, TableState.STREAMING),
            (orders, TableState.STREAMING),
        ]
        assert before.slot.exists
        assert before.slot.active
        assert not before.slot.lost
        assert before.slot.retained_bytes is not None
        assert before.slot.retained_bytes > 0
        assert before.slot.wal_status in {"reserved", "extended"}
        for t in before.tables:
            assert t.applied_lsn is None
            assert t.lag_bytes is not None
            assert t.lag_bytes > 0
            assert t.lag_s is not None
            assert t.lag_s > 0
            assert (t.apply_errored, t.parked) == (False, 0)
        assert before.healthy
        assert main([], capture, apply) == 0
        printed = capsys.readouterr().out.splitlines()
        assert printed[0].startswith(f"slot {unique_name}: active, wal_status ")
        assert printed[3].split()[:3] == ["TABLE", "CAPTURE", "APPLY"]
        assert printed[4].split()[:3] == [items, "streaming", "ok"]

        # Apply catches up: nothing waits, no lag, however long the tables stay quiet.
        with ApplyJob(apply, spark) as job:
            job.run(threading.Event())
        applied = reader.read()
        for t in applied.tables:
            assert (t.waiting, t.lag_bytes, t.lag_s) == (0, 0, 0.0)
            assert t.applied_lsn is not None
            assert t.applied_lsn <= applied.current_wal_lsn
        items_lsn = table(applied, items).applied_lsn
        assert items_lsn is not None

        # A retype the lake cannot follow, and a change of the other table.
        pg.execute(sql.SQL("ALTER TABLE {}.orders ALTER amount TYPE text").format(s))
        pg.execute(sql.SQL("UPDATE {}.orders SET amount = 'ten' WHERE id = 1").format(s))
        pg.execute(sql.SQL("INSERT INTO {}.items VALUES (3, 'three')").format(s))
        wal = current_lsn(pg)
        lagging = wait_for_status(
            reader,
            lambda st: [t.waiting for t in st.tables] == [1, 1],
            "the new changes never reached Kafka",
        )
        lagging_items = table(lagging, items)
        assert lagging_items.applied_lsn == items_lsn
        assert lagging_items.lag_bytes is not None
        assert lagging_items.lag_bytes >= wal - items_lsn
        assert lagging_items.lag_s is not None
        assert lagging_items.lag_s > 0

        with ApplyJob(apply, spark) as job:
            job.run(threading.Event())

        # Seen by a process that never loads Spark, from the control topic alone.
        code, document = _status_in_a_process_without_spark(capture)
        assert code == 1
        assert document["healthy"] is False
        by_name = {t["table"]: t for t in document["tables"]}
        assert by_name[orders]["capture_state"] == "streaming"
        assert (by_name[orders]["apply_errored"], by_name[orders]["parked"]) == (True, 1)
        assert by_name[orders]["errored"] is True
        assert "SchemaChangeError" in by_name[orders]["apply_error"]
        assert "amount" in by_name[orders]["apply_error"]
        assert by_name[orders]["lag_s"] is None
        assert by_name[orders]["waiting"] == 0, "parked records are not waiting in Kafka"
        assert (by_name[items]["apply_errored"], by_name[items]["lag_bytes"]) == (False, 0)
        assert document["slot"]["active"] is True

        # python -m apply errored answers from the control topic too.
        errored = subprocess.run(
            [sys.executable, "-m", "apply", "errored"],
            cwd=REPO,
            env={
                **os.environ,
                "APPLY_KAFKA__BOOTSTRAP_SERVERS": capture.kafka.bootstrap_servers,
                "APPLY_KAFKA__CONTROL_TOPIC": capture.kafka.control_topic,
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert errored.returncode == 0, errored.stderr
        assert errored.stdout.startswith(f"{orders}: 1 records parked: SchemaChangeError: ")
        assert not runner.errors, runner.errors
    finally:
        reader.close()
        runner.close(pg)
