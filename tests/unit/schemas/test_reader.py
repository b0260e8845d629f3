"""The reader and the schema-topic records: round trips and every way decoding fails."""

from __future__ import annotations

import io
import json
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    TableSchemas,
    build_table_schemas,
)
from schemas.column_type import ColumnType
from schemas.envelope import TABLE_KEY, TABLE_KEY_FINGERPRINT, WRITER_SCHEMA_FINGERPRINT
from schemas.errors import (
    BadMarkerError,
    MalformedRecordError,
    RoleMismatchError,
    SchemaMessageError,
    TruncatedRecordError,
    UnknownFingerprintError,
)
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.reader import ContractReader, UnrepresentableTemporal
from schemas.schema_topic import (
    TABLE_KEY_SCHEMA_MESSAGE,
    read_schema_message,
    schema_message,
    table_schema_messages,
)
from schemas.single_object import (
    Fingerprint,
    fingerprint_bytes,
    format_fingerprint,
    header,
    schema_fingerprint,
    split,
)

SCHEMA_TOPIC = "cdc._schemas"

ALL_TYPES = TableDescription(
    "public",
    "everything",
    (
        Column("id", ct.LONG, nullable=False, key=True),
        Column("day", ct.DATE, nullable=False, key=True),
        Column("flag", ct.BOOLEAN),
        Column("small", ct.INT),
        Column("ratio", ct.FLOAT),
        Column("score", ct.DOUBLE),
        Column("blob", ct.BYTES),
        Column("Order Note", ct.STRING),
        Column("amount", ColumnType.decimal(38, 10)),
        Column("at", ct.TIMESTAMP_MICROS),
        Column("local", ct.LOCAL_TIMESTAMP_MICROS),
        Column("clock", ct.TIME_MICROS),
        Column("ref", ct.UUID),
        Column("tags", ColumnType.array(ct.STRING)),
        Column("grid", ColumnType.array(ColumnType.array(ct.TIMESTAMP_MICROS))),
    ),
)

ROW: dict[str, Any] = {
    "id": 2**62,
    "day": date(2024, 2, 29),
    "flag": True,
    "small": -(2**31),
    "ratio": 0.5,
    "score": -1e300,
    "blob": b"\x00\xff",
    "_pg_Order_20Note": "naïve ☃",
    "amount": Decimal("-1234567890123456789012345678.0123456789"),
    "at": datetime(2024, 5, 17, 10, 30, 15, 123456, tzinfo=UTC),
    "local": datetime(2024, 5, 17, 10, 30, 15, 123456),
    "clock": time(23, 59, 59, 999999),
    "ref": UUID("5f0c7a6e-7c3e-4c1e-9a39-2a4b2f0d2f11"),
    "tags": ["a", None, ""],
    "grid": [[datetime(1970, 1, 1, tzinfo=UTC), None], []],
}


def _change(op: Operation, **images: Any) -> Change:
    return Change(op, Lsn(2**40 + 7), Lsn(2**40), 4_000_000_000, 1_715_941_815_200_000, 9, **images)


def _setup(
    description: TableDescription = ALL_TYPES,
) -> tuple[TableSchemas, ChangeEncoder, ContractReader]:
    schemas = build_table_schemas(description)
    reader = ContractReader(SCHEMA_TOPIC)
    for message in table_schema_messages(schemas):
        assert reader.add_schema_message(message.key, message.value) is not None
    return schemas, ChangeEncoder(schemas), reader


def _envelope(op: str, **fields: Any) -> dict[str, Any]:
    return {
        "op": op,
        "commit_lsn": 2**40 + 7,
        "change_lsn": 2**40,
        "xid": 4_000_000_000,
        "commit_ts": datetime(2024, 5, 17, 10, 30, 15, 200000, tzinfo=UTC),
        "ordinal": 9,
        "before_key_only": False,
        "before": None,
        "after": None,
        "unchanged_columns": [],
        **fields,
    }


def test_insert_round_trip_with_every_column_type() -> None:
    _, encoder, reader = _setup()
    change = _change(Operation.INSERT, after=ROW)
    assert reader.decode_value(encoder.encode_value(change)) == _envelope("INSERT", after=ROW)
    assert reader.decode_key(encoder.encode_key(change)) == {"id": 2**62, "day": date(2024, 2, 29)}


