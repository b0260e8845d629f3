"""Instants in the lake's Parquet files: INT64 microseconds from apply's session default
on, the legacy INT96 in files written before, what delta-rs reads from each, and the
rewrite that turns an old table's files into INT64.

A table written before the default changed (a session with Spark's default INT96) keeps
its INT96 files; the next write (the apply session, ``TIMESTAMP_MICROS``) adds INT64
files beside them. delta-rs reads INT96 as nanoseconds in 64 bits, so its instants
outside 1677-2262 (and the +-infinity sentinels) come back wrong until ``OPTIMIZE``
rewrites the old files; Spark reads both kinds exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from deltalake import DeltaTable

from apply.engine.spark_session import DELETION_VECTORS_DEFAULT
from apply.lake.driver_merge import DriverMergeUnavailableError, DriverTables
from apply.lake.legacy_instants import wrong_instants
from apply.lake.tables import TableId
from schemas.column_type import TIMESTAMP_NEGATIVE_INFINITY, TIMESTAMP_POSITIVE_INFINITY
from tests.plugins.lake import (
    live_files,
    read_delta_rs_pyarrow,
    read_delta_rs_query,
    timestamp_columns,
)

pytestmark = pytest.mark.slow

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


IN_RANGE = {1: _micros(datetime(2024, 2, 29, 12, 34, 56, 123456, tzinfo=UTC))}
OUT_OF_INT96_NANOS = {
    2: _micros(datetime(1500, 1, 1, tzinfo=UTC)),
    3: _micros(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
    4: TIMESTAMP_POSITIVE_INFINITY,
    5: TIMESTAMP_NEGATIVE_INFINITY,
}
VALUES = {**IN_RANGE, **OUT_OF_INT96_NANOS}
UTC_MICROS = ("INT64", {"isAdjustedToUTC": True, "timeUnit": "microseconds"})


def _write(session: Any, path: str, values: dict[int, int], mode: str) -> None:
    (
        session.createDataFrame(sorted(values.items()), "id int, micros long")
        .selectExpr("id", "timestamp_micros(micros) AS ts")
        .write.format("delta")
        .mode(mode)
        .save(path)
    )


def _spark_micros(spark: Any, path: str) -> dict[int, int]:
    rows = spark.read.format("delta").load(path).selectExpr("id", "unix_micros(ts)").collect()
    return {row[0]: row[1] for row in rows}


def _delta_rs_micros(table: pa.Table) -> dict[int, int]:
    """What delta-rs read, as microseconds since the epoch whatever unit it returns."""
    column = table.column("ts")
    per_micro = {"us": 1, "ns": 1000}[column.type.unit]
    values = column.cast(pa.int64()).to_pylist()
    return {
        row_id: value // per_micro
        for row_id, value in zip(table.column("id").to_pylist(), values, strict=True)
    }


def _physical_types(spark: Any, path: str) -> set[str]:
    return {timestamp_columns(file)["ts"][0] for file in live_files(spark, path)}


def test_old_int96_files_stay_until_rewritten_and_new_writes_are_int64(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "table")
    # The table as apply wrote it before TIMESTAMP_MICROS was its default (and without
    # deletion vectors, so delta-rs's usual reader reads it).
    before = spark.newSession()
    before.conf.set("spark.sql.parquet.outputTimestampType", "INT96")
    before.conf.set(DELETION_VECTORS_DEFAULT, "false")
    _write(before, path, VALUES, "errorifexists")
    assert _physical_types(spark, path) == {"INT96"}
    assert _spark_micros(spark, path) == VALUES
    # delta-rs reads INT96 as 64-bit nanoseconds: its usual reader refuses the instants
    # that do not fit, its query engine returns other instants.
    with pytest.raises(pa.ArrowInvalid, match="would lose data"):
        read_delta_rs_pyarrow(path)
    read = _delta_rs_micros(read_delta_rs_query(path))
    assert {k: read[k] for k in IN_RANGE} == IN_RANGE
    wrong = {k for k in OUT_OF_INT96_NANOS if read[k] != OUT_OF_INT96_NANOS[k]}
    assert wrong == set(OUT_OF_INT96_NANOS), read
    # So the driver, whose delta-rs would rewrite them so, leaves the table to Spark.
    with pytest.raises(DriverMergeUnavailableError, match="INT96 instants in column ts"):
        DriverTables().read(path, TableId("public", "t"))

    # The next write in apply's session: a new INT64 file beside the old one.
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "TIMESTAMP_MICROS"
    appended = {row_id + 10: micros for row_id, micros in VALUES.items()}
    _write(spark, path, appended, "append")
    assert _physical_types(spark, path) == {"INT64", "INT96"}
    for file in live_files(spark, path):
        if timestamp_columns(file)["ts"][0] == "INT64":
            assert timestamp_columns(file)["ts"] == UTC_MICROS
    read = _delta_rs_micros(read_delta_rs_query(path))
    assert {k: read[k] for k in appended} == appended

    # OPTIMIZE, run in a TIMESTAMP_MICROS session, rewrites the small files into one.
    spark.sql(f"OPTIMIZE delta.`{path}`")
    assert _physical_types(spark, path) == {"INT64"}
    assert _delta_rs_micros(read_delta_rs_pyarrow(path)) == {**VALUES, **appended}
    assert _delta_rs_micros(read_delta_rs_query(path)) == {**VALUES, **appended}
    assert _spark_micros(spark, path) == {**VALUES, **appended}
    assert wrong_instants(DeltaTable(path), {}) is None  # the driver's again
