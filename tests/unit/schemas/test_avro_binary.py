"""The encoder's fast path writes exactly what fastavro writes, and refuses what it refuses.

Every value goes through the same :class:`ChangeEncoder` twice: once in a ``dict`` (the
fast path of :mod:`schemas.avro_binary`) and once in a read-only mapping, which the fast
path never takes, so fastavro encodes it. Both must give the same bytes, or the same
:class:`ChangeEncodingError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from types import MappingProxyType
from typing import Any

import pytest

from schemas import avro_binary
from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from schemas.column_type import ColumnType
from schemas.errors import ChangeEncodingError
from schemas.lsn import Lsn
from schemas.operation import Operation

INT_EDGES: list[Any] = [0, 1, -1, 63, 64, -64, -65, 8191, 8192, -8193, 2**31 - 1, -(2**31)]
LONG_EDGES: list[Any] = [*INT_EDGES, 2**31, 2**40, -(2**40), 2**63 - 1, -(2**63)]
NOT_INTS: list[Any] = [True, False, 1.0, "1", b"1", [1]]
FLOATS: list[Any] = [0.0, -0.0, 1.5, -2.25, 3.4e38, 1e-45, 1e-46, math.inf, -math.inf, math.nan]

VALUES: dict[str, tuple[ColumnType, list[Any]]] = {
    "boolean": (ct.BOOLEAN, [True, False, 0, 1, "t"]),
    "int": (ct.INT, [*INT_EDGES, 2**31, -(2**31) - 1, 2**70, *NOT_INTS]),
    "long": (ct.LONG, [*LONG_EDGES, 2**63, -(2**63) - 1, 2**70, *NOT_INTS]),
    "float": (ct.FLOAT, [*FLOATS, 1e39, -1e39, 1e308, 1, "1.5"]),
    "double": (ct.DOUBLE, [*FLOATS, 1e308, 5e-324, 3, "1.5"]),
    "bytes": (ct.BYTES, [b"", b"\x00\xff", b"x" * 200, bytearray(b"ab"), "ab", 5]),
    "string": (ct.STRING, ["", "a", "é", "日本語", "a" * 300, "\ud800", b"ab", 5]),
    "decimal": (
        ColumnType.decimal(10, 2),
        [
            b"\x00",
            (12345).to_bytes(2, "big", signed=True),
            (-12345).to_bytes(2, "big", signed=True),
            (10**10 - 1).to_bytes(5, "big", signed=True),
            (10**10).to_bytes(5, "big", signed=True),
            (-(10**10)).to_bytes(5, "big", signed=True),
            Decimal("1.50"),
            "1.50",
        ],
    ),
    "date": (ct.DATE, [0, 19_000, -719_162, ct.DATE_POSITIVE_INFINITY, 2**31, "2024-01-01"]),
    "time": (ct.TIME_MICROS, [0, ct.MAX_TIME_MICROS, 1.0]),
    "timestamp": (
        ct.TIMESTAMP_MICROS,
        [0, 1_700_000_000_000_000, ct.TIMESTAMP_POSITIVE_INFINITY, ct.TIMESTAMP_NEGATIVE_INFINITY],
    ),
    "local timestamp": (ct.LOCAL_TIMESTAMP_MICROS, [0, -1, 2**63]),
    "uuid": (ct.UUID, ["123e4567-e89b-12d3-a456-426614174000", 5]),
    "int[]": (
        ColumnType.array(ct.INT),
        [[], [1, None, -5], [None], [2**31], [True], [1.0], (1, 2), [[1]], "1"],
    ),
    "text[][]": (
        ColumnType.array(ColumnType.array(ct.STRING)),
        [[["a", None], []], [[]], [["a"], "b"], [[5]]],
    ),
    "float8[]": (ColumnType.array(ct.DOUBLE), [[1.5, None, math.nan], [1]]),
    "numeric(4,1)[]": (
        ColumnType.array(ColumnType.decimal(4, 1)),
        [[b"\x01", None], [(10**4).to_bytes(3, "big", signed=True)]],
    ),
}
CASES = [
    pytest.param(column_type, value, id=f"{name}-{i}")
    for name, (column_type, values) in VALUES.items()
    for i, value in enumerate(values)
]


def _encoder(column_type: ColumnType, *, key_nullable: bool = True) -> ChangeEncoder:
    description = TableDescription(
        "public",
        "t",
        (
            Column("id", ct.LONG, nullable=key_nullable, key=True),
            Column("c", column_type),
        ),
    )
    return ChangeEncoder(build_table_schemas(description), physical_values=True)


def _outcome(encode: Callable[[], bytes]) -> bytes | str:
    try:
        return encode()
    except ChangeEncodingError as exc:
        return f"error: {exc}"


def _fast_and_fastavro(encoder: ChangeEncoder, change: Change) -> tuple[bytes | str, bytes | str]:
    def read_only(row: Any) -> Any:
        return None if row is None else MappingProxyType(row)

    slow = Change(
        op=change.op,
        commit_lsn=change.commit_lsn,
        change_lsn=change.change_lsn,
        xid=change.xid,
        commit_ts=change.commit_ts,
        ordinal=change.ordinal,
        before=read_only(change.before),
        after=read_only(change.after),
        unchanged_columns=change.unchanged_columns,
        before_key_only=change.before_key_only,
    )
    return _outcome(lambda: encoder.encode_value(change)), _outcome(
        lambda: encoder.encode_value(slow)
    )


def _change(op: Operation = Operation.UPDATE, **fields: Any) -> Change:
    base: dict[str, Any] = {
        "op": op,
        "commit_lsn": Lsn(0x1_6B37_4D84),
        "change_lsn": Lsn(0x1_6B37_4E00),
        "xid": 123_456,
        "commit_ts": 1_700_000_000_123_456,
        "ordinal": 7,
    }
    return Change(**{**base, **fields})


@pytest.mark.parametrize(("column_type", "value"), CASES)
def test_a_column_value_is_written_as_fastavro_writes_it(column_type, value):
    encoder = _encoder(column_type)
    fast, slow = _fast_and_fastavro(encoder, _change(after={"id": 1, "c": value}))
    assert fast == slow


@pytest.mark.parametrize(("column_type", "value"), CASES)
def test_a_key_value_is_written_as_fastavro_writes_it(column_type, value):
    description = TableDescription("public", "t", (Column("k", column_type, key=True),))
    encoder = ChangeEncoder(build_table_schemas(description), physical_values=True)
    fast = _outcome(lambda: encoder.encode_row_key({"k": value}))
    slow = _outcome(lambda: encoder.encode_row_key(MappingProxyType({"k": value})))
    assert fast == slow


@pytest.mark.parametrize("value", [1, None, 2**63, "1"])
def test_a_non_nullable_key_is_written_as_fastavro_writes_it(value):
    encoder = _encoder(ct.STRING, key_nullable=False)
    fast = _outcome(lambda: encoder.encode_row_key({"id": value}))
    slow = _outcome(lambda: encoder.encode_row_key(MappingProxyType({"id": value})))
    assert fast == slow


@pytest.mark.parametrize(
    "row", [{"a": 1, "b": "x"}, {"a": None, "b": "x"}, {"a": 1}, {"b": "x"}, {"a": 1, "b": 2}]
)
def test_a_composite_key_is_written_as_fastavro_writes_it(row):
    description = TableDescription(
        "public",
        "t",
        (
            Column("a", ct.LONG, key=True),
            Column("b", ct.STRING, nullable=False, key=True),
            Column("c", ct.DOUBLE),
        ),
    )
    encoder = ChangeEncoder(build_table_schemas(description), physical_values=True)
    fast = _outcome(lambda: encoder.encode_row_key(row))
    slow = _outcome(lambda: encoder.encode_row_key(MappingProxyType(row)))
    assert fast == slow


@pytest.mark.parametrize(
    "change",
    [
        _change(Operation.INSERT, after={"id": 1, "c": "x"}),
        _change(Operation.READ, after={"id": 1, "c": None}, ordinal=0),
        _change(Operation.DELETE, before={"id": 1, "c": None}, before_key_only=True),
        _change(Operation.DELETE, before={"id": -1, "c": "gone"}),
        _change(Operation.UPDATE, before={"id": 1, "c": "a"}, after={"id": 1, "c": "b"}),
        _change(Operation.UPDATE, after={"id": 1, "c": None}, unchanged_columns=("c",)),
        _change(Operation.TRUNCATE),
        _change(Operation.INSERT, after={"id": 1}),
        _change(Operation.INSERT, after={"id": 1, "c": "x", "extra": 1}),
        _change(Operation.INSERT, after={"id": 1, "d": "x"}),
        _change(Operation.UPDATE, before={"id": 1, "c": "a"}, after={"id": 2, "c": "a"}),
        _change(Operation.UPDATE, after={"id": 1, "c": "b"}, unchanged_columns=("c",)),
        _change(Operation.UPDATE, after={"id": 1, "c": None}, unchanged_columns=("nope",)),
        _change(Operation.INSERT, after={"id": 1, "c": "x"}, commit_lsn=Lsn(0)),
        _change(Operation.INSERT, after={"id": 1, "c": "x"}, xid=2**63),
        _change(Operation.INSERT, after={"id": 1, "c": "x"}, ordinal=True),
        _change(Operation.INSERT, after={"id": 1, "c": "x"}, commit_ts=-1),
    ],
)
def test_every_envelope_field_is_written_as_fastavro_writes_it(change):
    fast, slow = _fast_and_fastavro(_encoder(ct.STRING), change)
    assert fast == slow


def test_records_of_one_transaction_share_the_encoded_transaction_fields():
    encoder = _encoder(ct.STRING)
    first = _change(Operation.INSERT, after={"id": 1, "c": "x"})
    again = _change(Operation.INSERT, after={"id": 1, "c": "x"}, commit_ts=1)
    assert _fast_and_fastavro(encoder, first) == (encoder.encode_value(first),) * 2
    fast, slow = _fast_and_fastavro(encoder, again)
    assert fast == slow != encoder.encode_value(first)


def test_varints_match_the_specification():
    # https://avro.apache.org/docs/1.12.0/specification/#binary-encoding
    assert [avro_binary.long_(n).hex() for n in (0, -1, 1, -2, 2, -64, 64)] == [
        "00",
        "01",
        "02",
        "03",
        "04",
        "7f",
        "8001",
    ]
    edges = [2**bits + delta for bits in range(1, 64) for delta in (-1, 0, 1)]
    for value in [*edges, 2**64 - 1]:
        encoded = avro_binary.varint(value)
        decoded = sum((byte & 0x7F) << (7 * i) for i, byte in enumerate(encoded))
        assert decoded == value
        assert all(byte & 0x80 for byte in encoded[:-1])
        assert not encoded[-1] & 0x80


def test_values_outside_the_fast_path_are_refused_not_guessed():
    for write, value in (
        (avro_binary.long_, True),
        (avro_binary.int_, 2**31),
        (avro_binary.float_, 1e39),
        (avro_binary.string, "\ud800"),
        (avro_binary.bytes_, bytearray(b"x")),
        (avro_binary.boolean, 1),
    ):
        with pytest.raises(avro_binary.NotEncodable):
            write(value)


@pytest.mark.parametrize(
    ("column_type", "value"),
    [
        (ct.BOOLEAN, True),
        (ct.INT, -5),
        (ct.LONG, 2**40),
        (ct.FLOAT, 1.5),
        (ct.DOUBLE, math.nan),
        (ct.BYTES, b"x"),
        (ct.STRING, "é"),
        (ColumnType.decimal(10, 2), b"\x01"),
        (ct.DATE, 1),
        (ct.TIME_MICROS, 1),
        (ct.TIMESTAMP_MICROS, 1),
        (ct.LOCAL_TIMESTAMP_MICROS, 1),
        (ct.UUID, "123e4567-e89b-12d3-a456-426614174000"),
        (ColumnType.array(ct.INT), [1, None]),
        (ColumnType.array(ColumnType.array(ct.STRING)), [["a"], []]),
    ],
)
def test_physical_values_take_the_fast_path(column_type, value):
    """The comparisons above would also pass if the fast path always gave up."""
    row = avro_binary.RowWriter(("id", "c"), (ct.LONG, column_type))
    assert b"".join(row.write({"id": 1, "c": value}))
    key = avro_binary.KeyWriter(b"", ("c",), (column_type,), (True,))
    assert key.write({"c": value})