def test_missing_columns_read_back_as_null() -> None:
    schemas, encoder, reader = _setup()
    row = {"id": 1, "day": date(2000, 1, 1)}
    decoded = reader.decode_value(encoder.encode_value(_change(Operation.READ, after=row)))
    assert decoded["after"] == dict.fromkeys(schemas.field_names) | row
    assert decoded["op"] == "READ"


def test_update_with_unchanged_toast_column() -> None:
    _schemas, encoder, reader = _setup()
    after = {**ROW, "_pg_Order_20Note": None}
    change = _change(
        Operation.UPDATE, before=ROW, after=after, unchanged_columns=("_pg_Order_20Note",)
    )
    assert reader.decode_value(encoder.encode_value(change)) == _envelope(
        "UPDATE", before=ROW, after=after, unchanged_columns=["_pg_Order_20Note"]
    )


def test_key_only_delete() -> None:
    schemas, encoder, reader = _setup()
    before = {"id": 5, "day": date(2024, 1, 1)}
    change = _change(Operation.DELETE, before=before, before_key_only=True)
    decoded = reader.decode_value(encoder.encode_value(change))
    assert decoded == _envelope(
        "DELETE", before=dict.fromkeys(schemas.field_names) | before, before_key_only=True
    )
    assert reader.decode_key(encoder.encode_key(change)) == before


def test_truncate() -> None:
    _, encoder, reader = _setup()
    change = _change(Operation.TRUNCATE)
    assert reader.decode_value(encoder.encode_value(change)) == _envelope("TRUNCATE")
    assert encoder.encode_key(change) == TABLE_KEY
    assert reader.decode_key(TABLE_KEY) == {}


@pytest.mark.parametrize(
    ("column_type", "value", "infinity"),
    [
        (ct.DATE, ct.DATE_POSITIVE_INFINITY, 1),
        (ct.DATE, ct.DATE_NEGATIVE_INFINITY, -1),
        (ct.DATE, -719_163, 0),  # 0000-12-31, before Python's year 1
        (ct.TIMESTAMP_MICROS, ct.TIMESTAMP_POSITIVE_INFINITY, 1),
        (ct.TIMESTAMP_MICROS, ct.TIMESTAMP_NEGATIVE_INFINITY, -1),
        (ct.LOCAL_TIMESTAMP_MICROS, ct.TIMESTAMP_POSITIVE_INFINITY, 1),
        (ct.LOCAL_TIMESTAMP_MICROS, 253_402_300_800_000_000, 0),  # 10000-01-01
        (ct.TIME_MICROS, ct.MAX_TIME_MICROS, 0),  # 24:00:00
    ],
)
def test_temporal_values_python_cannot_hold_come_back_exactly(
    column_type: ColumnType, value: int, infinity: int
) -> None:
    table = TableDescription(
        "s",
        "t",
        (
            Column("k", column_type, nullable=False, key=True),
            Column("list", ColumnType.array(column_type)),
        ),
    )
    _, encoder, reader = _setup(table)
    change = _change(Operation.INSERT, after={"k": value, "list": [value, None]})
    expected = UnrepresentableTemporal(column_type.kind.value, value)
    assert expected.infinity == infinity
    assert reader.decode_value(encoder.encode_value(change))["after"] == {
        "k": expected,
        "list": [expected, None],
    }
    assert reader.decode_key(encoder.encode_key(change)) == {"k": expected}


@pytest.mark.parametrize(
    ("column_type", "value", "expected"),
    [
        (ct.DATE, -719_162, date(1, 1, 1)),
        (ct.DATE, 2_932_896, date(9999, 12, 31)),
        (ct.TIMESTAMP_MICROS, -62_135_596_800_000_000, datetime(1, 1, 1, tzinfo=UTC)),
        (ct.TIME_MICROS, ct.MAX_TIME_MICROS - 1, time(23, 59, 59, 999999)),
        (ct.TIME_MICROS, 0, time(0)),
    ],
)
def test_temporal_values_at_the_edge_of_python_are_converted(
    column_type: ColumnType, value: int, expected: object
) -> None:
    table = TableDescription("s", "t", (Column("k", column_type, nullable=False, key=True),))
    _, encoder, reader = _setup(table)
    change = _change(Operation.INSERT, after={"k": value})
    assert reader.decode_value(encoder.encode_value(change))["after"] == {"k": expected}


