"""The compiled change decoder (``capture_native.ChangeDecoder``) against fastavro's
(:func:`apply.lake.driver_plan._decode`): :func:`~apply.lake.driver_plan.decode_records`
gives the same :class:`~apply.lake.driver_plan.DecodedRecords` both ways, value for value
and type for type, for every column type, edge values, both framings, a header naming
another writer, and bodies cut at every byte or flipped at random. The coverage-guided
search of ``tests/fuzz/fuzz_change_decoder.py`` runs last, bounded."""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import StringType

from apply.lake import driver_plan
from apply.lake.delta_schema import ColumnSpec, ValueSchema, parse_value_schema
from apply.lake.driver_plan import CollectedRecord, DecodedRecords, decode_records
from apply.lake.tables import TableId
from schemas import column_type as ct
from schemas import registry_framing
from schemas.change_record import (
    ChangeEncoder,
    Column,
    TableDescription,
    TableSchemas,
    build_table_schemas,
)
from schemas.column_type import ColumnType
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.registry_framing import SchemaId
from schemas.single_object import HEADER_SIZE
from tests.plugins.column_types import EVERY_TYPE, every_kind_of_change
from tests.plugins.fuzzing import run_fuzzer

if driver_plan._COMPILED is None:
    # In CI the bootstrap builds it (native/build.sh), so its absence is a failure there.
    if os.environ.get("CI") == "true":
        pytest.fail("capture_native is not built: run `make native`", pytrace=False)
    pytest.skip("capture_native is not built: run `make native`", allow_module_level=True)

TABLE = TableId("public", "every")
SCHEMAS = build_table_schemas(TableDescription("public", "every", EVERY_TYPE))
VALUE_SCHEMA = parse_value_schema(TABLE, SCHEMAS.value_fingerprint, SCHEMAS.value_schema_json)
REGISTRY_ID = SchemaId(4242)
REGISTRY_SCHEMA = parse_value_schema(
    TABLE, registry_framing.writer_key(REGISTRY_ID), SCHEMAS.value_schema_json
)
NAMES = SCHEMAS.field_names
# A column the writer schema lacks (dropped at the source), and the columns out of order:
# the projection is by name.
PROJECTED = (
    *reversed(VALUE_SCHEMA.columns),
    ColumnSpec("dropped", StringType()),
)


def _values(schemas: TableSchemas = SCHEMAS) -> list[bytes]:
    encoder = ChangeEncoder(schemas)
    return [encoder.encode_value(change) for change in every_kind_of_change()]


def _registry(value: bytes) -> bytes:
    return registry_framing.header(REGISTRY_ID) + value[HEADER_SIZE:]


def _exact(value: Any) -> Any:
    """``value`` in a form equal only to the same value of the same type: floats by
    their bits (NaN, -0.0), decimals by digits and exponent, bools apart from ints."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, Decimal):
        return ("Decimal", value.as_tuple())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_exact(item) for item in value))
    return (type(value).__name__, value)


def _exact_records(decoded: DecodedRecords) -> Any:
    changes = [
        (c.partition, c.offset, c.op, c.position, c.commit_ts, _exact(c.unchanged), _exact(c.row))
        for c in decoded.changes
    ]
    return changes, dict(decoded.malformed)


def _both(
    values: Sequence[bytes], schema: ValueSchema = VALUE_SCHEMA, columns: Sequence[Any] = PROJECTED
) -> tuple[Any, Any]:
    """The compiled decode of ``values`` and fastavro's, each as :func:`_exact_records`."""
    records = [CollectedRecord(3, offset, value) for offset, value in enumerate(values)]
    compiled = decode_records(records, schema, columns)
    saved = driver_plan._COMPILED
    driver_plan._COMPILED = None
    driver_plan._compiled_decoder.cache_clear()
    try:
        reference = decode_records(records, schema, columns)
    finally:
        driver_plan._COMPILED = saved
        driver_plan._compiled_decoder.cache_clear()
    return _exact_records(compiled), _exact_records(reference)


