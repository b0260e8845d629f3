"""The apply job, submitted with ``spark-submit`` to a real Spark standalone cluster,
applies inserts, updates and deletes of two tables, and the lake equals the source.

The cluster is a master and two workers of one core each (:mod:`tests.plugins.spark_cluster`);
the job's executors are separate JVMs started by the workers, so the Kafka source's
reads, the decoding and the MERGE's joins and writes run away from the driver. Lake and
checkpoints are a directory of the test, storage every process of the machine shares,
as a cluster shares a distributed file system or object store. The project's code
reaches the executors the way it reaches the driver: it is installed in the interpreter
``PYSPARK_PYTHON`` names (the venv here, the apply image in a cluster; docs/apply.md,
Scaling out).

Two rounds of changes, each waited for until the slot is confirmed past it (capture
confirms only what apply has committed to Delta), so the second round's updates and
deletes are MERGEd into files the first round wrote; the second round also adds a
column, which runs Python workers on the executors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import apply.__main__ as entry_point
from deploy.local.spark_cluster import LocalSparkCluster
from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.lake import read_delta_rs_query
from tests.plugins.pipeline import (
    Service,
    wait_service_applied,
)
from tests.plugins.services import Services

pytestmark = pytest.mark.slow
Connection = psycopg.Connection[tuple[Any, ...]]


def _create_tables(pg: Connection, schema: str) -> None:
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pg.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, owner text NOT NULL, balance bigint)").format(
            sql.Identifier(schema, "accounts")
        )
    )
    pg.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, kind text)").format(
            sql.Identifier(schema, "events")
        )
    )


def _first_round(pg: Connection, schema: str) -> None:
    accounts, events = sql.Identifier(schema, "accounts"), sql.Identifier(schema, "events")
    pg.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, 'owner-' || g, g * 10 FROM generate_series(1, 20) g"
        ).format(accounts)
    )
    pg.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'created' FROM generate_series(1, 10) g").format(events)
    )


def _second_round(pg: Connection, schema: str) -> None:
    accounts, events = sql.Identifier(schema, "accounts"), sql.Identifier(schema, "events")
    pg.execute(sql.SQL("UPDATE {} SET balance = balance + 100 WHERE id <= 5").format(accounts))
    pg.execute(sql.SQL("DELETE FROM {} WHERE id BETWEEN 6 AND 8").format(accounts))
    pg.execute(sql.SQL("INSERT INTO {} VALUES (21, 'owner-21', NULL)").format(accounts))
    # A new column: apply adds it with an empty append, a DataFrame made on the driver
    # whose partitions the executors compute with Python workers (docs/apply.md).
    pg.execute(sql.SQL("ALTER TABLE {} ADD COLUMN tier text").format(accounts))
    pg.execute(sql.SQL("UPDATE {} SET tier = 'gold' WHERE id IN (1, 21)").format(accounts))
    pg.execute(sql.SQL("UPDATE {} SET kind = 'shipped' WHERE id <= 3").format(events))
    pg.execute(sql.SQL("DELETE FROM {} WHERE id >= 9").format(events))


EXPECTED_ACCOUNTS = [
    (1, "owner-1", 110, "gold"),
    *[(i, f"owner-{i}", i * 10 + 100, None) for i in range(2, 6)],
    *[(i, f"owner-{i}", i * 10, None) for i in range(9, 21)],
    (21, "owner-21", None, "gold"),
]
EXPECTED_EVENTS = [
    *[(i, "shipped") for i in range(1, 4)],
    *[(i, "created") for i in range(4, 9)],
]


def _submitted_apply(
    services: Services, cluster: LocalSparkCluster, name: str, workdir: Path
) -> Service:
    """``python -m apply`` under ``spark-submit --master spark://...`` (docs/apply.md)."""
    from deploy.local.jars import resolve, spark_jars  # noqa: PLC0415 - resolves when run

    resolve("spark")
    env = {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # The driver on loopback, where the executors reach it.
        "SPARK_LOCAL_IP": "127.0.0.1",
        "APPLY_KAFKA__BOOTSTRAP_SERVERS": services.kafka_bootstrap_servers,
        "APPLY_KAFKA__TOPIC_PREFIX": name,
        "APPLY_KAFKA__CONTROL_TOPIC": f"{name}._control",
        "APPLY_KAFKA__SCHEMA_TOPIC": f"{name}._schemas",
        "APPLY_LAKE__ROOT": str(workdir / "lake"),
        "APPLY_LAKE__CHECKPOINT_ROOT": str(workdir / "checkpoints"),
        "APPLY_TRIGGER__INTERVAL": "1 second",
        "APPLY_SPARK__APP_NAME": name,
        "APPLY_TABLE_PARALLELISM": "2",
        "APPLY_METRICS__ENABLED": "false",
    }
    argv = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        cluster.master_url,
        "--deploy-mode",
        "client",
        "--driver-memory",
        "1g",
        "--executor-memory",
        "512m",
        # One shuffle partition per executor core: the default four would queue.
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.log.level=WARN",
        "--jars",
        ",".join(spark_jars()),
        str(Path(entry_point.__file__)),
    ]
    service = Service("apply", argv, {**_base_env(), **env}, workdir / "apply.log")
    workdir.mkdir(parents=True, exist_ok=True)
    return service


