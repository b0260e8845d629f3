"""Single-object framing, Parsing Canonical Form and CRC-64-AVRO against the Avro spec."""

from __future__ import annotations

import io
import json

import pytest
from fastavro import parse_schema, schemaless_writer

from schemas.errors import BadMarkerError, MalformedRecordError, TruncatedRecordError
from schemas.single_object import (
    HEADER_SIZE,
    MARKER,
    Fingerprint,
    canonical_form,
    fingerprint64,
    format_fingerprint,
    header,
    read_body,
    schema_fingerprint,
    split,
)

# apache/avro share/test/data/schema-tests.txt: (input, canonical form, fingerprint or None).
SPEC_VECTORS = [
    ('"null"', '"null"', 7195948357588979594),
    ('{"type":"null"}', '"null"', None),
    ('"boolean"', '"boolean"', -6970731678124411036),
    ('"int"', '"int"', 8247732601305521295),
    ('{"type":"int"}', '"int"', None),
    ('"long"', '"long"', -3434872931120570953),
    ('"float"', '"float"', 5583340709985441680),
    ('"double"', '"double"', -8181574048448539266),
    ('"bytes"', '"bytes"', 5746618253357095269),
    ('"string"', '"string"', -8142146995180207161),
    ("[  ]", "[]", -1241056759729112623),
    ('[ "int"  ]', '["int"]', -5232228896498058493),
    ('[ "int" , {"type":"boolean"} ]', '["int","boolean"]', 5392556393470105090),
    (
        '{"fields":[], "type":"record", "name":"foo"}',
        '{"name":"foo","type":"record","fields":[]}',
        -4824392279771201922,
    ),
    (
        '{"fields":[], "type":"record", "name":"foo", "namespace":"x.y"}',
        '{"name":"x.y.foo","type":"record","fields":[]}',
        5916914534497305771,
    ),
    (
        '{"fields":[], "type":"record", "name":"a.b.foo", "namespace":"x.y"}',
        '{"name":"a.b.foo","type":"record","fields":[]}',
        -4616218487480524110,
    ),
    (
        '{"fields":[], "type":"record", "name":"foo", "doc":"foo", "aliases":["foo","bar"]}',
        '{"name":"foo","type":"record","fields":[]}',
        -4824392279771201922,
    ),
    (
        '{"fields":[{"type":{"type":"boolean"}, "name":"f1"}], "type":"record", "name":"foo"}',
        '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}',
        7843277075252814651,
    ),
    # Test 026, with the default `true` where the spec file has the string "true", which
    # fastavro rightly refuses for a boolean field.
    (
        '{ "fields":[{"type":"boolean", "aliases":[], "name":"f1", "default":true},'
        '{"order":"descending","name":"f2","doc":"Hello","type":"int"}],'
        '"type":"record", "name":"foo"}',
        '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"},'
        '{"name":"f2","type":"int"}]}',
        -4860222112080293046,
    ),
    (
        '{"type":"enum", "name":"foo", "symbols":["A1"]}',
        '{"name":"foo","type":"enum","symbols":["A1"]}',
        -6342190197741309591,
    ),
    (
        '{"namespace":"x.y.z", "type":"enum", "name":"foo", "doc":"foo bar", '
        '"symbols":["A1", "A2"]}',
        '{"name":"x.y.z.foo","type":"enum","symbols":["A1","A2"]}',
        -4448647247586288245,
    ),
    (
        '{"name":"foo","type":"fixed","size":15}',
        '{"name":"foo","type":"fixed","size":15}',
        1756455273707447556,
    ),
    (
        '{"namespace":"x.y.z", "type":"fixed", "name":"foo", "doc":"foo bar", "size":32}',
        '{"name":"x.y.z.foo","type":"fixed","size":32}',
        -3064184465700546786,
    ),
    ('{ "items":{"type":"null"}, "type":"array"}', '{"type":"array","items":"null"}', None),
    ('{ "values":"string", "type":"map"}', '{"type":"map","values":"string"}', None),
    (
        '{"name":"PigValue","type":"record",'
        '"fields":[{"name":"value", "type":["null", "int", "long", "PigValue"]}]}',
        '{"name":"PigValue","type":"record","fields":[{"name":"value",'
        '"type":["null","int","long","PigValue"]}]}',
        -1759257747318642341,
    ),
]


