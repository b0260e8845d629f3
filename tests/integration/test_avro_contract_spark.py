"""Spark's ``from_avro`` reads what :class:`schemas.change_record.ChangeEncoder` writes.

The apply job strips the 10-byte single-object header (``substring(value, 11)``) and
decodes the rest on the JVM with the writer schema JSON from the schema topic; this test
does exactly that with keys and values of every column type, an unchanged TOAST column,
a key-only DELETE, a TRUNCATE and PostgreSQL's infinities.

It uses the project's shared ``spark`` session (tests/plugins/spark.py), which carries the
apply job's configuration and jars: ``from_avro`` lives in the spark-avro jar, not in the
pyspark wheel.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import pytest

from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    TableDescription,
    build_table_schemas,
)
from schemas.envelope import TABLE_KEY
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.single_object import HEADER_SIZE
from tests.plugins.column_types import EVERY_TYPE

pytestmark = pytest.mark.slow

TABLE = TableDescription("public", "contract", EVERY_TYPE)

FULL_ROW: dict[str, Any] = {
    "id": 1,
    "flag": True,
    "small": -7,
    "ratio": 0.5,
    "score": 2.25,
    "blob": b"\x00\xff",
    "_pg_Order_20Note": "naïve ☃",
    "amount": Decimal("1234.50"),
    "wide": Decimal("-1234567890123456789012345678.0123456789"),
    "day": date(2024, 2, 29),
    "clock": time(10, 30, 15, 123456),
    "at": datetime(2024, 5, 17, 10, 30, 15, 123456, tzinfo=UTC),
    "local": datetime(2024, 5, 17, 10, 30, 15, 123456),  # zone-less on purpose
    "ref": "5f0c7a6e-7c3e-4c1e-9a39-2a4b2f0d2f11",
    "tags": ["a", None, ""],
    "grid": [[1, None], []],
}
AT_MICROS = 1_715_941_815_123_456
COMMIT_TS = 1_715_941_815_200_000


def _change(op: Operation, ordinal: int, **images: Any) -> Change:
    return Change(
        op, Lsn(0x16_B374_D848), Lsn(0x16_B374_D000 + ordinal), 771, COMMIT_TS, ordinal, **images
    )


CHANGES = [
    _change(Operation.INSERT, 0, after=FULL_ROW),
    _change(
        Operation.UPDATE,
        1,
        after={"id": 2, "at": ct.TIMESTAMP_POSITIVE_INFINITY, "day": ct.DATE_NEGATIVE_INFINITY},
        unchanged_columns=("_pg_Order_20Note", "blob"),
    ),
    _change(Operation.DELETE, 2, before={"id": 3}, before_key_only=True),
    _change(Operation.TRUNCATE, 3),
]


def test_from_avro_decodes_keys_and_values(spark: Any) -> None:
    from pyspark.sql import functions as F  # noqa: PLC0415 - pyspark only when Spark runs
    from pyspark.sql.avro.functions import from_avro  # noqa: PLC0415

    schemas = build_table_schemas(TABLE)
    encoder = ChangeEncoder(schemas)
    records = [
        (bytearray(encoder.encode_key(c)), bytearray(encoder.encode_value(c))) for c in CHANGES
    ]
    raw = spark.createDataFrame(records, "key binary, value binary")
    body = F.expr(f"substring(value, {HEADER_SIZE + 1})")
    decoded = raw.select(from_avro(body, schemas.value_schema_json).alias("v"), "key")

    after = decoded.schema["v"].dataType["after"].dataType
    assert {f.name: f.dataType.simpleString() for f in after.fields} == {
        "id": "bigint",
        "flag": "boolean",
        "small": "int",
        "ratio": "float",
        "score": "double",
        "blob": "binary",
        "_pg_Order_20Note": "string",
        "amount": "decimal(12,2)",
        "wide": "decimal(38,10)",
        "day": "date",
        "clock": "time(6)",
        "at": "timestamp",
        "local": "timestamp_ntz",
        "ref": "string",
        "tags": "array<string>",
        "grid": "array<array<int>>",
    }

    rows = decoded.select(
        "v.op",
        "v.commit_lsn",
        "v.change_lsn",
        "v.xid",
        F.expr("unix_micros(v.commit_ts)").alias("commit_ts"),
        "v.ordinal",
        "v.before_key_only",
        "v.unchanged_columns",
        F.to_json("v.before").alias("before"),
        F.col("v.after.id").alias("after_id"),
        "v.after.flag",
        "v.after.small",
        "v.after.ratio",
        "v.after.score",
        "v.after.blob",
        "v.after._pg_Order_20Note",
        "v.after.amount",
        "v.after.wide",
        F.expr("unix_date(v.after.day)").alias("day"),
        F.expr("cast(v.after.clock as string)").alias("clock"),
        F.expr("unix_micros(v.after.at)").alias("at"),
        F.expr("cast(v.after.local as string)").alias("local"),
        "v.after.ref",
        "v.after.tags",
        "v.after.grid",
        F.col("v.after").isNull().alias("after_is_null"),
        "key",
    ).collect()
    rows_by_ordinal = {row["ordinal"]: row.asDict(recursive=True) for row in rows}

    # A TRUNCATE's key is written with TableKey, not with the table's key schema: keys
    # are decoded by their fingerprint, so the row keys are decoded apart from it.
    row_keys = raw.where(F.col("key") != F.lit(TABLE_KEY)).select(
        from_avro(F.expr(f"substring(key, {HEADER_SIZE + 1})"), schemas.key_schema_json).alias("k")
    )
    assert sorted(row["k"]["id"] for row in row_keys.collect()) == [1, 2, 3]

    for row in rows_by_ordinal.values():
        assert (row["commit_lsn"], row["xid"], row["commit_ts"]) == (0x16_B374_D848, 771, COMMIT_TS)
    insert = rows_by_ordinal[0]
    assert insert["op"] == "INSERT"
    assert insert["change_lsn"] == 0x16_B374_D000
    assert insert["before"] is None
    assert insert["before_key_only"] is False
    assert insert["unchanged_columns"] == []
    assert {k: insert[k] for k in ("after_id", "flag", "small", "ratio", "score")} == {
        "after_id": 1,
        "flag": True,
        "small": -7,
        "ratio": 0.5,
        "score": 2.25,
    }
    assert bytes(insert["blob"]) == b"\x00\xff"
    assert insert["_pg_Order_20Note"] == "naïve ☃"
    assert insert["amount"] == Decimal("1234.50")
    assert insert["wide"] == Decimal("-1234567890123456789012345678.0123456789")
    assert insert["day"] == (date(2024, 2, 29) - date(1970, 1, 1)).days
    assert insert["clock"] == "10:30:15.123456"
    assert insert["at"] == AT_MICROS
    assert insert["local"] == "2024-05-17 10:30:15.123456"
    assert insert["ref"] == "5f0c7a6e-7c3e-4c1e-9a39-2a4b2f0d2f11"
    assert insert["tags"] == ["a", None, ""]
    assert insert["grid"] == [[1, None], []]

    update = rows_by_ordinal[1]
    assert update["op"] == "UPDATE"
    assert update["unchanged_columns"] == ["_pg_Order_20Note", "blob"]
    # Unchanged TOAST columns are null in the image, never a placeholder value.
    assert update["_pg_Order_20Note"] is None
    assert update["blob"] is None
    assert update["at"] == ct.TIMESTAMP_POSITIVE_INFINITY
    assert update["day"] == ct.DATE_NEGATIVE_INFINITY

    delete = rows_by_ordinal[2]
    assert delete["op"] == "DELETE"
    assert delete["after_is_null"] is True
    assert delete["before_key_only"] is True
    assert delete["before"] == '{"id":3}'

    truncate = rows_by_ordinal[3]
    assert truncate["op"] == "TRUNCATE"
    assert truncate["before"] is None
    assert truncate["after_is_null"] is True
    assert bytes(truncate["key"]) == TABLE_KEY
