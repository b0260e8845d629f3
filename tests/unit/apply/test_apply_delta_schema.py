"""Delta columns from value schemas: the documented type mapping and schema evolution."""

from __future__ import annotations

import json

import pytest
from pyspark.sql.types import LongType, StringType

from apply.errors import SchemaChangeError, TableError
from apply.lake.delta_schema import (
    COMMIT_LSN_COLUMN,
    ColumnSpec,
    ExistingTable,
    parse_value_schema,
    plan_columns,
    spark_type,
    table_schema,
)
from apply.lake.tables import TableId
from schemas import column_type as ct
from schemas.change_record import Column, TableDescription, TableSchemas, build_table_schemas
from schemas.column_type import ColumnType

TABLE = TableId("public", "orders")
KEY = Column("id", ct.LONG, nullable=False, key=True)

# The table in the apply.lake.delta_schema docstring and docs/apply.md.
MAPPING = [
    (ct.BOOLEAN, "boolean"),
    (ct.INT, "int"),
    (ct.LONG, "bigint"),
    (ct.FLOAT, "float"),
    (ct.DOUBLE, "double"),
    (ct.BYTES, "binary"),
    (ct.STRING, "string"),
    (ColumnType.decimal(12, 2), "decimal(12,2)"),
    (ColumnType.decimal(38, 0), "decimal(38,0)"),
    (ct.DATE, "date"),
    (ct.TIME_MICROS, "bigint"),
    (ct.TIMESTAMP_MICROS, "timestamp"),
    (ct.LOCAL_TIMESTAMP_MICROS, "timestamp_ntz"),
    (ct.UUID, "string"),
    (ColumnType.array(ct.STRING), "array<string>"),
    (ColumnType.array(ColumnType.array(ColumnType.decimal(5, 1))), "array<array<decimal(5,1)>>"),
]


def schemas(*columns: Column, table: TableId = TABLE) -> TableSchemas:
    return build_table_schemas(TableDescription(table.schema, table.table, (KEY, *columns)))


def value_schema(built: TableSchemas, table: TableId = TABLE):
    return parse_value_schema(table, built.value_fingerprint, built.value_schema_json)


@pytest.mark.parametrize(("column_type", "delta"), MAPPING)
def test_type_mapping(column_type: ColumnType, delta: str) -> None:
    assert spark_type(column_type.avro()).simpleString() == delta
    column = value_schema(schemas(Column("c", column_type))).columns[1]
    assert column.data_type.simpleString() == delta


def test_arrays_hold_nulls() -> None:
    mapped = spark_type(ColumnType.array(ct.INT).avro())
    assert mapped.containsNull  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "avro",
    [
        "null",
        {"type": "map", "values": "string"},
        {"type": "fixed", "name": "F", "size": 2},
        {"type": "long", "logicalType": "timestamp-nanos"},
        {"type": "array", "items": ["null", "int", "string"]},
    ],
)
def test_types_outside_the_contract_are_refused(avro: object) -> None:
    with pytest.raises(ValueError, match=r"Avro type|union"):
        spark_type(avro)


def test_value_schema_columns_keys_and_decode_text() -> None:
    built = schemas(Column("Order Note", ct.STRING), Column("clock", ct.TIME_MICROS))
    parsed = value_schema(built)
    assert parsed.table == TABLE
    assert [c.name for c in parsed.columns] == ["id", "_pg_Order_20Note", "clock"]
    assert parsed.key_columns == ("id",)
    # time-micros is read as long; nothing else in the schema changes.
    assert "time-micros" in built.value_schema_json
    assert "time-micros" not in parsed.decode_json
    assert json.loads(parsed.decode_json)["namespace"] == built.value_schema["namespace"]


def test_key_schema_or_other_table_on_the_topic_is_a_table_error() -> None:
    built = schemas()
    with pytest.raises(TableError, match="not a Change value"):
        parse_value_schema(TABLE, built.key_fingerprint, built.key_schema_json)
    with pytest.raises(TableError, match=r"describes table public\.orders"):
        value_schema(built, TableId("public", "other"))


def existing(*columns: ColumnSpec) -> ExistingTable:
    return ExistingTable(
        columns=(ColumnSpec("id", LongType(), key=True), *columns),
        key_columns=("id",),
        has_timestamp_ntz=False,
    )


def test_new_table_takes_the_union_of_the_batch_schemas() -> None:
    v1 = value_schema(schemas(Column("note", ct.STRING)))
    v2 = value_schema(schemas(Column("note", ct.STRING), Column("extra", ct.INT)))
    plan = plan_columns(TABLE, None, [v2, v1])
    assert plan.create
    assert [c.name for c in plan.columns] == ["id", "note", "extra"]
    assert plan.added == ()
    assert plan.key_columns == ("id",)
    assert [f.name for f in table_schema(plan.columns).fields][-3:] == [
        COMMIT_LSN_COLUMN,
        "_cdc_ordinal",
        "_cdc_commit_ts",
    ]


def test_added_columns_come_after_the_table_columns() -> None:
    v2 = value_schema(schemas(Column("extra", ct.INT), Column("note", ct.STRING)))
    plan = plan_columns(TABLE, existing(ColumnSpec("note", StringType())), [v2])
    assert not plan.create
    assert [c.name for c in plan.columns] == ["id", "note", "extra"]
    assert [c.name for c in plan.added] == ["extra"]


def test_dropped_columns_stay() -> None:
    v2 = value_schema(schemas())
    plan = plan_columns(TABLE, existing(ColumnSpec("gone", StringType())), [v2])
    assert [c.name for c in plan.columns] == ["id", "gone"]
    assert plan.added == ()


def test_tombstone_only_batch_keeps_the_table_as_is() -> None:
    plan = plan_columns(TABLE, existing(ColumnSpec("note", StringType())), [])
    assert [c.name for c in plan.columns] == ["id", "note"]
    assert plan.key_columns == ("id",)


def test_retyped_column_is_a_schema_change() -> None:
    v2 = value_schema(schemas(Column("note", ct.INT)))
    with pytest.raises(SchemaChangeError, match="note changed type from string to int"):
        plan_columns(TABLE, existing(ColumnSpec("note", StringType())), [v2])


def test_retyped_column_within_one_batch_is_a_schema_change() -> None:
    v1 = value_schema(schemas(Column("amount", ColumnType.decimal(10, 2))))
    v2 = value_schema(schemas(Column("amount", ColumnType.decimal(10, 4))))
    with pytest.raises(SchemaChangeError, match=r"decimal\(10,2\) to decimal\(10,4\)"):
        plan_columns(TABLE, None, [v1, v2])


def test_changed_key_is_a_schema_change() -> None:
    rekeyed = build_table_schemas(
        TableDescription("public", "orders", (Column("code", ct.STRING, key=True),))
    )
    with pytest.raises(SchemaChangeError, match="key columns changed"):
        plan_columns(TABLE, existing(), [value_schema(rekeyed)])


@pytest.mark.parametrize("name", ["ID", COMMIT_LSN_COLUMN, "_CDC_Ordinal"])
def test_names_that_collide_in_delta_are_refused(name: str) -> None:
    with pytest.raises(SchemaChangeError, match=f"column {name} collides"):
        plan_columns(TABLE, None, [value_schema(schemas(Column(name, ct.STRING)))])