@pytest.mark.parametrize(("text", "canonical", "expected"), SPEC_VECTORS)
def test_canonical_form_and_fingerprint_match_the_spec_vectors(
    text: str, canonical: str, expected: int | None
) -> None:
    assert canonical_form(json.loads(text)) == canonical
    if expected is not None:
        assert fingerprint64(canonical.encode()) == expected % 2**64
        assert schema_fingerprint(json.loads(text)) == expected % 2**64


def test_int_header_is_the_one_in_the_spec() -> None:
    fingerprint = schema_fingerprint("int")
    assert format_fingerprint(fingerprint) == "8f5c393f1ad57572"
    assert header(fingerprint) == bytes.fromhex("c3018f5c393f1ad57572")
    assert len(header(fingerprint)) == HEADER_SIZE


def test_canonical_form_drops_logical_types() -> None:
    # The reason schemas.change_record puts a content digest into every namespace.
    assert canonical_form({"type": "long", "logicalType": "timestamp-micros"}) == '"long"'
    assert canonical_form(
        {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
    ) == canonical_form({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 4})


def test_split_returns_fingerprint_and_body() -> None:
    fingerprint = Fingerprint(0x0123456789ABCDEF)
    fp, body = split(header(fingerprint) + b"body")
    assert fp == fingerprint
    assert bytes(body) == b"body"


def test_split_accepts_an_empty_body() -> None:
    fp, body = split(header(Fingerprint(7)))
    assert fp == 7
    assert bytes(body) == b""


@pytest.mark.parametrize("size", range(HEADER_SIZE))
def test_split_rejects_a_short_header(size: int) -> None:
    data = header(Fingerprint(2**64 - 1))[:size]
    with pytest.raises(TruncatedRecordError, match=f"record of {size} bytes"):
        split(data)


@pytest.mark.parametrize(
    "data",
    [b"\x00", b"\xc3\x00" + bytes(8), b"\x01\xc3" + bytes(8), b'{"id": 1}', b"\x02\x06abc"],
)
def test_split_rejects_a_wrong_marker(data: bytes) -> None:
    with pytest.raises(BadMarkerError, match="c3 01") as caught:
        split(data)
    assert caught.value.found == data[: len(MARKER)]


SCHEMA = parse_schema(
    {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "s", "type": "string"},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
        ],
    }
)


def _body(record: dict[str, object]) -> bytes:
    buffer = io.BytesIO()
    schemaless_writer(buffer, SCHEMA, record)
    return buffer.getvalue()


def test_read_body_decodes_exactly_one_record() -> None:
    body = _body({"s": "héllo", "e": "B"})
    assert read_body(SCHEMA, memoryview(body), len(body)) == {"s": "héllo", "e": "B"}


def test_read_body_rejects_every_short_body() -> None:
    body = _body({"s": "héllo", "e": "B"})
    for size in range(len(body)):
        with pytest.raises(TruncatedRecordError, match="body"):
            read_body(SCHEMA, memoryview(body[:size]), size)


def test_read_body_rejects_trailing_bytes() -> None:
    body = _body({"s": "x", "e": "A"}) + b"\x00"
    with pytest.raises(MalformedRecordError, match="1 bytes follow"):
        read_body(SCHEMA, memoryview(body), len(body))


@pytest.mark.parametrize(
    "body",
    [
        b"\x02\xff\x00",  # a one-byte string that is not UTF-8
        b"\x02x\x08",  # enum index 4 of 2 symbols
    ],
)
def test_read_body_rejects_bad_data(body: bytes) -> None:
    with pytest.raises(MalformedRecordError, match="does not match its writer schema"):
        read_body(SCHEMA, memoryview(body), len(body))
