"""The Schema Registry wire format: header, bounds-checked split, framing per record,
writer keys, and an encoder writing registry headers around the same bodies."""

from __future__ import annotations

import pytest

from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    RecordFraming,
    TableDescription,
    build_table_schemas,
)
from schemas.column_type import LONG, STRING
from schemas.errors import DecodeError, TruncatedRecordError
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.registry_framing import (
    HEADER_SIZE,
    MAX_SCHEMA_ID,
    Framing,
    SchemaId,
    UnknownFramingError,
    framing_of,
    header,
    registry_id_of,
    split,
    writer_key,
)
from schemas.single_object import HEADER_SIZE as SO_HEADER
from schemas.single_object import Fingerprint, format_fingerprint


def test_header_is_magic_zero_and_big_endian_id() -> None:
    assert header(SchemaId(1)) == bytes.fromhex("00 00000001")
    assert header(SchemaId(0x01020304)) == bytes.fromhex("00 01020304")
    assert len(header(SchemaId(MAX_SCHEMA_ID))) == HEADER_SIZE


@pytest.mark.parametrize("schema_id", [0, -1, MAX_SCHEMA_ID + 1])
def test_header_refuses_ids_no_client_reads_back(schema_id: int) -> None:
    with pytest.raises(ValueError, match="positive 32-bit"):
        header(SchemaId(schema_id))


def test_split_returns_the_id_and_the_body() -> None:
    schema_id, body = split(bytes.fromhex("00 0000002a 02 04"))
    assert schema_id == 42
    assert bytes(body) == b"\x02\x04"
    schema_id, body = split(bytes.fromhex("00 0000002a"))
    assert (schema_id, bytes(body)) == (42, b"")


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x00\x00\x01"])
def test_split_of_a_short_record_is_truncated(data: bytes) -> None:
    with pytest.raises(TruncatedRecordError, match="registry header"):
        split(data)


@pytest.mark.parametrize("data", [b"\xc3\x01" + bytes(8), b"\x01\x00\x00\x00\x01", b"{"])
def test_split_refuses_another_magic_byte(data: bytes) -> None:
    with pytest.raises(UnknownFramingError, match="magic byte 00"):
        split(data)


def test_framing_is_decided_by_the_first_byte() -> None:
    assert framing_of(b"\xc3\x01" + bytes(8)) is Framing.SINGLE_OBJECT
    assert framing_of(b"\x00\x00\x00\x00\x01") is Framing.REGISTRY
    # One byte is enough to decide; the header's own split checks the rest.
    assert framing_of(b"\xc3") is Framing.SINGLE_OBJECT
    assert framing_of(memoryview(b"\x00")) is Framing.REGISTRY


def test_framing_of_nothing_is_truncated() -> None:
    with pytest.raises(TruncatedRecordError):
        framing_of(b"")


@pytest.mark.parametrize("data", [b"{", b"\x01", b"\xc2\x01", b"\xff\xff"])
def test_unknown_first_byte_is_a_typed_error_naming_both_framings(data: bytes) -> None:
    with pytest.raises(UnknownFramingError) as caught:
        framing_of(data)
    assert isinstance(caught.value, DecodeError)
    assert "c3 01" in str(caught.value)
    assert caught.value.found == data[:2]


def test_writer_key_is_four_zero_bytes_then_the_id() -> None:
    key = writer_key(SchemaId(7))
    assert format_fingerprint(key) == "0000000000000007"
    assert format_fingerprint(writer_key(SchemaId(0x01020304))) == "0000000001020304"
    assert registry_id_of(key) == 7


def test_a_fingerprint_is_not_taken_for_a_registry_id() -> None:
    # "int" from the Avro specification's vectors: 8f5c393f1ad57572.
    assert registry_id_of(Fingerprint(8247732601305521295)) is None
    assert registry_id_of(Fingerprint(0)) is None  # id 0 is never handed out


def test_an_encoder_with_registry_headers_writes_the_same_bodies() -> None:
    schemas = build_table_schemas(
        TableDescription(
            "public",
            "orders",
            (Column("id", LONG, nullable=False, key=True), Column("note", STRING)),
        )
    )
    framing = RecordFraming(
        key=header(SchemaId(3)), value=header(SchemaId(4)), table_key=header(SchemaId(5))
    )
    single = ChangeEncoder(schemas)
    registry = ChangeEncoder(schemas, framing=framing)
    fast = ChangeEncoder(schemas, physical_values=True, framing=framing)
    change = Change(
        op=Operation.INSERT,
        commit_lsn=Lsn(100),
        change_lsn=Lsn(90),
        xid=7,
        commit_ts=1_700_000_000_000_000,
        ordinal=0,
        after={"id": 42, "note": "x"},
    )
    value = single.encode_value(change)
    key = single.encode_key(change)
    for encoder in (registry, fast):
        assert encoder.encode_value(change) == header(SchemaId(4)) + value[SO_HEADER:]
        assert encoder.encode_key(change) == header(SchemaId(3)) + key[SO_HEADER:]
    truncate = Change(
        op=Operation.TRUNCATE,
        commit_lsn=Lsn(100),
        change_lsn=Lsn(90),
        xid=7,
        commit_ts=1_700_000_000_000_000,
        ordinal=1,
    )
    assert registry.encode_key(truncate) == header(SchemaId(5))
