"""Schema changes the lake must survive, through the whole pipeline: PostgreSQL ->
capture -> Kafka -> apply (Spark) -> Delta.

- ``ADD COLUMN ... DEFAULT 7`` and ``DEFAULT clock_timestamp()`` on streaming tables
  holding rows, while writes go on: capture resyncs each table online (no restart) and
  the lake ends equal to the source, every row and column. ``ADD COLUMN`` without a
  default resyncs nothing (no TRUNCATE on its topic) and the lake is equal too.
- ``ALTER COLUMN v TYPE text``: apply parks the table with a clear error, the other
  table goes on; the documented recovery (``capture resync``, restart capture, apply)
  brings it back equal to the source, with its lake table kept and with it deleted, and
  ``apply reapply`` then finds nothing left to do.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from apply.app import ApplyJob
from apply.batch import ApplyContext
from apply.lake.dead_letter import dead_letter_path, errored_tables
from apply.lake.spark_merge import transaction_app_id
from apply.reapply import reapply_app_id, reapply_table
from apply.settings import ApplySettings, LakeSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture import admin
from capture.settings import CaptureSettings
from schemas.control import TableState
from schemas.headers import OPERATION
from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.services import Services
from tests.plugins.topics import end_offsets
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow
Connection = psycopg.Connection[tuple[object, ...]]


def _apply_settings(services: Services, prefix: str, tmp_path: Path) -> ApplySettings:
    return ApplySettings(
        kafka=ApplyKafka(
            bootstrap_servers=services.kafka_bootstrap_servers,
            topic_prefix=prefix,
            control_topic=f"{prefix}._control",
            schema_topic=f"{prefix}._schemas",
        ),
        lake=LakeSettings(root=str(tmp_path / "lake"), checkpoint_root=str(tmp_path / "cp")),
        trigger=TriggerSettings(mode="available_now"),
    )


def _source(pg: Connection, schema: str, table: str, columns: str) -> dict[Any, tuple[Any, ...]]:
    query = sql.SQL("SELECT id, {} FROM {}").format(sql.SQL(columns), sql.Identifier(schema, table))
    return {row[0]: tuple(row[1:]) for row in pg.execute(query).fetchall()}


def _lake(spark: Any, root: Path, schema: str, table: str, columns: str) -> dict[Any, Any]:
    path = root / "lake" / schema / table
    if not (path / "_delta_log").exists():
        return {}
    frame = spark.read.format("delta").load(str(path)).selectExpr("id", *columns.split(", "))
    return {row[0]: tuple(row[1:]) for row in frame.collect()}


def _apply_until_equal(
    spark: Any,
    settings: ApplySettings,
    tmp_path: Path,
    compare: Callable[[], bool],
    attempts: int = 6,
) -> None:
    """Run apply to the end of the topics until the lake equals the source: capture may
    still be publishing what the source holds when a run starts."""
    for _ in range(attempts):
        job = ApplyJob(settings, spark)
        try:
            job.run(threading.Event())
        finally:
            job.close()
        if compare():
            return
    raise AssertionError("the lake never became equal to the source")


def _ops(bootstrap: str, topic: str) -> list[str]:
    """The operation header of every record of ``topic``, in offset order per partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ops-{time.time_ns()}"})
    try:
        ends = end_offsets(consumer, topic)
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end])
        ops: list[str] = []
        remaining = sum(ends.values())
        deadline = time.monotonic() + 60
        while remaining and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            remaining -= 1
            headers = cast("list[tuple[str, bytes]]", message.headers() or [])
            ops += [value.decode() for key, value in headers if key == OPERATION]
        assert not remaining, f"{topic} could not be read to its end"
        return ops
    finally:
        consumer.close()


def _status(settings: CaptureSettings, table: str) -> tuple[TableState, str | None] | None:
    for status in admin.table_statuses(settings):
        if status.table == table:
            return status.state, status.message
    return None