def test_the_compiled_decoder_is_the_one_in_use() -> None:
    names = (*NAMES, None)
    decoder = driver_plan._compiled_decoder(VALUE_SCHEMA.decode_json, b"\x01" * 8, names)
    assert isinstance(decoder, driver_plan._COMPILED)  # type: ignore[arg-type]


def test_every_type_and_image_decodes_as_fastavro_decodes() -> None:
    compiled, reference = _both(_values())

    assert compiled == reference
    changes, malformed = compiled
    assert len(changes) == len(every_kind_of_change())
    assert not malformed
    # Not vacuous: the values are there, physical, in the projection's order.
    first_row = changes[0][6][1]
    assert first_row[-1] == ("NoneType", None)
    assert first_row[-2] == ("int", 7)
    assert first_row[0] == ("list", (("list", (("int", 1), ("NoneType", None))), ("list", ())))


def test_the_registry_framing_decodes_as_fastavro_decodes() -> None:
    values = [_registry(value) for value in _values()]

    compiled, reference = _both(values, REGISTRY_SCHEMA)

    assert compiled == reference
    assert len(compiled[0]) == len(values)


def test_a_header_naming_another_writer_is_malformed_both_ways() -> None:
    other = build_table_schemas(
        TableDescription("public", "every", (*EVERY_TYPE, Column("extra", ct.INT)))
    )
    values = _values()
    foreign = [
        _values(other)[0],  # another fingerprint
        registry_framing.header(SchemaId(4243)) + values[0][HEADER_SIZE:],
        _registry(values[0]),  # a registry id where a fingerprint is expected
        b"",
        b"\xc3\x01",
        b"\x00\x00\x00",
        b"\x01" + values[0],
    ]

    compiled, reference = _both([*foreign, values[0]])

    assert compiled == reference
    assert compiled[1] == {3: (len(foreign), 0)}


def test_a_body_cut_at_every_byte_decodes_as_fastavro_decodes() -> None:
    cut = [value[:end] for value in _values() for end in range(len(value))]

    compiled, reference = _both(cut)

    assert compiled == reference
    # Bytes after a datum are not refused (fastavro's schemaless reader ignores them),
    # so only the cuts inside the datum are malformed.
    assert compiled[1][3][0] > len(cut) // 2


def test_bytes_after_the_datum_are_ignored_both_ways() -> None:
    values = [value + b"\xff\x00trailing" for value in _values()]

    compiled, reference = _both(values)

    assert compiled == reference
    assert compiled == _both(_values())[0]


def _overlong_varint(value: bytes) -> bool:
    """Whether ``value`` has 10 bytes in a row with the high bit set: where the compiled
    decoder refuses a varint longer than 10 bytes, which fastavro reads."""
    run = 0
    for byte in value:
        run = run + 1 if byte & 0x80 else 0
        if run >= 10:
            return True
    return False


def _mutations(value: bytes, rng: random.Random, count: int) -> Iterator[bytes]:
    for _ in range(count):
        data = bytearray(value)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(HEADER_SIZE, len(data))
            kind = rng.randrange(4)
            if kind == 0:
                data[at] ^= 1 << rng.randrange(8)
            elif kind == 1:
                data[at] = rng.choice(
                    (0x00, 0x01, 0x02, 0x03, 0x7F, 0x80, 0xFF, rng.randrange(256))
                )
            elif kind == 2:
                data.insert(at, rng.randrange(256))
            elif len(data) > HEADER_SIZE + 1:
                del data[at]
        yield bytes(data)


