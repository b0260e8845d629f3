"""The Delta change data feed on lake tables (``APPLY_LAKE__CHANGE_DATA_FEED=true``).

Inserts, an update and a delete go through the real capture and ``python -m apply`` (a
process, so the setting takes the route a deployment's does: the entry point's
session), each applied before the next is made, so each is a MERGE of its own. The
feed read back with ``readChangeFeed`` and ``table_changes_by_path`` holds exactly those
row-level changes, in commit order, with the update's pre- and post-image.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.lake import wait_applied
from tests.plugins.pipeline import Pipeline
from tests.plugins.services import Services

pytestmark = pytest.mark.slow
Connection = psycopg.Connection[tuple[object, ...]]

INSERTED = [(1, "first", Decimal("1.00")), (2, "second", Decimal("2.00")), (3, "third", None)]
UPDATED = (2, "second, updated", Decimal("2.50"))


@pytest.fixture
def schema(pg: Connection, unique_name: str) -> Iterator[str]:
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(unique_name)))
    yield unique_name
    pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(unique_name)))


def test_change_data_feed_holds_every_row_change_the_pipeline_applied(
    services: Services, pg: Connection, spark: Any, schema: str, unique_name: str, tmp_path: Path
) -> None:
    table = sql.Identifier(schema, "orders")
    pg.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text, amount numeric(10,2))").format(
            table
        )
    )
    name = f"{schema}.orders"
    pipeline = Pipeline(
        unique_name, services.postgres_dsn, services.kafka_bootstrap_servers, (name,), tmp_path
    )
    pipeline.apply.env.update(
        {"APPLY_LAKE__CHANGE_DATA_FEED": "true", "APPLY_METRICS__ENABLED": "false"}
    )
    runner = CaptureThread(capture_settings(services, unique_name, [name]))
    runner.start(pg)
    try:
        pipeline.apply.start()
        pg.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, %s, %s), (%s, %s, %s), (%s, %s, %s)").format(table),
            [value for row in INSERTED for value in row],
        )
        wait_applied(pg, unique_name)
        pg.execute(
            sql.SQL("UPDATE {} SET note = %s, amount = %s WHERE id = %s").format(table),
            [UPDATED[1], UPDATED[2], UPDATED[0]],
        )
        wait_applied(pg, unique_name)
        pg.execute(sql.SQL("DELETE FROM {} WHERE id = 3").format(table))
        wait_applied(pg, unique_name)
    except BaseException:
        print(pipeline.logs())  # shown with the failure
        raise
    finally:
        stopped = pipeline.apply.terminate()
        runner.close(pg)
    assert not runner.errors, runner.errors
    # The SIGTERM went to the whole process group, JVM included: the driver alone stops
    # the job (apply.engine.spark_session), so nothing fails on the way out.
    assert stopped == 0, pipeline.apply.tail()
    assert "Traceback" not in pipeline.apply.log.read_text(), pipeline.apply.tail()

    path = pipeline.table_path(name)
    assert Path(path, "_delta_log").is_dir(), pipeline.logs()
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").head()
    assert detail["properties"]["delta.enableChangeDataFeed"] == "true"

    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(path)
        .collect()
    )
    changes = sorted(
        (r["_commit_version"], r["_change_type"], r["id"], r["note"], r["amount"]) for r in feed
    )
    assert sorted(change[1:] for change in changes) == sorted(
        [("insert", *row) for row in INSERTED]
        + [
            ("update_preimage", *INSERTED[1]),
            ("update_postimage", *UPDATED),
            ("delete", *INSERTED[2]),
        ]
    )
    versions: dict[str, set[int]] = defaultdict(set)
    for version, change_type, *_ in changes:
        versions["update" if change_type.startswith("update_") else change_type].add(version)
    assert len(versions["update"]) == 1, "pre- and post-image come from one MERGE"
    assert max(versions["insert"]) < min(versions["update"]) < min(versions["delete"])
    by_sql = spark.sql(
        f"SELECT _commit_version, _change_type, id FROM table_changes_by_path('{path}', 0)"
    ).collect()
    assert sorted(tuple(r) for r in by_sql) == [change[:3] for change in changes]