def test_plain_fastavro_reads_the_same_values() -> None:
    # A consumer without this package: strip the header, decode with the published JSON.
    schemas, encoder, reader = _setup()
    encoded = encoder.encode_value(_change(Operation.INSERT, after=ROW))
    fingerprint, body = split(encoded)
    schema = parse_schema(json.loads(reader.schema_json(fingerprint)))
    assert schemaless_reader(io.BytesIO(body), schema, None) == reader.decode_value(encoded)
    assert reader.schema_json(fingerprint) == schemas.value_schema_json


# --- decode errors --------------------------------------------------------------------


def test_unknown_fingerprint_says_to_read_the_schema_topic() -> None:
    schemas = build_table_schemas(ALL_TYPES)
    encoded = ChangeEncoder(schemas).encode_value(_change(Operation.INSERT, after=ROW))
    reader = ContractReader(SCHEMA_TOPIC)
    with pytest.raises(UnknownFingerprintError) as caught:
        reader.decode_value(encoded)
    hex_fingerprint = format_fingerprint(schemas.value_fingerprint)
    assert str(caught.value) == (
        f"schema fingerprint {hex_fingerprint} not found: consume the schema topic "
        "cdc._schemas from the beginning first"
    )
    assert caught.value.fingerprint == hex_fingerprint
    reader.add_schema(schemas.value_schema_json)
    assert reader.decode_value(encoded)["after"] == ROW


def test_bad_marker() -> None:
    _, _, reader = _setup()
    with pytest.raises(BadMarkerError, match="7b 22 instead of the Avro single-object marker"):
        reader.decode_value(b'{"id": 1}')


def test_every_proper_prefix_is_truncated() -> None:
    _, encoder, reader = _setup()
    encoded = encoder.encode_value(_change(Operation.UPDATE, before=ROW, after=ROW))
    for size in range(len(encoded)):
        with pytest.raises(TruncatedRecordError):
            reader.decode_value(encoded[:size])


def test_trailing_bytes_are_malformed() -> None:
    _, encoder, reader = _setup()
    encoded = encoder.encode_value(_change(Operation.INSERT, after=ROW))
    with pytest.raises(MalformedRecordError, match="1 bytes follow"):
        reader.decode_value(encoded + b"\x00")


def test_bad_operation_index_is_malformed() -> None:
    _, encoder, reader = _setup()
    encoded = bytearray(encoder.encode_value(_change(Operation.INSERT, after=ROW)))
    encoded[10] = 0x0A  # enum index 5: one past TRUNCATE
    with pytest.raises(MalformedRecordError, match="does not match its writer schema"):
        reader.decode_value(bytes(encoded))


def test_keys_and_values_are_not_interchangeable() -> None:
    _, encoder, reader = _setup()
    change = _change(Operation.INSERT, after=ROW)
    with pytest.raises(RoleMismatchError, match="is a value record, not a key"):
        reader.decode_key(encoder.encode_value(change))
    with pytest.raises(RoleMismatchError, match="is a key record, not a value"):
        reader.decode_value(encoder.encode_key(change))
    with pytest.raises(RoleMismatchError, match="is a key record, not a value"):
        reader.decode_value(TABLE_KEY)
    with pytest.raises(RoleMismatchError, match="not a change-topic key"):
        reader.decode_key(TABLE_KEY_SCHEMA_MESSAGE.value)


# --- schema topic ---------------------------------------------------------------------


