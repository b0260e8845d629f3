"""A table with a column of every type of the contract, and rows that use them all:
shared by the tests that check a type lands in Delta exactly (the JVM's decode, the
driver's, the contract read by Spark)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from schemas import column_type as ct
from schemas.change_record import Change, Column
from schemas.column_type import ColumnType
from schemas.lsn import Lsn
from schemas.operation import Operation

EVERY_TYPE = (
    Column("id", ct.LONG, nullable=False, key=True),
    Column("flag", ct.BOOLEAN),
    Column("small", ct.INT),
    Column("ratio", ct.FLOAT),
    Column("score", ct.DOUBLE),
    Column("blob", ct.BYTES),
    Column("Order Note", ct.STRING),
    Column("amount", ColumnType.decimal(12, 2)),
    Column("wide", ColumnType.decimal(38, 10)),
    Column("day", ct.DATE),
    Column("clock", ct.TIME_MICROS),
    Column("at", ct.TIMESTAMP_MICROS),
    Column("local", ct.LOCAL_TIMESTAMP_MICROS),
    Column("ref", ct.UUID),
    Column("tags", ColumnType.array(ct.STRING)),
    Column("grid", ColumnType.array(ColumnType.array(ct.INT))),
)
"""Columns of every type; ``Order Note`` needs the contract's name escape."""

EVERY_VALUE: dict[str, Any] = {
    "flag": True,
    "small": -7,
    "ratio": 0.5,
    "score": 2.25,
    "blob": b"\x00\xff",
    # Line boundaries JSON carries raw, within the 32 characters Delta keeps as statistics.
    "_pg_Order_20Note": "naïve ☃\u2028\u2029\x85 end",
    "amount": Decimal("1234.50"),
    "wide": Decimal("-1234567890123456789012345678.0123456789"),
    "day": 19_782,
    "clock": 37_815_123_456,
    "at": 1_715_941_815_123_456,
    "local": 1_715_941_815_123_456,
    "ref": "5f0c7a6e-7c3e-4c1e-9a39-2a4b2f0d2f11",
    "tags": ["a", None, ""],
    "grid": [[1, None], []],
}
"""A value in every column but the key, as the encoder takes them (dates, times and
timestamps as their Avro integers)."""

EXTREMES: dict[str, Any] = {
    "day": ct.DATE_POSITIVE_INFINITY,
    "clock": 86_400_000_000,
    "at": ct.TIMESTAMP_NEGATIVE_INFINITY,
    "local": ct.TIMESTAMP_POSITIVE_INFINITY,
}
"""PostgreSQL's infinities and 24:00:00, which Python's date and datetime cannot hold."""


def every_kind_of_change() -> list[Change]:
    """Changes of a table of :data:`EVERY_TYPE` with every image a record can carry:
    every value, nulls, the edges (:data:`EXTREMES`, NaN and infinities, empty values,
    the widest decimals), a before image, unchanged TOAST columns, key-only and whole
    DELETEs, a TRUNCATE. Their ordinals are their indexes."""
    key = {"id": 7}
    full = {**key, **EVERY_VALUE}
    edges = (
        full
        | EXTREMES
        | {
            "small": -(2**31),
            "score": float("inf"),
            "ratio": -0.0,
            "blob": b"",
            "_pg_Order_20Note": "",
            "amount": Decimal("-9999999999.99"),
            "wide": Decimal("9" * 28 + "." + "9" * 10),
            "tags": [],
            "grid": [[], [None], [2**31 - 1, -(2**31)]],
        }
    )
    nulls = dict.fromkeys(EVERY_VALUE) | key
    images: list[tuple[Operation, dict[str, Any]]] = [
        (Operation.INSERT, {"after": full}),
        (Operation.READ, {"after": nulls}),
        (Operation.UPDATE, {"after": edges}),
        (
            Operation.UPDATE,
            {"before": full, "after": full | {"ratio": float("nan"), "score": float("-inf")}},
        ),
        (
            Operation.UPDATE,
            {
                "after": nulls | {"flag": False},
                "unchanged_columns": ("blob", "_pg_Order_20Note"),
            },
        ),
        (Operation.DELETE, {"before": key, "before_key_only": True}),
        (Operation.DELETE, {"before": full}),
        (Operation.TRUNCATE, {}),
    ]
    return [
        Change(op, Lsn(0x10_0000_0000 + n), Lsn(0x20), 9, 1_715_941_815_123_456, n, **fields)
        for n, (op, fields) in enumerate(images)
    ]
