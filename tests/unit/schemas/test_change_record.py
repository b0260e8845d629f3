"""Schema building, naming, encoding and headers of change records."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from fastavro import parse_schema

from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from schemas.column_type import AvroKind, ColumnType
from schemas.envelope import OPERATION_SCHEMA, TABLE_KEY, TABLE_KEY_FINGERPRINT
from schemas.errors import ChangeEncodingError, TableDefinitionError
from schemas.headers import (
    CHANGE_LSN,
    COMMIT_LSN,
    OPERATION,
    SCHEMA_FINGERPRINT,
    change_headers,
    tombstone_headers,
)
from schemas.lsn import Lsn
from schemas.naming import avro_name, schema_topic, table_topic, topic_segment
from schemas.operation import SYMBOLS, Operation
from schemas.single_object import canonical_form, format_fingerprint, header

PROJECT_ROOT = Path(__file__).resolve().parents[3]
AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ORDERS = TableDescription(
    "public",
    "orders",
    (
        Column("id", ct.LONG, nullable=False, key=True),
        Column("amount", ColumnType.decimal(12, 2)),
        Column("note", ct.STRING),
    ),
)


def _change(op: Operation, **images: Any) -> Change:
    return Change(
        op, Lsn(0x16_B374_D848), Lsn(0x16_B374_D000), 771, 1_715_941_815_200_000, 3, **images
    )


# --- schema building -------------------------------------------------------------------


def test_example_table_has_the_documented_fingerprints() -> None:
    # docs/wire-contract.md shows these schemas; a change here is a contract change.
    schemas = build_table_schemas(ORDERS)
    assert format_fingerprint(schemas.key_fingerprint) == "7978dcaabf0ec31f"
    assert format_fingerprint(schemas.value_fingerprint) == "456e9fc13a5ccba8"
    assert schemas.value_schema["namespace"] == "pgdelta.public.orders.s008100b98de7b89a"


def test_example_value_schema_is_the_one_in_the_docs() -> None:
    docs = (PROJECT_ROOT / "docs" / "wire-contract.md").read_text("utf-8")
    documented = re.search(r"<!-- value-schema -->\n```json\n(.*?)```", docs, re.DOTALL)
    assert documented is not None
    assert json.loads(documented[1]) == build_table_schemas(ORDERS).value_schema


def test_same_description_gives_same_schemas_in_any_process() -> None:
    first = build_table_schemas(ORDERS)
    again = build_table_schemas(replace(ORDERS, columns=tuple(ORDERS.columns)))
    assert first.value_schema_json == again.value_schema_json
    assert first.key_schema_json == again.key_schema_json
    script = (
        "from schemas.change_record import *; from schemas.column_type import *; "
        "d = TableDescription('public', 'orders', (Column('id', LONG, nullable=False, "
        "key=True), Column('amount', ColumnType.decimal(12, 2)), Column('note', STRING))); "
        "s = build_table_schemas(d); print(s.key_fingerprint, s.value_fingerprint)"
    )
    for seed in ("0", "12345"):
        output = subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert output == [str(first.key_fingerprint), str(first.value_fingerprint)]


def test_schema_json_is_the_schema() -> None:
    schemas = build_table_schemas(ORDERS)
    assert json.loads(schemas.value_schema_json) == schemas.value_schema
    assert json.loads(schemas.key_schema_json) == schemas.key_schema


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (ColumnType.decimal(10, 2), ColumnType.decimal(10, 4)),
        (ct.TIMESTAMP_MICROS, ct.LOCAL_TIMESTAMP_MICROS),
        (ct.DATE, ct.INT),
        (ct.UUID, ct.STRING),
        (ct.TIME_MICROS, ct.LONG),
    ],
)
def test_types_with_one_physical_form_still_get_distinct_fingerprints(
    old: ColumnType, new: ColumnType
) -> None:
    def table(column_type: ColumnType) -> TableDescription:
        return TableDescription(
            "s", "t", (Column("k", column_type, nullable=False, key=True), Column("v", column_type))
        )

    before, after = build_table_schemas(table(old)), build_table_schemas(table(new))
    for old_schema, new_schema in [
        (before.key_schema, after.key_schema),
        (before.value_schema, after.value_schema),
    ]:
        # Same bytes on the wire, different meaning: only the namespace digest tells them apart.
        assert canonical_form({**old_schema, "namespace": "n"}) == canonical_form(
            {**new_schema, "namespace": "n"}
        )
    assert before.key_fingerprint != after.key_fingerprint
    assert before.value_fingerprint != after.value_fingerprint


def test_key_schema_ignores_non_key_columns() -> None:
    wider = replace(ORDERS, columns=(*ORDERS.columns, Column("shipped", ct.BOOLEAN)))
    nullable_note = replace(
        ORDERS, columns=(*ORDERS.columns[:2], Column("note", ct.STRING, nullable=False))
    )
    base = build_table_schemas(ORDERS)
    row = {"id": 42, "amount": Decimal("1.00"), "note": None}
    for variant in (wider, nullable_note):
        schemas = build_table_schemas(variant)
        assert schemas.key_fingerprint == base.key_fingerprint
        assert schemas.value_fingerprint != base.value_fingerprint
        key = ChangeEncoder(schemas).encode_key(_change(Operation.INSERT, after=row))
        assert key == ChangeEncoder(base).encode_key(_change(Operation.INSERT, after=row))


def test_value_schema_layout() -> None:
    schemas = build_table_schemas(ORDERS)
    value = schemas.value_schema
    assert [f["name"] for f in value["fields"]] == [
        "op",
        "commit_lsn",
        "change_lsn",
        "xid",
        "commit_ts",
        "ordinal",
        "before_key_only",
        "before",
        "after",
        "unchanged_columns",
    ]
    assert value["name"] == "Change"
    assert value["pg.schema"] == "public"
    assert value["pg.table"] == "orders"
    row = value["fields"][7]["type"][1]
    assert schemas.row_name == f"{value['namespace']}.Row"
    # Every column nullable whatever NOT NULL says; NOT NULL is kept as an attribute.
    assert [(f["type"][0], f["pg.nullable"], f["pg.key"]) for f in row["fields"]] == [
        ("null", False, True),
        ("null", True, False),
        ("null", True, False),
    ]
    assert value["fields"][8]["type"] == ["null", "Row"]
    assert schemas.key_schema["fields"] == [{"name": "id", "type": "long", "pg.name": "id"}]
    assert schemas.key_schema["name"] == "Key"


def test_operation_enum_matches_its_avsc() -> None:
    assert tuple(OPERATION_SCHEMA["symbols"]) == SYMBOLS
    assert OPERATION_SCHEMA["namespace"] == "pgdelta.contract"


def test_nullable_key_columns_stay_nullable_in_the_key() -> None:
    table = TableDescription(
        "s", "t", (Column("a", ct.INT, nullable=True, key=True), Column("b", ct.INT))
    )
    assert build_table_schemas(table).key_schema["fields"][0]["type"] == ["null", "int"]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ((), "without columns"),
        ((Column("a", ct.INT),), "no key column"),
        ((Column("a", ct.INT, key=True), Column("a", ct.LONG)), r"\['a'\] appear more than once"),
        ((Column("", ct.INT, key=True),), "empty name"),
    ],
)
def test_invalid_descriptions_are_refused(columns: tuple[Column, ...], message: str) -> None:
    with pytest.raises(TableDefinitionError, match=message) as caught:
        build_table_schemas(TableDescription("s", "t", columns))
    assert caught.value.table == "s.t"


def test_every_column_type_builds_a_schema_fastavro_accepts() -> None:
    types = [
        ct.BOOLEAN,
        ct.INT,
        ct.LONG,
        ct.FLOAT,
        ct.DOUBLE,
        ct.BYTES,
        ct.STRING,
        ColumnType.decimal(38, 38),
        ct.DATE,
        ct.TIME_MICROS,
        ct.TIMESTAMP_MICROS,
        ct.LOCAL_TIMESTAMP_MICROS,
        ct.UUID,
        ColumnType.array(ColumnType.array(ColumnType.decimal(5, 0))),
    ]
    assert {t.kind for t in types} == set(AvroKind)
    columns = tuple(Column(f"c{i}", t, key=i == 0) for i, t in enumerate(types))
    schemas = build_table_schemas(TableDescription("s", "t", columns))
    parse_schema(schemas.value_schema)
    parse_schema(schemas.key_schema)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ColumnType.decimal(39, 0), "precision 39"),
        (lambda: ColumnType.decimal(0, 0), "precision 0"),
        (lambda: ColumnType.decimal(10, 11), "scale 11"),
        (lambda: ColumnType.decimal(10, -1), "scale -1"),
        (lambda: ColumnType(AvroKind.DECIMAL), "needs a precision"),
        (lambda: ColumnType(AvroKind.LONG, precision=3), "takes no precision"),
        (lambda: ColumnType(AvroKind.ARRAY), "items"),
        (lambda: ColumnType(AvroKind.LONG, items=ct.LONG), "items"),
    ],
)
def test_invalid_column_types_are_refused(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


# --- names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("identifier", "name"),
    [
        ("id", "id"),
        ("Orders", "Orders"),
        ("_private", "_private"),
        ("order-items", "_pg_order_2ditems"),
        ("created at", "_pg_created_20at"),
        ("1st", "_pg_1st"),
        ("Straße", "_pg_Stra_c3_9fe"),
        ("a_b-c", "_pg_a__b_2dc"),
        ("_pg_x", "_pg___pg__x"),
    ],
)
def test_avro_name(identifier: str, name: str) -> None:
    assert avro_name(identifier) == name


def test_avro_name_is_injective_and_valid() -> None:
    # Every string of up to 4 characters over the characters that matter to the escape.
    alphabet = "_-pgx2dß. "
    seen: dict[str, str] = {}
    for length in range(1, 5):
        for chars in itertools.product(alphabet, repeat=length):
            identifier = "".join(chars)
            name = avro_name(identifier)
            assert AVRO_NAME.fullmatch(name), identifier
            assert seen.setdefault(name, identifier) == identifier
    assert len(seen) == sum(len(alphabet) ** n for n in range(1, 5))


def test_topic_segment_is_injective_and_valid() -> None:
    alphabet = "_-.aZ9ß "
    seen: dict[str, str] = {}
    for length in range(1, 5):
        for chars in itertools.product(alphabet, repeat=length):
            identifier = "".join(chars)
            segment = topic_segment(identifier)
            assert re.fullmatch(r"[A-Za-z0-9_-]+", segment), identifier
            assert seen.setdefault(segment, identifier) == identifier


def test_original_names_travel_as_pg_name() -> None:
    table = TableDescription(
        "Sales Data", "order-items", (Column("Line No", ct.INT, nullable=False, key=True),)
    )
    schemas = build_table_schemas(table)
    assert schemas.field_names == ("_pg_Line_20No",)
    assert schemas.key_schema["fields"][0]["pg.name"] == "Line No"
    assert schemas.value_schema["pg.schema"] == "Sales Data"
    assert schemas.value_schema["pg.table"] == "order-items"
    assert schemas.value_schema["namespace"].startswith(
        "pgdelta._pg_Sales_20Data._pg_order_2ditems.s"
    )
    parse_schema(schemas.value_schema)


def test_topic_names() -> None:
    assert table_topic("cdc", "public", "orders") == "cdc.public.orders"
    assert (
        table_topic("prod.cdc", "my.schema", "order-items") == "prod.cdc.my-2eschema.order-2ditems"
    )
    assert schema_topic("cdc") == "cdc._schemas"
    with pytest.raises(ValueError, match="topic prefix"):
        schema_topic("cdc/x")
    with pytest.raises(ValueError, match="topic prefix"):
        table_topic(".cdc", "s", "t")
    with pytest.raises(TableDefinitionError, match="Kafka allows 249"):
        table_topic("cdc", "s", "t" * 250)


# --- changes and encoding -------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "images", "message"),
    [
        (Operation.INSERT, {}, "after image only"),
        (Operation.INSERT, {"before": {"id": 1}, "after": {"id": 1}}, "after image only"),
        (Operation.READ, {"before": {"id": 1}}, "after image only"),
        (Operation.UPDATE, {"before": {"id": 1}}, "an after image"),
        (Operation.DELETE, {"after": {"id": 1}}, "before image only"),
        (Operation.TRUNCATE, {"before": {"id": 1}}, "no row image"),
    ],
)
def test_change_refuses_row_images_its_operation_cannot_have(
    op: Operation, images: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _change(op, **images)


def test_change_refuses_unchanged_columns_outside_update() -> None:
    with pytest.raises(ValueError, match="only an UPDATE"):
        _change(Operation.INSERT, after={"id": 1}, unchanged_columns=("note",))
    with pytest.raises(ValueError, match="needs a before image"):
        _change(Operation.INSERT, after={"id": 1}, before_key_only=True)


def test_value_starts_with_the_value_schema_header() -> None:
    schemas = build_table_schemas(ORDERS)
    encoded = ChangeEncoder(schemas).encode_value(_change(Operation.INSERT, after={"id": 1}))
    assert encoded.startswith(header(schemas.value_fingerprint))


def test_encoder_leaves_the_schemas_untouched() -> None:
    schemas = build_table_schemas(ORDERS)
    ChangeEncoder(schemas, physical_values=True)
    ChangeEncoder(schemas)
    assert json.dumps(schemas.value_schema, separators=(",", ":")) == schemas.value_schema_json
    assert json.dumps(schemas.key_schema, separators=(",", ":")) == schemas.key_schema_json


def test_keys() -> None:
    schemas = build_table_schemas(ORDERS)
    encoder = ChangeEncoder(schemas)
    key = header(schemas.key_fingerprint) + b"\x54"  # zig-zag 42
    assert encoder.encode_key(_change(Operation.INSERT, after={"id": 42, "note": "x"})) == key
    assert encoder.encode_key(_change(Operation.DELETE, before={"id": 42})) == key
    truncate = encoder.encode_key(_change(Operation.TRUNCATE))
    assert truncate == TABLE_KEY == header(TABLE_KEY_FINGERPRINT)


def test_buffers_are_reused_without_leaking_bytes() -> None:
    encoder = ChangeEncoder(build_table_schemas(ORDERS))
    long_note = _change(Operation.INSERT, after={"id": 1, "note": "x" * 100})
    short = _change(Operation.INSERT, after={"id": 1})
    first = encoder.encode_value(short)
    encoder.encode_value(long_note)
    assert encoder.encode_value(short) == first


def test_physical_values_give_the_same_bytes() -> None:
    table = TableDescription(
        "s",
        "t",
        (
            Column("id", ct.UUID, nullable=False, key=True),
            Column("amount", ColumnType.decimal(12, 2)),
            Column("day", ct.DATE),
            Column("at", ct.TIMESTAMP_MICROS),
            Column("local", ct.LOCAL_TIMESTAMP_MICROS),
            Column("clock", ct.TIME_MICROS),
            Column("days", ColumnType.array(ct.DATE)),
        ),
    )
    schemas = build_table_schemas(table)
    uuid = "5f0c7a6e-7c3e-4c1e-9a39-2a4b2f0d2f11"
    typed = {
        "id": UUID(uuid),
        "amount": Decimal("-1234.5"),
        "day": date(2024, 5, 18),
        "at": datetime(2024, 5, 17, 10, 30, 15, 123456, tzinfo=UTC),
        "local": datetime(2024, 5, 17, 10, 30, 15, 123456),
        "clock": time(10, 30, 15, 123456),
        "days": [date(1970, 1, 2), None],
    }
    physical = {
        "id": uuid,
        "amount": (-123450).to_bytes(3, "big", signed=True),
        "day": 19_861,
        "at": 1_715_941_815_123_456,
        "local": 1_715_941_815_123_456,
        "clock": 37_815_123_456,
        "days": [1, None],
    }
    typed_bytes = ChangeEncoder(schemas).encode_value(_change(Operation.INSERT, after=typed))
    fast = ChangeEncoder(schemas, physical_values=True)
    assert fast.encode_value(_change(Operation.INSERT, after=physical)) == typed_bytes
    assert (
        ChangeEncoder(schemas).encode_value(_change(Operation.INSERT, after=physical))
        == typed_bytes
    )
    with pytest.raises(ChangeEncodingError):
        fast.encode_value(_change(Operation.INSERT, after=typed))


NARROW = TableDescription(
    "public",
    "narrow",
    (
        Column("id", ct.LONG, nullable=False, key=True),
        Column("amount", ColumnType.decimal(4, 2)),
        Column("small", ct.INT),
        Column("day", ct.DATE),
        Column("secret", ct.STRING),
    ),
)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "one"}, "column 'id' does not fit its Avro type"),
        ({"id": 2**63}, "the value of a column does not fit its Avro type \\(OverflowError\\)"),
        ({"id": 1, "amount": Decimal("1.234")}, "does not fit its Avro type \\(ValueError\\)"),
        ({"id": 1, "amount": 1.5}, "column 'amount' does not fit its Avro type"),
        ({"id": 1, "secret": 5}, "column 'secret' does not fit its Avro type"),
        ({"id": 1, "shipped": True}, "'shipped' that is not an Avro field name"),
        # Values fastavro would write but readers reject or misread.
        ({"id": 1, "small": 2**31}, "'small' is outside the range"),
        ({"id": 1, "small": -(2**31) - 1}, "'small' is outside the range"),
        ({"id": 1, "day": 2**31}, "'day' is outside the range"),
        ({"id": 1, "amount": Decimal("100.00")}, "'amount' is outside the range"),
        ({"id": 1, "amount": Decimal("NaN")}, "'amount' is outside the range"),
        ({"id": 1, "amount": (10_000).to_bytes(3, "big", signed=True)}, "'amount' is outside"),
    ],
)
def test_values_that_do_not_fit_raise_a_table_error(row: dict[str, Any], message: str) -> None:
    encoder = ChangeEncoder(build_table_schemas(NARROW))
    with pytest.raises(ChangeEncodingError, match=message) as caught:
        encoder.encode_value(_change(Operation.INSERT, after=row))
    assert caught.value.table == "public.narrow"


@pytest.mark.parametrize(
    "row",
    [
        {"id": 1, "small": 2**31 - 1, "day": -(2**31), "amount": Decimal("99.99")},
        {"id": 1, "small": -(2**31), "day": date(9999, 1, 1), "amount": Decimal("-0.01")},
        {"id": 1, "amount": Decimal("0E+7")},
        {"id": 1, "amount": (-9_999).to_bytes(2, "big", signed=True)},
    ],
)
def test_values_at_the_edge_of_their_range_are_written(row: dict[str, Any]) -> None:
    ChangeEncoder(build_table_schemas(NARROW)).encode_value(_change(Operation.INSERT, after=row))


def test_encoding_errors_never_quote_the_value() -> None:
    table = TableDescription(
        "s", "t", (Column("k", ct.STRING, nullable=True, key=True), Column("v", ct.STRING))
    )
    encoder = ChangeEncoder(build_table_schemas(table))
    change = _change(Operation.INSERT, after={"k": b"top-secret", "v": b"top-secret"})
    with pytest.raises(ChangeEncodingError) as key_error:
        encoder.encode_key(change)
    # fastavro's own message for a nullable key column quotes the value; ours must not.
    assert "top-secret" in str(key_error.value.__cause__)
    assert "top-secret" not in str(key_error.value)
    with pytest.raises(ChangeEncodingError) as value_error:
        encoder.encode_value(change)
    assert "top-secret" not in str(value_error.value)


def test_a_missing_key_value_raises_a_table_error() -> None:
    encoder = ChangeEncoder(build_table_schemas(ORDERS))
    with pytest.raises(ChangeEncodingError, match="does not fit"):
        encoder.encode_key(_change(Operation.INSERT, after={"note": "x"}))


def test_unchanged_columns_must_be_null_fields_of_the_table() -> None:
    encoder = ChangeEncoder(build_table_schemas(ORDERS))
    encoder.encode_value(_change(Operation.UPDATE, after={"id": 1}, unchanged_columns=("note",)))
    with pytest.raises(ChangeEncodingError, match="'nope' is not an Avro field name"):
        encoder.encode_value(
            _change(Operation.UPDATE, after={"id": 1}, unchanged_columns=("nope",))
        )
    with pytest.raises(ChangeEncodingError, match="must be null there"):
        encoder.encode_value(
            _change(Operation.UPDATE, after={"id": 1, "note": ""}, unchanged_columns=("note",))
        )


def test_an_update_that_changes_the_key_is_refused() -> None:
    encoder = ChangeEncoder(build_table_schemas(ORDERS))
    with pytest.raises(ChangeEncodingError, match="DELETE of the old key"):
        encoder.encode_value(_change(Operation.UPDATE, before={"id": 1}, after={"id": 2}))


# --- headers --------------------------------------------------------------------------


def test_change_headers() -> None:
    schemas = build_table_schemas(ORDERS)
    headers = change_headers(_change(Operation.DELETE, before={"id": 1}), schemas.value_fingerprint)
    assert headers == [
        (COMMIT_LSN, b"16/B374D848"),
        (CHANGE_LSN, b"16/B374D000"),
        (OPERATION, b"DELETE"),
        (SCHEMA_FINGERPRINT, format_fingerprint(schemas.value_fingerprint).encode()),
    ]


def test_tombstone_headers_follow_a_delete_only() -> None:
    delete = _change(Operation.DELETE, before={"id": 1})
    assert tombstone_headers(delete) == [(COMMIT_LSN, b"16/B374D848"), (CHANGE_LSN, b"16/B374D000")]
    with pytest.raises(ValueError, match="only a DELETE"):
        tombstone_headers(_change(Operation.INSERT, after={"id": 1}))