def test_schema_message_layout() -> None:
    schemas = build_table_schemas(ALL_TYPES)
    key_message, value_message = table_schema_messages(schemas)
    assert key_message.key == fingerprint_bytes(schemas.key_fingerprint)
    assert value_message.key == fingerprint_bytes(schemas.value_fingerprint)
    # The key is bytes 2..9 of every record written with the schema.
    encoded = ChangeEncoder(schemas).encode_value(_change(Operation.INSERT, after=ROW))
    assert encoded[2:10] == value_message.key
    assert value_message.value.startswith(header(WRITER_SCHEMA_FINGERPRINT))
    assert read_schema_message(value_message.key, value_message.value) == (
        schemas.value_fingerprint,
        schemas.value_schema_json,
    )
    decoded = ContractReader(SCHEMA_TOPIC).decode(value_message.value)
    assert decoded == {"fingerprint": value_message.key, "schema": schemas.value_schema_json}


def test_table_key_schema_message() -> None:
    fingerprint, schema_json = read_schema_message(
        TABLE_KEY_SCHEMA_MESSAGE.key, TABLE_KEY_SCHEMA_MESSAGE.value
    )
    assert fingerprint == TABLE_KEY_FINGERPRINT
    assert json.loads(schema_json)["name"] == "TableKey"


def test_reader_knows_the_fixed_schemas_and_ignores_tombstones() -> None:
    reader = ContractReader(SCHEMA_TOPIC)
    assert TABLE_KEY_FINGERPRINT in reader
    assert WRITER_SCHEMA_FINGERPRINT in reader
    assert reader.add_schema_message(b"\x00" * 8, None) is None
    assert len(reader) == 2


def test_re_adding_a_schema_is_harmless() -> None:
    schemas, _, reader = _setup()
    count = len(reader)
    for message in table_schema_messages(schemas):
        reader.add_schema_message(message.key, message.value)
    assert len(reader) == count


def _writer_schema_value(fingerprint: bytes, schema_json: str) -> bytes:
    from schemas.envelope import WRITER_SCHEMA_SCHEMA  # noqa: PLC0415

    buffer = io.BytesIO()
    buffer.write(header(WRITER_SCHEMA_FINGERPRINT))
    schemaless_writer(
        buffer,
        parse_schema(WRITER_SCHEMA_SCHEMA),
        {"fingerprint": fingerprint, "schema": schema_json},
    )
    return buffer.getvalue()


def test_inconsistent_schema_messages_are_refused() -> None:
    schemas = build_table_schemas(ALL_TYPES)
    good = schema_message(schemas.value_schema_json)
    other = fingerprint_bytes(schemas.key_fingerprint)
    cases = [
        (other, good.value, "must agree"),
        (good.key, _writer_schema_value(other, schemas.value_schema_json), "must agree"),
        (good.key[:7], good.value, "key of 7 bytes"),
        (good.key, good.value[:-3], "cannot be decoded"),
        (good.key, b"\xc3\x01" + bytes(8), "expected pgdelta.contract.WriterSchema"),
        (good.key, schemas.value_schema_json.encode(), "cannot be decoded"),
        (good.key, _writer_schema_value(good.key, "{not json"), "not valid Avro JSON"),
        (good.key, _writer_schema_value(good.key, '{"type": "nope"}'), "not valid Avro JSON"),
    ]
    reader = ContractReader(SCHEMA_TOPIC)
    for key, value, message in cases:
        with pytest.raises(SchemaMessageError, match=message):
            reader.add_schema_message(key, value)
    assert len(reader) == 2


def test_schemas_that_are_not_records_are_refused() -> None:
    with pytest.raises(SchemaMessageError, match="is not a record"):
        ContractReader(SCHEMA_TOPIC).add_schema('"long"')
    with pytest.raises(SchemaMessageError, match="not a valid Avro schema"):
        ContractReader(SCHEMA_TOPIC).add_schema("[")


def test_ambiguous_temporal_unions_are_refused() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {
                "name": "when",
                "type": ["null", {"type": "int", "logicalType": "date"}, "string"],
            }
        ],
    }
    with pytest.raises(SchemaMessageError, match="cannot tell its branches apart"):
        ContractReader(SCHEMA_TOPIC).add_schema(json.dumps(schema))


def test_fingerprint_peek() -> None:
    schemas, encoder, reader = _setup()
    encoded = encoder.encode_value(_change(Operation.INSERT, after=ROW))
    assert reader.fingerprint(encoded) == schemas.value_fingerprint
    assert schema_fingerprint(json.loads(reader.schema_json(Fingerprint(schemas.key_fingerprint))))
