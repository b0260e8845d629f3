"""Encode speed of change-record layouts with fastavro, against a baseline in the same run.

Usage: ``.venv/bin/python -m bench.avro_encode [--records N] [--rounds R]``

Every alternative encodes the same change of a 10-column table (bigint key, text,
numeric(12,2), timestamptz, a nullable text that is NULL, int, boolean, text[], date,
uuid) into a reused buffer; each reports the best of R rounds of N records, as
records/s on one core and as a ratio to the baseline. The layout alternatives call
fastavro directly with the schema the contract builds, so only the layout or the union
handling differs; the last rows run the real :class:`schemas.change_record.ChangeEncoder`
(header included) with the input styles the type mapping can choose from: Python
values (``Decimal``, ``datetime``...), Avro physical values, and physical values with
``physical_values=True``.

- baseline: ``before``/``after`` as ``["null", Row]`` with plain dicts; fastavro finds
  each union branch by validating the value against the branches before writing it.
- row hint: the same bytes, with ``(row name, dict)`` naming the ``before``/``after``
  branch (fastavro's tuple notation); columns still inferred.
- row hint as ``-type``: the same, with the branch named by a key inside the dict.
- row + column hints: the same bytes, every non-null column also as ``(type, value)``,
  built once up front (what :class:`~schemas.change_record.ChangeEncoder` builds per call).
- string op: ``op`` as a string instead of the enum.
- non-null after: ``after`` as a plain ``Row`` instead of a union.
- non-null columns: columns as ``T`` rather than ``["null", T]``: the rejected layout
  without partial images and unchanged-TOAST nulls (the NULL note becomes "").
"""

from __future__ import annotations

import argparse
import copy
import decimal
import io
import time
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

from fastavro import parse_schema, schemaless_writer

from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    TableSchemas,
    build_table_schemas,
)
from schemas.column_type import BOOLEAN, DATE, INT, LONG, STRING, TIMESTAMP_MICROS, UUID
from schemas.column_type import ColumnType as T
from schemas.lsn import Lsn
from schemas.operation import Operation

TABLE = TableDescription(
    "public",
    "orders",
    (
        Column("id", LONG, nullable=False, key=True),
        Column("status", STRING, nullable=False),
        Column("amount", T.decimal(12, 2)),
        Column("created_at", TIMESTAMP_MICROS, nullable=False),
        Column("note", STRING),
        Column("quantity", INT),
        Column("gift", BOOLEAN),
        Column("tags", T.array(STRING)),
        Column("ship_date", DATE),
        Column("tracking", UUID),
    ),
)

TYPED_ROW: dict[str, Any] = {
    "id": 1_234_567,
    "status": "shipped",
    "amount": decimal.Decimal("1234.50"),
    "created_at": datetime(2024, 5, 17, 10, 30, 15, 123456, tzinfo=UTC),
    "note": None,
    "quantity": 3,
    "gift": False,
    "tags": ["express", "fragile"],
    "ship_date": date(2024, 5, 18),
    "tracking": uuid.UUID("5f0c7a6e-7c3e-4c1e-9a39-2a4b2f0d2f11"),
}
# The same values as the Avro physical values a type mapping can produce straight from
# PostgreSQL's binary format: unscaled decimal bytes, microseconds, days, text UUID.
WIRE_ROW: dict[str, Any] = {
    **TYPED_ROW,
    "amount": (123450).to_bytes(3, "big", signed=True),
    "created_at": 1_715_941_815_123_456,
    "ship_date": 19_861,
    "tracking": "5f0c7a6e-7c3e-4c1e-9a39-2a4b2f0d2f11",
}

# Without nullable columns the NULL note cannot be written; an empty one stands in.
FULL_ROW: dict[str, Any] = {**WIRE_ROW, "note": ""}

POSITION: dict[str, Any] = {
    "commit_lsn": 0x16_B374_D848,
    "change_lsn": 0x16_B374_D000,
    "xid": 771_234,
    "commit_ts": 1_715_941_815_200_000,
    "ordinal": 17,
    "before_key_only": False,
    "unchanged_columns": (),
}


def _envelope(op: str, before: Any, after: Any) -> dict[str, Any]:
    return {"op": op, **POSITION, "before": before, "after": after}


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["name"] == name)


