"""The whole pipeline: PostgreSQL -> capture -> Kafka -> apply (Spark) -> Delta, and the
applied LSNs back to the slot.

The Delta tables must equal the source tables (row for row, unchanged TOAST values
kept), and the slot must advance past the workload once apply has published its
progress.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer
from psycopg import sql

from apply.app import ApplyJob
from apply.settings import ApplySettings, LakeSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture import admin
from schemas.control import TableState
from schemas.lsn import parse_lsn
from tests.plugins.capture import CaptureThread, capture_settings, confirmed_lsn
from tests.plugins.services import Services
from tests.plugins.topics import end_offsets
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow
Connection = psycopg.Connection[tuple[object, ...]]
BIG = "x" * 20_000  # stored out of line (TOAST), so an UPDATE of another column omits it


def _count(bootstrap: str, topics: list[str]) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"c{time.time_ns()}"})
    try:
        return sum(sum(end_offsets(consumer, topic).values()) for topic in topics)
    finally:
        consumer.close()


def test_source_tables_land_in_delta_and_the_slot_follows(
    spark: Any,
    services: Services,
    pg: Connection,
    unique_name: str,
    tmp_path: Path,
) -> None:
    schema = unique_name
    s = sql.Identifier(schema)
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    pg.execute(
        sql.SQL(
            "CREATE TABLE {s}.orders (id bigint PRIMARY KEY, note text, amount numeric(10,2), "
            "body text);"
            "CREATE TABLE {s}.items (order_id bigint, line int, sku text, "
            "PRIMARY KEY (order_id, line));"
            "CREATE TABLE {s}.customers (id int PRIMARY KEY, name text, since date)"
        ).format(s=s)
    )
    # Rows that exist before capture starts reach the lake through the initial snapshot.
    pg.execute(
        sql.SQL(
            "INSERT INTO {}.customers SELECT g, E'c\\t' || g, DATE '2020-01-01' + g "
            "FROM generate_series(1, 300) g"
        ).format(s)
    )
    prefix = unique_name
    settings = capture_settings(
        services,
        unique_name,
        [f"{schema}.orders", f"{schema}.items", f"{schema}.customers"],
        status_interval_s=0.3,
        snapshot_mode="initial",
    )
    runner = CaptureThread(settings)
    runner.start(pg)
    try:
        wait_for(
            lambda: {s.state for s in admin.table_statuses(settings)} == {TableState.STREAMING},
            "the initial snapshot never finished",
            60,
        )
        pg.execute(sql.SQL("UPDATE {}.customers SET name = 'renamed' WHERE id <= 5").format(s))
        pg.execute(sql.SQL("DELETE FROM {}.customers WHERE id > 295").format(s))
        pg.execute(
            sql.SQL(
                "INSERT INTO {}.orders SELECT g, 'n' || g, g / 4.0, "
                "CASE WHEN g = 1 THEN %s END FROM generate_series(1, 200) g"
            ).format(s),
            [BIG],
        )
        pg.execute(
            sql.SQL("INSERT INTO {}.items SELECT g, 1, 'sku' FROM generate_series(1, 50) g").format(
                s
            )
        )
        pg.execute(sql.SQL("UPDATE {}.orders SET note = 'toast kept' WHERE id = 1").format(s))
        pg.execute(sql.SQL("UPDATE {}.orders SET amount = amount + 1 WHERE id % 3 = 0").format(s))
        pg.execute(sql.SQL("DELETE FROM {}.orders WHERE id % 10 = 0").format(s))
        pg.execute(sql.SQL("UPDATE {}.orders SET id = 1000 WHERE id = 7").format(s))
        pg.execute(sql.SQL("TRUNCATE {}.items").format(s))
        pg.execute(sql.SQL("INSERT INTO {}.items VALUES (9, 9, 'after truncate')").format(s))
        workload_end = parse_lsn(
            str(pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
        )
        topics = [f"{prefix}.{schema}.orders", f"{prefix}.{schema}.items"]
        # 200 + 50 inserts, 1 + 66 updates, 20 deletes, key change (2), truncate, insert
        expected = 200 + 50 + 1 + 66 + 20 + 2 + 1 + 1
        wait_for(
            lambda: _count(services.kafka_bootstrap_servers, topics) >= expected,
            "capture lagged",
            60,
        )
        wait_for(
            lambda: (
                _count(services.kafka_bootstrap_servers, [f"{prefix}.{schema}.customers"])
                >= 300 + 5 + 5
            ),
            "capture lagged on the snapshotted table",
            60,
        )
        assert confirmed_lsn(pg, unique_name) < workload_end, (
            "confirmed before anything was applied"
        )

        apply_settings = ApplySettings(
            kafka=ApplyKafka(
                bootstrap_servers=services.kafka_bootstrap_servers,
                topic_prefix=prefix,
                control_topic=f"{prefix}._control",
                schema_topic=f"{prefix}._schemas",
            ),
            lake=LakeSettings(
                root=str(tmp_path / "lake"),
                checkpoint_root=str(tmp_path / "cp"),
            ),
            trigger=TriggerSettings(mode="available_now"),
        )
        with ApplyJob(apply_settings, spark) as job:
            job.run(threading.Event())

        orders = {
            r["id"]: (r["note"], r["amount"], r["body"])
            for r in spark.read.format("delta")
            .load(str(tmp_path / "lake" / schema / "orders"))
            .collect()
        }
        source = {
            r[0]: (r[1], r[2], r[3])
            for r in pg.execute(
                sql.SQL("SELECT id, note, amount, body FROM {}.orders").format(s)
            ).fetchall()
        }
        assert orders == source
        assert orders[1] == ("toast kept", Decimal("0.25"), BIG)
        items = [
            (r["order_id"], r["line"], r["sku"])
            for r in spark.read.format("delta")
            .load(str(tmp_path / "lake" / schema / "items"))
            .collect()
        ]
        assert items == [(9, 9, "after truncate")]
        customers = {
            r["id"]: (r["name"], r["since"])
            for r in spark.read.format("delta")
            .load(str(tmp_path / "lake" / schema / "customers"))
            .collect()
        }
        assert customers == {
            r[0]: (r[1], r[2])
            for r in pg.execute(
                sql.SQL("SELECT id, name, since FROM {}.customers").format(s)
            ).fetchall()
        }
        assert len(customers) == 295

        wait_for(
            lambda: confirmed_lsn(pg, unique_name) >= workload_end,
            "the slot did not follow apply",
            60,
        )
        assert not runner.errors, runner.errors
    finally:
        runner.close(pg)