def test_flipped_bytes_decode_as_fastavro_decodes() -> None:
    rng = random.Random(20_260_101)
    mutated = [m for value in _values() for m in _mutations(value, rng, 150)]

    compiled, reference = _both(mutated)

    if compiled != reference:
        # Record by record: the one allowed difference is a varint over 10 bytes.
        for value in mutated:
            one, other = _both([value])
            assert one == other or (not one[0] and other[0] and _overlong_varint(value)), value
    # Not vacuous: some decode, some do not.
    assert compiled[0]
    assert compiled[1]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x80" * 11 + b"\x01", "a varint of 12 bytes"),
        (b"\x0a", "an op symbol past the end"),
        (b"\x02\x02\x02\x02\x02\x02\x00\x06", "a union branch past the end"),
    ],
)
def test_bodies_the_compiled_decoder_refuses(body: bytes, reason: str) -> None:
    header = _values()[0][:HEADER_SIZE]

    compiled, _ = _both([header + body])

    assert compiled == ([], {3: (1, 0)}), reason


def test_a_varint_over_ten_bytes_is_the_one_difference() -> None:
    value = _values()[0]
    start = HEADER_SIZE + 1  # commit_lsn, after the op
    end = next(at for at in range(start, len(value)) if value[at] < 0x80) + 1
    # 11 bytes: fastavro reads on (its C shifts the last by 70 bits, undefined behaviour:
    # the count modulo 64 on x86-64 and arm64); Java's decoder and the compiled one refuse
    # it.
    overlong = value[:start] + b"\x80" * 10 + b"\x01" + value[end:]

    compiled, reference = _both([overlong])

    assert compiled == ([], {3: (1, 0)})
    assert len(reference[0]) == 1


def test_a_negative_union_index_is_read_as_fastavro_reads_it() -> None:
    value = _values()[0]
    # The INSERT's before (after the envelope and before_key_only) as the union index -2:
    # null.
    at = value.index(b"\x00\x00\x02", HEADER_SIZE + 1)
    flipped = value[: at + 1] + b"\x03" + value[at + 2 :]

    compiled, reference = _both([flipped])

    assert compiled == reference
    assert len(compiled[0]) == 1


def test_a_schema_the_compiled_decoder_does_not_read_stays_with_fastavro() -> None:
    recursive = (
        '{"type":"record","name":"Change","fields":[{"name":"next","type":["null","Change"]}]}'
    )
    assert driver_plan._compiled_decoder(recursive, bytes(8), ("a",)) is None
    with pytest.raises(ValueError, match="8 bytes"):
        driver_plan._COMPILED(VALUE_SCHEMA.decode_json, b"\x01", [])  # type: ignore[misc]


def test_decimals_rounded_to_their_precision_decode_as_fastavro_decodes() -> None:
    columns = (
        Column("id", ct.LONG, nullable=False, key=True),
        Column("d", ColumnType.decimal(3, 1)),
    )
    schemas = build_table_schemas(TableDescription("public", "every", columns))
    schema = parse_value_schema(TABLE, schemas.value_fingerprint, schemas.value_schema_json)
    head = ChangeEncoder(schemas).value_head(
        op=Operation.INSERT, commit_lsn=Lsn(16), change_lsn=Lsn(16), xid=1, commit_ts=2
    )
    values = []
    # Unscaled values wider than the precision (the writer refuses them, a foreign one
    # might not): fastavro rounds them in its context, and so does the compiled decoder.
    for unscaled in (0, -1, 999, 12_345, -(2**100), 2**127 - 1, 10**40 + 5):
        big = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
        # ordinal 0, before_key_only false, no before, after: id 1, d, no unchanged columns.
        after = b"\x02\x02" + b"\x02" + _zigzag(len(big)) + big
        values.append(head + b"\x00\x00\x00\x02" + after + b"\x00")
    compiled, reference = _both(values, schema, schema.columns)

    assert compiled == reference
    assert len(compiled[0]) == len(values)


def _zigzag(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded >= 0x80:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def test_the_change_decoder_fuzzer_finds_nothing(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    run_fuzzer("fuzz_change_decoder", corpus, 5_000)