def _base_env() -> dict[str, str]:
    """This process's environment without any service's settings or Spark's."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("APPLY_", "CAPTURE_", "CDC_", "PYSPARK_", "SPARK_"))
    }


def _lake_rows(path: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    table = read_delta_rs_query(str(path)).select(columns).sort_by("id")
    return [tuple(row[c] for c in columns) for row in table.to_pylist()]


def _source_rows(pg: Connection, table: sql.Identifier) -> list[tuple[Any, ...]]:
    return pg.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(table)).fetchall()


def test_apply_on_a_standalone_cluster_makes_the_lake_equal_the_source(
    services: Services,
    spark_cluster: LocalSparkCluster,
    pg: Connection,
    unique_name: str,
    tmp_path: Path,
) -> None:
    name = unique_name
    _create_tables(pg, name)
    tables = [f"{name}.accounts", f"{name}.events"]
    capture = CaptureThread(capture_settings(services, name, tables))
    apply = _submitted_apply(services, spark_cluster, name, tmp_path)
    try:
        capture.start(pg)
        apply.start()
        _first_round(pg, name)
        wait_service_applied(pg, name, apply, timeout_s=300)
        _second_round(pg, name)
        wait_service_applied(pg, name, apply, timeout_s=300)
        # spark-submit's JVM is the driver's parent and exits 143 on SIGTERM, however
        # cleanly the job stops; the lake below is what the test judges.
        apply.terminate()
        accounts = _source_rows(pg, sql.Identifier(name, "accounts"))
        events = _source_rows(pg, sql.Identifier(name, "events"))
    finally:
        if apply.running():
            apply.kill()
        capture.close(pg)
        pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
    assert not capture.errors, capture.errors

    log = apply.log.read_text(errors="replace")
    assert f"Spark master {spark_cluster.master_url}, application {name}" in log
    # The work ran on executors the workers started: each worker holds an executor
    # directory of the application.
    app_id = _application_id(spark_cluster, name)
    for worker in spark_cluster.nodes:
        assert list((worker.work_dir / app_id).glob("*/stderr")), f"no executor on {worker.root}"

    assert accounts == EXPECTED_ACCOUNTS
    assert events == EXPECTED_EVENTS
    lake = tmp_path / "lake" / name
    assert _lake_rows(lake / "accounts", ["id", "owner", "balance", "tier"]) == accounts
    assert _lake_rows(lake / "events", ["id", "kind"]) == events


def _application_id(cluster: LocalSparkCluster, name: str) -> str:
    status = cluster.status()
    assert status is not None, "the Spark master does not answer"
    apps = [a for a in status["activeapps"] + status["completedapps"] if a["name"] == name]
    assert len(apps) == 1, f"the master knows {len(apps)} applications named {name}"
    return str(apps[0]["id"])