def test_added_columns_with_defaults_resync_online_while_writes_go_on(
    spark: Any, services: Services, pg: Connection, unique_name: str, tmp_path: Path
) -> None:
    schema = unique_name
    s = sql.Identifier(schema)
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    for table in ("constant", "volatile", "plain"):
        pg.execute(
            sql.SQL(
                "CREATE TABLE {t} (id int PRIMARY KEY, v int);"
                "INSERT INTO {t} SELECT g, g FROM generate_series(1, 200) g"
            ).format(t=sql.Identifier(schema, table))
        )
    tables = [f"{schema}.{t}" for t in ("constant", "volatile", "plain")]
    settings = capture_settings(services, unique_name, tables, snapshot_mode="initial")
    runner = CaptureThread(settings)
    runner.start(pg)
    stop_writing = threading.Event()
    written: list[int] = []

    def write() -> None:
        # Its own connection: rows change and come and go all along.
        with psycopg.connect(services.postgres_dsn, autocommit=True) as conn:
            n = 0
            while not stop_writing.is_set():
                n += 1
                for table in ("constant", "volatile", "plain"):
                    t = sql.Identifier(schema, table)
                    conn.execute(sql.SQL("UPDATE {} SET v = v + 1 WHERE id = %s").format(t), [n])
                    conn.execute(
                        sql.SQL("INSERT INTO {} (id, v) VALUES (%s, 0)").format(t), [1000 + n]
                    )
                    conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(t), [100 + n])
                written.append(n)
                time.sleep(0.02)

    writer = threading.Thread(target=write, daemon=True)
    try:
        wait_for(
            lambda: {s.state for s in admin.table_statuses(settings)} == {TableState.STREAMING},
            "the initial snapshot never finished",
            120,
        )
        writer.start()
        wait_for(lambda: len(written) >= 5, "the writer never wrote", 120)
        pg.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN extra int DEFAULT 7").format(
                sql.Identifier(schema, "constant")
            )
        )
        pg.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN stamp timestamptz DEFAULT clock_timestamp()").format(
                sql.Identifier(schema, "volatile")
            )
        )
        pg.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN extra int").format(sql.Identifier(schema, "plain"))
        )
        # The writer's next changes bring the new Relations; each resync runs while it writes.
        for table in ("constant", "volatile"):
            wait_for(
                lambda table=table: (  # type: ignore[misc]
                    (found := _status(settings, f"{schema}.{table}")) is not None
                    and found[0] is TableState.STREAMING
                    and "added with a default" in (found[1] or "")
                ),
                f"{table} was never resynced",
                120,
            )
        done = len(written)
        wait_for(lambda: len(written) >= done + 5, "the writer stopped during the resyncs", 120)
        stop_writing.set()
        writer.join(30)
        assert not runner.errors, runner.errors

        columns = {"constant": "v, extra", "volatile": "v, stamp", "plain": "v, extra"}
        source_columns = {
            "constant": "v, extra",
            "volatile": "v, (extract(epoch FROM stamp) * 1000000)::bigint",
            "plain": "v, extra",
        }
        lake_columns = {**columns, "volatile": "v, unix_micros(stamp)"}

        def equal() -> bool:
            return all(
                _lake(spark, tmp_path, schema, t, lake_columns[t])
                == _source(pg, schema, t, source_columns[t])
                for t in columns
            )

        _apply_until_equal(spark, _apply_settings(services, unique_name, tmp_path), tmp_path, equal)
        constant = _source(pg, schema, "constant", "extra")
        assert constant[2] == (7,), "a row from before the ALTER reads the default"
        assert {stamp for (_, stamp) in _source(pg, schema, "volatile", "v, stamp").values()}

        bootstrap = services.kafka_bootstrap_servers
        for table in ("constant", "volatile"):
            ops = _ops(bootstrap, f"{unique_name}.{schema}.{table}")
            assert ops.count("TRUNCATE") == 1, f"{table}: one resync, starting with a TRUNCATE"
        plain_ops = _ops(bootstrap, f"{unique_name}.{schema}.plain")
        assert "TRUNCATE" not in plain_ops, "a column without default resyncs nothing"
        assert plain_ops.count("READ") == 200, "only the initial snapshot"
        assert _status(settings, f"{schema}.plain") == (TableState.STREAMING, None)
    finally:
        stop_writing.set()
        runner.close(pg)