def _string_op(schema: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(schema)
    _field(schema, "op")["type"] = "string"
    return schema


def _non_null_after(schema: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(schema)
    after = _field(schema, "after")
    after["type"] = "Row"
    del after["default"]
    return schema


def _non_null_columns(schema: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(schema)
    for column in _field(schema, "before")["type"][1]["fields"]:
        column["type"] = column["type"][1]
        del column["default"]
    return schema


def _layout_case(schema: dict[str, Any], record: dict[str, Any]) -> Callable[[], bytes]:
    parsed = parse_schema(schema)
    buffer = io.BytesIO()

    def encode() -> bytes:
        buffer.seek(0)
        buffer.truncate()
        schemaless_writer(buffer, parsed, record)
        return buffer.getvalue()

    return encode


def _column_hints(schemas: TableSchemas, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with each non-null column as ``(branch, value)``, built once up front."""
    branches = {}
    for column in _field(schemas.value_schema, "before")["type"][1]["fields"]:
        branch = column["type"][1]
        branches[column["name"]] = branch if isinstance(branch, str) else branch["type"]
    return {name: None if value is None else (branches[name], value) for name, value in row.items()}


def _cases(schemas: TableSchemas, update: bool) -> list[tuple[str, Callable[[], bytes]]]:
    value = schemas.value_schema
    row_name = schemas.row_name
    op = "UPDATE" if update else "INSERT"

    def images(row: Any) -> tuple[Any, Any]:
        return (row if update else None), row

    row_hint = (row_name, WIRE_ROW)
    both_hints = (row_name, _column_hints(schemas, WIRE_ROW))
    encoder = ChangeEncoder(schemas)
    physical = ChangeEncoder(schemas, physical_values=True)

    def change(row: dict[str, Any]) -> Change:
        return Change(
            Operation.UPDATE if update else Operation.INSERT,
            Lsn(POSITION["commit_lsn"]),
            Lsn(POSITION["change_lsn"]),
            POSITION["xid"],
            POSITION["commit_ts"],
            POSITION["ordinal"],
            before=row if update else None,
            after=row,
        )

    wire_change, typed_change = change(WIRE_ROW), change(TYPED_ROW)
    before_hint = both_hints if update else None
    return [
        ("baseline: union inferred", _layout_case(value, _envelope(op, *images(WIRE_ROW)))),
        ("row hint", _layout_case(value, _envelope(op, *images(row_hint)))),
        (
            "row hint as -type",
            _layout_case(value, _envelope(op, *images({"-type": row_name, **WIRE_ROW}))),
        ),
        ("row + column hints", _layout_case(value, _envelope(op, *images(both_hints)))),
        (
            "row + column hints, string op",
            _layout_case(_string_op(value), _envelope(op, *images(both_hints))),
        ),
        (
            "column hints, non-null after",
            _layout_case(_non_null_after(value), _envelope(op, before_hint, both_hints[1])),
        ),
        (
            "row hint, non-null columns",
            _layout_case(_non_null_columns(value), _envelope(op, *images((row_name, FULL_ROW)))),
        ),
        ("ChangeEncoder, wire inputs", lambda: encoder.encode_value(wire_change)),
        ("ChangeEncoder, typed inputs", lambda: encoder.encode_value(typed_change)),
        ("ChangeEncoder, physical_values", lambda: physical.encode_value(wire_change)),
        ("ChangeEncoder, key", lambda: encoder.encode_key(wire_change)),
    ]


def _rates(cases: list[tuple[str, Callable[[], bytes]]], records: int, rounds: int) -> list[float]:
    """Best records/s of each case. Rounds visit the cases in turn, so a burst of load
    from other processes on the machine hits all of them alike instead of one."""
    best = [0.0] * len(cases)
    for _ in range(rounds):
        for index, (_, encode) in enumerate(cases):
            start = time.perf_counter()
            for _ in range(records):
                encode()
            best[index] = max(best[index], records / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=5_000, help="records per round")
    parser.add_argument("--rounds", type=int, default=10, help="rounds; the best one counts")
    args = parser.parse_args()
    schemas = build_table_schemas(TABLE)
    for update in (False, True):
        title = "UPDATE with before and after" if update else "INSERT (after only)"
        cases = _cases(schemas, update)
        # Hints only choose the union branch: the bytes must be those of the baseline.
        assert len({encode() for _, encode in cases[:4]}) == 1, "branch hints changed the bytes"
        print(f"\n{title}, {args.records} records x {args.rounds} rounds, best round")
        print(f"{'alternative':34} {'records/s':>10} {'vs baseline':>12} {'bytes':>6}")
        rates = _rates(cases, args.records, args.rounds)
        for (name, encode), rate in zip(cases, rates, strict=True):
            print(f"{name:34} {rate:10.0f} {rate / rates[0]:11.2f}x {len(encode()):6}")


if __name__ == "__main__":
    main()
