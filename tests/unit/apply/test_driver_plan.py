"""A batch held in the driver (apply.lake.driver_plan), its pure steps: decode with the
contract's own encoder's bytes, measure, the latest change per key, the Arrow arrays.
That the table the driver MERGEs them into equals Spark's is
tests/integration/test_apply_driver_merge.py's."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql.types import StringType

from apply.lake.delta_schema import ColumnSpec, parse_value_schema
from apply.lake.driver_plan import (
    CollectedRecord,
    DriverWriteUnavailableError,
    change_arrays,
    decode_records,
    latest_changes,
    measure_changes,
)
from apply.lake.positions import AppliedState, PartitionProgress, Position
from apply.lake.tables import TableId
from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from schemas.column_type import ColumnType
from schemas.lsn import Lsn
from schemas.operation import Operation

TOPIC = "cdc.public.t"
TABLE = TableId("public", "t")
COLUMNS = (
    Column("id", ct.LONG, nullable=False, key=True),
    Column("note", ct.STRING),
    Column("amount", ColumnType.decimal(12, 2)),
    Column("day", ct.DATE),
    Column("clock", ct.TIME_MICROS),
    Column("at", ct.TIMESTAMP_MICROS),
    Column("local", ct.LOCAL_TIMESTAMP_MICROS),
    Column("ref", ct.UUID),
    Column("grid", ColumnType.array(ColumnType.array(ct.INT))),
)
SCHEMAS = build_table_schemas(TableDescription("public", "t", COLUMNS))
VALUE_SCHEMA = parse_value_schema(TABLE, SCHEMAS.value_fingerprint, SCHEMAS.value_schema_json)


def change(op: Operation, lsn: int, ordinal: int, **images: Any) -> Change:
    return Change(op, Lsn(lsn), Lsn(lsn + ordinal), lsn, 1_000_000 + lsn, ordinal, **images)


def collected(partition: int, *changes: Change, first_offset: int = 0) -> list[CollectedRecord]:
    encoder = ChangeEncoder(SCHEMAS)
    return [
        CollectedRecord(partition, first_offset + index, encoder.encode_value(item))
        for index, item in enumerate(changes)
    ]


def state(partition: int, position: Position, truncated_at: Position | None = None) -> Any:
    return AppliedState(
        table=str(TABLE),
        partitions={(TOPIC, partition): PartitionProgress(10, position)},
        table_lsn=position.commit_lsn,
        commit_ts=None,
        truncated_at=truncated_at,
        batch_id=0,
    )


def test_values_decode_to_the_physical_values_spark_reads() -> None:
    row = {
        "id": 1,
        "note": "naïve ☃",
        "amount": Decimal("1234.50"),
        "day": ct.DATE_POSITIVE_INFINITY,
        "clock": 86_400_000_000,
        "at": ct.TIMESTAMP_NEGATIVE_INFINITY,
        "local": 1_715_941_815_123_456,
        "ref": "5f0c7a6e-7c3e-4c1e-9a39-2a4b2f0d2f11",
        "grid": [[1, None], []],
    }
    decoded = decode_records(
        collected(0, change(Operation.INSERT, 0x100, 0, after=row)),
        VALUE_SCHEMA,
        VALUE_SCHEMA.columns,
    )
    assert decoded.malformed == {}
    (only,) = decoded.changes
    assert only.row == tuple(row.values())
    assert (only.op, only.position, only.commit_ts) == (
        "INSERT",
        Position(Lsn(0x100), 0),
        1_000_000 + 0x100,
    )


def test_a_delete_carries_its_key_and_a_missing_column_is_null() -> None:
    wider = (*VALUE_SCHEMA.columns, ColumnSpec("extra", StringType()))
    decoded = decode_records(
        collected(0, change(Operation.DELETE, 0x100, 0, before={"id": 7}, before_key_only=True)),
        VALUE_SCHEMA,
        wider,
    )
    (only,) = decoded.changes
    assert only.op == "DELETE"
    assert only.row[0] == 7
    assert only.row[1:] == (None,) * (len(wider) - 1)


def test_a_body_that_does_not_decode_is_malformed_by_partition_and_first_offset() -> None:
    good = collected(3, change(Operation.INSERT, 0x100, 0, after={"id": 1}), first_offset=40)
    cut = CollectedRecord(3, 41, good[0].value[:-3])
    foreign = CollectedRecord(3, 42, b"\xc3\x01" + bytes(8) + good[0].value[10:])
    decoded = decode_records([*good, cut, foreign], VALUE_SCHEMA, VALUE_SCHEMA.columns)
    assert len(decoded.changes) == 1
    assert decoded.malformed == {3: (2, 41)}
    measured = measure_changes(decoded, None, TOPIC)
    assert (measured.partitions[3].malformed, measured.partitions[3].first_malformed) == (2, 41)


def test_measure_counts_replays_truncates_and_unchanged_columns() -> None:
    records = collected(
        0,
        change(Operation.INSERT, 0x100, 0, after={"id": 1}),  # a replay
        change(Operation.UPDATE, 0x200, 0, after={"id": 1}, unchanged_columns=("note",)),
        change(Operation.TRUNCATE, 0x300, 0),
        change(Operation.INSERT, 0x300, 1, after={"id": 2}),
    )
    decoded = decode_records(records, VALUE_SCHEMA, VALUE_SCHEMA.columns)
    measured = measure_changes(decoded, state(0, Position(Lsn(0x100), 0)), TOPIC)
    part = measured.partitions[0]
    assert (part.position, part.commit_ts) == (Position(Lsn(0x300), 1), 1_000_000 + 0x300)
    assert (part.replays, part.truncates, part.truncate) == (1, 1, Position(Lsn(0x300), 0))
    assert measured.truncate == Position(Lsn(0x300), 0)
    assert measured.unchanged_columns == frozenset({"note"})


def test_the_latest_change_per_key_leaves_out_replays_and_erased_changes() -> None:
    records = collected(
        0,
        change(Operation.INSERT, 0x100, 0, after={"id": 1, "note": "replayed"}),
        change(Operation.INSERT, 0x150, 0, after={"id": 3, "note": "erased"}),
        change(Operation.INSERT, 0x200, 0, after={"id": 1, "note": "a"}),
        change(Operation.UPDATE, 0x200, 1, after={"id": 1, "note": "b"}),
        change(Operation.INSERT, 0x300, 0, after={"id": 2, "note": "c"}),
        change(Operation.DELETE, 0x400, 0, before={"id": 2}, before_key_only=True),
    )
    decoded = decode_records(records, VALUE_SCHEMA, VALUE_SCHEMA.columns)
    latest = latest_changes(
        decoded,
        state(0, Position(Lsn(0x100), 0), truncated_at=Position(Lsn(0x150), 0)),
        TOPIC,
        key_indexes=[0],
        erased_before=Position(Lsn(0x150), 0),
    )
    assert [(c.row[0], c.op, c.row[1]) for c in latest] == [(1, "UPDATE", "b"), (2, "DELETE", None)]


def test_the_arrays_have_the_tables_types_then_the_position() -> None:
    records = collected(
        0,
        change(
            Operation.INSERT,
            0x100,
            0,
            after={"id": 1, "day": 19_782, "at": 1_715_941_815_123_456, "grid": [[1]]},
        ),
    )
    decoded = decode_records(records, VALUE_SCHEMA, VALUE_SCHEMA.columns)
    arrays = change_arrays(decoded.changes, VALUE_SCHEMA.columns)
    assert list(arrays) == [
        *(c.name for c in VALUE_SCHEMA.columns),
        "_cdc_commit_lsn",
        "_cdc_ordinal",
        "_cdc_commit_ts",
    ]
    assert arrays["day"].type == pa.date32()
    assert arrays["at"].type == pa.timestamp("us", tz="UTC")
    assert arrays["local"].type == pa.timestamp("us")
    assert arrays["clock"].type == pa.int64()
    assert arrays["amount"].type == pa.decimal128(12, 2)
    assert arrays["grid"].type == pa.list_(pa.list_(pa.int32()))
    assert arrays["day"].cast(pa.int32()).to_pylist() == [19_782]
    assert arrays["_cdc_commit_lsn"].to_pylist() == [0x100]


def test_an_infinite_date_is_left_to_spark() -> None:
    """delta-rs's file statistics overflow on PostgreSQL's infinities (apply.lake.driver_plan)."""
    records = collected(0, change(Operation.INSERT, 0x100, 0, after={"id": 1, "day": 2**31 - 1}))
    decoded = decode_records(records, VALUE_SCHEMA, VALUE_SCHEMA.columns)
    with pytest.raises(DriverWriteUnavailableError, match="calendar"):
        change_arrays(decoded.changes, VALUE_SCHEMA.columns)


def test_an_unchanged_toast_value_is_carried_from_the_keys_newest_change_that_had_it() -> None:
    unchanged = ("note",)
    decoded = decode_records(
        collected(
            0,
            # Key 1: the note of its first UPDATE is carried past the second's.
            change(Operation.UPDATE, 0x100, 0, after={"id": 1, "note": "big", "amount": None}),
            change(Operation.UPDATE, 0x100, 1, after={"id": 1}, unchanged_columns=unchanged),
            # Key 2: no change of the batch has its note: the table's is kept.
            change(Operation.UPDATE, 0x100, 2, after={"id": 2}, unchanged_columns=unchanged),
            # Key 3: deleted after the UPDATE.
            change(Operation.UPDATE, 0x100, 3, after={"id": 3}, unchanged_columns=unchanged),
            change(Operation.DELETE, 0x100, 4, before={"id": 3}, before_key_only=True),
            # Key 4: its newest change carries a note of its own.
            change(Operation.UPDATE, 0x100, 5, after={"id": 4}, unchanged_columns=unchanged),
            change(Operation.UPDATE, 0x100, 6, after={"id": 4, "note": "new"}),
        ),
        VALUE_SCHEMA,
        VALUE_SCHEMA.columns,
    )
    measured = measure_changes(decoded, None, TOPIC)
    latest = latest_changes(
        decoded,
        None,
        TOPIC,
        key_indexes=[0],
        erased_before=None,
        columns=[column.name for column in VALUE_SCHEMA.columns],
        unchanged_columns=measured.unchanged_columns,
    )
    assert [(c.row[0], c.op, c.row[1], c.unchanged) for c in latest] == [
        (1, "UPDATE", "big", ()),
        (2, "UPDATE", None, ("note",)),
        (3, "DELETE", None, ()),
        (4, "UPDATE", "new", ()),
    ]
