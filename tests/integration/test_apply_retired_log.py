"""A lake upgraded from the retired change log (apply.lake.retired_log): at start the job folds
what a log holds beyond its table's watermark into the table once, with the log's
state, and warns that the log can be deleted; a second start, and one after a batch
that MERGEd into the table since, commit nothing. Real Spark and Delta; the log is
written as the change log wrote it (a Delta table partitioned by ``_cdc_seq``, one
append per sequence with the table's state in the commit)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql.types import LongType, StringType, StructField, StructType

from apply.errors import ConfigError, RetiredChangeLogError
from apply.lake.delta_schema import ColumnPlan, ColumnSpec, ensure_table, table_schema
from apply.lake.history import read_history
from apply.lake.positions import AppliedState, PartitionProgress, Position, advance, encode_state
from apply.lake.retired_log import (
    OP_COLUMN,
    SEQ_COLUMN,
    change_log_path,
    fold_app_id,
    fold_retired_logs,
)
from apply.lake.table_lock import TABLE_LOCKS
from apply.lake.tables import TableId, table_path
from schemas.lsn import Lsn

pytestmark = pytest.mark.slow

COLUMNS = (ColumnSpec("id", LongType(), key=True), ColumnSpec("note", StringType()))
TABLE = TableId("public", "orders")
TOPIC = "cdc.public.orders"
APP_ID = "query"


def state(next_offset: int, lsn: int, ordinal: int, batch_id: int, **more: Any) -> AppliedState:
    return AppliedState(
        table=str(TABLE),
        partitions={(TOPIC, 0): PartitionProgress(next_offset, Position(Lsn(lsn), ordinal))},
        table_lsn=Lsn(lsn),
        commit_ts=None,
        truncated_at=None,
        batch_id=batch_id,
        txn_app_id=APP_ID,
        **more,
    )


def write(
    spark: Any, path: str, schema: StructType, rows: list[tuple[Any, ...]], meta: str
) -> None:
    frame = spark.createDataFrame(rows, schema).write.format("delta").mode("append")
    if SEQ_COLUMN in schema.fieldNames():
        frame = frame.partitionBy(SEQ_COLUMN)
    frame.option("userMetadata", meta).save(path)


def table_rows(spark: Any, root: str) -> dict[int, str]:
    frame = spark.read.format("delta").load(table_path(root, TABLE))
    return {row["id"]: row["note"] for row in frame.collect()}


def test_a_log_is_folded_once_at_start_and_the_table_holds_its_state(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = str(tmp_path / "lake")
    path, log_path = table_path(root, TABLE), change_log_path(root, TABLE)
    rows_schema = table_schema(COLUMNS)
    log_schema = StructType(
        [
            *rows_schema.fields,
            StructField(OP_COLUMN, StringType()),
            StructField(SEQ_COLUMN, LongType()),
        ]
    )
    with TABLE_LOCKS.held(path):
        plan = ColumnPlan(columns=COLUMNS, added=(), key_columns=("id",), create=True)
        ensure_table(spark, path, TABLE, plan, None)
    # The table as a MERGE left it: two rows, applied up to offset 2.
    table_state = state(2, 0x100, 1, 0)
    write(
        spark,
        path,
        rows_schema,
        [(1, "a", 0x100, 0, None), (2, "b", 0x100, 1, None)],
        encode_state(table_state),
    )
    # The log: created (its version 0), then two appends, sequences 1 and 2.
    write(spark, log_path, log_schema, [], "")
    write(
        spark,
        log_path,
        log_schema,
        [(2, "b2", 0x200, 0, None, "UPDATE", 1), (3, "c", 0x200, 1, None, "INSERT", 1)],
        encode_state(state(4, 0x200, 1, 1, log_seq=1)),
    )
    logged = state(6, 0x300, 1, 2, log_seq=2)
    write(
        spark,
        log_path,
        log_schema,
        [(1, None, 0x300, 0, None, "DELETE", 2), (3, "c2", 0x300, 1, None, "UPDATE", 2)],
        encode_state(logged),
    )
    before = read_history(spark, path, str(TABLE))
    assert before is not None

    with caplog.at_level(logging.WARNING, logger="apply.lake.retired_log"):
        (first,) = fold_retired_logs(spark, lake_root=root, default_app_id=APP_ID)
    assert (first.table, first.folded_through, first.version) == (TABLE, 2, before.version + 1)
    assert table_rows(spark, root) == {2: "b2", 3: "c2"}
    folded = read_history(spark, path, str(TABLE))
    assert folded is not None
    assert folded.state == logged, "the log's state, its sequence the table's watermark"
    commit = DeltaTable.forPath(spark, path).history(1).collect()[0]
    assert commit["operation"] == "MERGE"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "the change log of public.orders is retired" in warning
    assert f"delete {log_path}" in warning
    assert (tmp_path / "lake" / "_change-log" / "public" / "orders").is_dir(), "never deleted"

    # A second start: nothing to fold, the table keeps its version.
    (second,) = fold_retired_logs(spark, lake_root=root, default_app_id=APP_ID)
    assert (second.folded_through, second.version) == (None, None)
    again = read_history(spark, path, str(TABLE))
    assert again is not None
    assert again.version == folded.version

    # A batch MERGEd into the table since: its state has no watermark, but it covers the
    # log's offsets, so a start after it folds nothing either.
    newer = advance(logged, str(TABLE), 3, {}, None, txn_app_id=APP_ID)
    newer = replace(newer, partitions={(TOPIC, 0): PartitionProgress(8, Position(Lsn(0x400), 0))})
    assert newer.log_seq is None
    write(spark, path, rows_schema, [(4, "d", 0x400, 0, None)], encode_state(newer))
    (third,) = fold_retired_logs(spark, lake_root=root, default_app_id=APP_ID)
    assert third.folded_through is None
    after = read_history(spark, path, str(TABLE))
    assert after is not None
    assert (after.version, after.state) == (again.version + 1, newer)
    assert table_rows(spark, root) == {2: "b2", 3: "c2", 4: "d"}
    assert fold_app_id(APP_ID) == "query:fold"


def test_a_log_whose_table_is_gone_stops_the_start_saying_what_to_do(
    spark: Any, tmp_path: Path
) -> None:
    root = str(tmp_path / "lake")
    log_path = change_log_path(root, TABLE)
    log_schema = StructType(
        [
            *table_schema(COLUMNS).fields,
            StructField(OP_COLUMN, StringType()),
            StructField(SEQ_COLUMN, LongType()),
        ]
    )
    write(
        spark,
        log_path,
        log_schema,
        [(1, "a", 0x200, 0, None, "INSERT", 1)],
        encode_state(state(1, 0x200, 0, 1, log_seq=1)),
    )
    with pytest.raises(RetiredChangeLogError) as raised:
        fold_retired_logs(spark, lake_root=root, default_app_id=APP_ID)
    assert isinstance(raised.value, ConfigError), "the job stops at start"
    message = str(raised.value)
    assert f"the retired change log at {log_path}" in message
    assert "its Delta table is missing" in message
    assert "python -m capture resync public.orders" in message