def test_a_retyped_column_is_parked_and_a_resync_brings_it_back(
    spark: Any, services: Services, pg: Connection, unique_name: str, tmp_path: Path
) -> None:
    schema = unique_name
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for table in ("kept", "deleted", "other"):
        pg.execute(
            sql.SQL(
                "CREATE TABLE {t} (id int PRIMARY KEY, v int);"
                "INSERT INTO {t} SELECT g, g FROM generate_series(1, 100) g"
            ).format(t=sql.Identifier(schema, table))
        )
    names = {t: f"{schema}.{t}" for t in ("kept", "deleted", "other")}
    settings = capture_settings(
        services, unique_name, list(names.values()), snapshot_mode="initial"
    )
    apply_settings = _apply_settings(services, unique_name, tmp_path)
    bootstrap = services.kafka_bootstrap_servers
    runner = CaptureThread(settings)
    runner.start(pg)
    try:
        wait_for(
            lambda: {s.state for s in admin.table_statuses(settings)} == {TableState.STREAMING},
            "the initial snapshot never finished",
            120,
        )

        def counted(table: str) -> int:
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"c{time.time_ns()}"})
            try:
                return sum(end_offsets(consumer, f"{unique_name}.{names[table]}").values())
            finally:
                consumer.close()

        for table in ("kept", "deleted", "other"):
            wait_for(lambda t=table: counted(t) >= 100, f"{table} was never snapshotted", 120)  # type: ignore[misc]
        with ApplyJob(apply_settings, spark) as job:
            job.run(threading.Event())
        assert _lake(spark, tmp_path, schema, "kept", "v") == _source(pg, schema, "kept", "v")

        for table in ("kept", "deleted"):
            t = sql.Identifier(schema, table)
            pg.execute(sql.SQL("UPDATE {} SET v = -v WHERE id <= 10").format(t))
            pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN v TYPE text").format(t))
            pg.execute(sql.SQL("UPDATE {} SET v = v || ' as text' WHERE id <= 20").format(t))
            pg.execute(sql.SQL("DELETE FROM {} WHERE id = 50").format(t))
        pg.execute(
            sql.SQL("UPDATE {} SET v = v * 2 WHERE id <= 30").format(
                sql.Identifier(schema, "other")
            )
        )
        for table, records in (("kept", 100 + 10 + 20 + 1), ("deleted", 131), ("other", 130)):
            wait_for(lambda t=table, n=records: counted(t) >= n, f"capture lagged on {table}", 120)  # type: ignore[misc]

        with ApplyJob(apply_settings, spark) as job:
            job.run(threading.Event())

        dead_letter = dead_letter_path(str(tmp_path / "lake"))
        errored = errored_tables(spark, dead_letter)
        assert set(errored) == {names["kept"], names["deleted"]}
        assert "column v changed type from int to string" in errored[names["kept"]].error
        assert _lake(spark, tmp_path, schema, "other", "v") == _source(pg, schema, "other", "v")

        # The documented recovery: resync, restart capture, apply. One lake table is
        # deleted first, the other kept.
        shutil.rmtree(tmp_path / "lake" / schema / "deleted")
        admin.request_resync(settings, [names["kept"], names["deleted"]])
        runner.join()
        assert not runner.errors, runner.errors
        runner = CaptureThread(settings)
        runner.start(pg)
        pg.execute(
            sql.SQL("UPDATE {} SET v = 'after the resync' WHERE id = 3").format(
                sql.Identifier(schema, "kept")
            )
        )

        def equal() -> bool:
            return all(
                _lake(spark, tmp_path, schema, t, "v") == _source(pg, schema, t, "v")
                for t in ("kept", "deleted", "other")
            )

        _apply_until_equal(spark, apply_settings, tmp_path, equal)
        assert errored_tables(spark, dead_letter) == {}
        assert _lake(spark, tmp_path, schema, "kept", "v")[3] == ("after the resync",)

        # The last step of the documented recovery has nothing left to do.
        context = ApplyContext(
            str(tmp_path / "lake"),
            reapply_app_id(transaction_app_id(str(tmp_path / "cp" / "apply"))),
            {},
        )
        for table in ("kept", "deleted"):
            assert reapply_table(spark, names[table], context).passes == ()
        assert not runner.errors, runner.errors
    finally:
        runner.close(pg)
