"""The change log (apply.change_log, apply.fold) against a real Kafka broker and Delta
tables on disk: batches append, the freshest view reads table and log together in Spark
SQL, DuckDB and delta-rs, a fold merges the log into the table, and a batch the log
cannot take (a TRUNCATE) folds and empties the log before it is merged directly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from apply.batch import applied_state, apply_batch
from apply.change_log import change_log_path, freshest_view_sql
from apply.fold import Folds, FoldTimer, fold_table
from apply.history import read_history
from apply.known_tables import KnownTables
from apply.tables import TableId, table_path
from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from tests.plugins.change_topics import (
    DELETE,
    INSERT,
    TRUNCATE,
    UPDATE,
    ChangeTopic,
    change,
    context,
    rows,
)
from tests.plugins.lake import duckdb_connection
from tests.plugins.services import Services

pytestmark = pytest.mark.slow


def view_spark(spark: Any, lake_root: str, table: TableId) -> dict[int, str | None]:
    sql = freshest_view_sql(
        f"delta.`{table_path(lake_root, table)}`",
        f"delta.`{change_log_path(lake_root, table)}`",
        ["id", "note"],
        ["id"],
        "spark",
    )
    return {row["id"]: row["note"] for row in spark.sql(sql).collect()}


def view_duckdb(lake_root: str, table: TableId) -> dict[int, str | None]:
    sql = freshest_view_sql(
        f"delta_scan('{table_path(lake_root, table)}')",
        f"delta_scan('{change_log_path(lake_root, table)}')",
        ["id", "note"],
        ["id"],
        "duckdb",
    )
    with duckdb_connection() as con:
        found = con.execute(f"SELECT id, note FROM ({sql})").fetchall()
    return {int(i): n for i, n in found}


def view_delta_rs(lake_root: str, table: TableId) -> dict[int, str | None]:
    from deltalake import DeltaTable, QueryBuilder  # noqa: PLC0415

    sql = freshest_view_sql('"t"', '"l"', ["id", "note"], ["id"], "datafusion")
    builder = (
        QueryBuilder()
        .register("t", DeltaTable(table_path(lake_root, table)))
        .register("l", DeltaTable(change_log_path(lake_root, table)))
    )
    result = pa.table(builder.execute(sql).read_all()).select(["id", "note"]).to_pylist()
    return {int(row["id"]): (None if row["note"] is None else str(row["note"])) for row in result}


def log_rows(spark: Any, lake_root: str, table: TableId) -> list[tuple[int, str, int]]:
    frame = spark.read.format("delta").load(change_log_path(lake_root, table))
    return sorted(
        (row["id"], row["_cdc_op"], row["_cdc_seq"])
        for row in frame.select("id", "_cdc_op", "_cdc_seq").collect()
    )


def test_batches_append_the_view_is_fresh_and_folds_catch_the_table_up(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    schemas = build_table_schemas(
        TableDescription(
            "public",
            unique_name,
            (Column("id", ct.LONG, nullable=False, key=True), Column("note", ct.STRING)),
        )
    )
    enc = ChangeEncoder(schemas)
    folds = Folds(every_s=0.0)
    # Batches small enough go through the driver (apply.driver_append) once the job
    # knows the log; the others through the JVM: both paths in one history.
    ctx = dataclasses.replace(
        context(tmp_path, schemas), known=KnownTables(), folds=folds, driver_write_records=10_000
    )
    table = TableId("public", unique_name)
    root = ctx.lake_root
    path = table_path(root, table)
    topic = ChangeTopic(services, unique_name, 1)
    marks = [topic.mark()]

    def apply_next(batch_id: int, *changes: Change) -> Any:
        topic.send(enc, 0, *changes)
        marks.append(topic.mark())
        return apply_batch(topic.batch(spark, marks[-2], marks[-1]), batch_id, ctx).applied[0]

    def fresh() -> dict[int, str | None]:
        """The view as all three engines read it; they must agree."""
        seen = view_spark(spark, root, table)
        assert view_duckdb(root, table) == seen
        assert view_delta_rs(root, table) == seen
        return seen

    first = apply_next(
        0,
        change(INSERT, 0x100, 0, after={"id": 1, "note": "n1"}),
        change(INSERT, 0x100, 1, after={"id": 2, "note": "n2"}),
    )
    assert (first.committed, first.table_created, first.source_rows) == (True, True, 2)
    assert rows(spark, path, "note") == {}, "the table itself waits for a fold"
    assert fresh() == {1: "n1", 2: "n2"}

    second = apply_next(
        1,
        change(UPDATE, 0x200, 0, after={"id": 1, "note": "n1b"}),
        change(DELETE, 0x200, 1, before={"id": 2}, before_key_only=True),
    )
    assert fresh() == {1: "n1b"}
    # Spark replays batch 1: the log's state covers it, nothing is appended.
    replayed = apply_batch(topic.batch(spark, marks[-2], marks[-1]), 1, ctx).applied[0]
    assert (replayed.committed, replayed.version) == (False, second.version)
    assert applied_state(spark, root, table) == second.state

    folded = fold_table(spark, lake_root=root, table=table, default_app_id=ctx.txn_app_id)
    assert folded is not None
    assert folded.through_seq == second.state.log_seq
    assert rows(spark, path, "note") == {1: ("n1b",)}
    table_state = read_history(spark, path, str(table))
    assert table_state is not None
    assert table_state.state == second.state, "the table records the log's state it holds"
    assert fresh() == {1: "n1b"}
    assert fold_table(spark, lake_root=root, table=table, default_app_id=ctx.txn_app_id) is None

    third = apply_next(2, change(INSERT, 0x300, 0, after={"id": 3, "note": "n3"}))
    assert fresh() == {1: "n1b", 3: "n3"}
    # The timer folds what is due; this fold trims what the previous one merged.
    timer = FoldTimer(spark, folds, lake_root=root, default_app_id=ctx.txn_app_id)
    assert timer.fold_due() == 1
    assert rows(spark, path, "note") == {1: ("n1b",), 3: ("n3",)}
    assert {seq for _, _, seq in log_rows(spark, root, table)} == {third.state.log_seq}
    assert fresh() == {1: "n1b", 3: "n3"}

    # A TRUNCATE does not go to the log: the log is folded and emptied, then merged.
    fourth = apply_next(4, change(INSERT, 0x400, 0, after={"id": 4, "note": "n4"}))
    truncated = apply_next(
        5,
        change(TRUNCATE, 0x500, 0),
        change(INSERT, 0x500, 1, after={"id": 5, "note": "n5"}),
    )
    assert truncated.path == path
    assert truncated.rows_truncated == 3
    assert log_rows(spark, root, table) == []
    assert rows(spark, path, "note") == {5: ("n5",)}
    assert applied_state(spark, root, table) == truncated.state
    assert truncated.state.partitions == {
        **fourth.state.partitions,
        **truncated.state.partitions,
    }
    assert fresh() == {5: "n5"}

    # Back to the log. An unchanged TOAST value is taken from the view before the append:
    # from the table (row 5) and from the log's own rows (row 6, not folded yet).
    sixth = apply_next(
        6,
        change(INSERT, 0x600, 0, after={"id": 6, "note": "n6"}),
        change(UPDATE, 0x600, 1, after={"id": 5, "note": None}, unchanged_columns=("note",)),
    )
    assert sixth.path == change_log_path(root, table)
    assert fresh() == {5: "n5", 6: "n6"}
    sixth = apply_next(
        7, change(UPDATE, 0x700, 0, after={"id": 6, "note": None}, unchanged_columns=("note",))
    )
    assert sixth.path == change_log_path(root, table)
    assert fresh() == {5: "n5", 6: "n6"}
    assert fold_table(spark, lake_root=root, table=table, default_app_id=ctx.txn_app_id)
    assert rows(spark, path, "note", "_cdc_commit_lsn") == {5: ("n5", 0x600), 6: ("n6", 0x700)}
    restarted = dataclasses.replace(ctx, known=None, folds=Folds(every_s=0.0))
    again = apply_batch(topic.batch(spark, marks[-2], marks[-1]), 7, restarted).applied[0]
    assert (again.committed, again.state) == (False, sixth.state)
    assert applied_state(spark, root, table) == sixth.state


def test_the_timer_folds_two_tables_at_once_and_leaves_the_callers_pool_alone(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    names = [f"{unique_name}_a", f"{unique_name}_b"]
    schemas = [
        build_table_schemas(
            TableDescription(
                "public",
                name,
                (Column("id", ct.LONG, nullable=False, key=True), Column("note", ct.STRING)),
            )
        )
        for name in names
    ]
    folds = Folds(every_s=0.0)
    ctx = dataclasses.replace(context(tmp_path, *schemas), known=KnownTables(), folds=folds)
    for name, table_schemas in zip(names, schemas, strict=True):
        topic = ChangeTopic(services, name, 1)
        start = topic.mark()
        topic.send(
            ChangeEncoder(table_schemas), 0, change(INSERT, 0x100, 0, after={"id": 1, "note": name})
        )
        apply_batch(topic.batch(spark, start, topic.mark()), 0, ctx)
    context_pool = spark.sparkContext.getLocalProperty("spark.scheduler.pool")
    timer = FoldTimer(
        spark, folds, lake_root=ctx.lake_root, default_app_id=ctx.txn_app_id, parallelism=2
    )
    try:
        assert timer.fold_due() == 2
    finally:
        timer.stop()
    for name in names:
        assert rows(spark, table_path(ctx.lake_root, TableId("public", name)), "note") == {
            1: (name,)
        }
    assert spark.sparkContext.getLocalProperty("spark.scheduler.pool") == context_pool
    assert folds.due(every=True) == []
