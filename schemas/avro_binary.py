"""Avro binary encoding of change records, specialised per column type: the fast path of
:class:`schemas.change_record.ChangeEncoder`.

fastavro walks the schema for every datum: per field it looks the value up by name,
dispatches on the schema's type and, for a union, finds the branch; for change records
that was the largest part of capture's CPU per change. The writers here are chosen once
per column from its :class:`~schemas.column_type.ColumnType` and write Avro's binary
encoding (https://avro.apache.org/docs/1.12.0/specification/#binary-encoding) directly:
zig-zag varints for ``int``/``long`` (and lengths, block counts, union indexes),
little-endian IEEE 754 for ``float``/``double``, length-prefixed bytes and UTF-8.

Invariants:

- Same bytes as fastavro: for every value a writer accepts, its output equals what
  fastavro writes for that value and schema (the encoder's tests compare both over edge
  values of every kind).
- Narrow on purpose: a writer accepts only the exact Python type of the Avro *physical*
  value (``int``, not ``bool``; ``float``, not ``int``; ``str``; ``bytes``; ``list``)
  within the range its Avro type holds. Anything else raises :class:`NotEncodable`, and
  the caller hands the whole record to fastavro, which either writes it (with the same
  bytes) or raises the error the encoder reports. Error handling therefore stays in one
  place, and a value this module does not know can never be written differently.
- A writer refuses what the encoder's range checks refuse (an ``int`` or ``date``
  beyond 32 bits, a decimal beyond its precision), so a row the fast path writes needs
  no separate check.
- Logical types are not converted: ``date``, ``time``, ``timestamp`` and ``decimal``
  values must already be physical (what the capture's type mapping produces).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from schemas.column_type import AvroKind, ColumnType

Writer = Callable[[Any], bytes]
"""Encodes one non-null value of a column's Avro type; raises :class:`NotEncodable`."""


class NotEncodable(Exception):  # noqa: N818 -- a signal to fall back, not an error
    """The fast path does not write this value; fastavro decides what happens to it."""


_TABLE_BITS = 14
_TABLE_SIZE = 1 << _TABLE_BITS
_TABLE_MASK = _TABLE_SIZE - 1


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Every varint below 2**14 (one or two bytes), and every 14-bit group of a longer one (two
# bytes, both with the continuation bit): a long is at most five table lookups.
_VARINTS = tuple(_varint_bytes(value) for value in range(_TABLE_SIZE))
_GROUPS = tuple(
    bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80)) for value in range(_TABLE_SIZE)
)

_INT_MIN, _INT_LIMIT = -(2**31), 2**31
_LONG_MIN, _LONG_LIMIT = -(2**63), 2**63

NULL = b"\x00"
"""Branch 0 of a ``["null", T]`` union; also an empty array and boolean false."""
NON_NULL = b"\x02"
"""Branch 1 of a ``["null", T]`` union, before the value."""
TRUE = b"\x01"
FALSE = b"\x00"

_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")


def varint(value: int) -> bytes:
    """The varint of an unsigned ``value`` below 2**64 (already zig-zag encoded)."""
    if value < _TABLE_SIZE:
        return _VARINTS[value]
    low = _GROUPS[value & _TABLE_MASK]
    value >>= _TABLE_BITS
    if value < _TABLE_SIZE:
        return low + _VARINTS[value]
    # Up to 42 bits, e.g. every LSN below 2 TiB (zig-zag doubles it): no list needed.
    middle = _GROUPS[value & _TABLE_MASK]
    value >>= _TABLE_BITS
    if value < _TABLE_SIZE:
        return low + middle + _VARINTS[value]
    parts = [low, middle]
    while value >= _TABLE_SIZE:
        parts.append(_GROUPS[value & _TABLE_MASK])
        value >>= _TABLE_BITS
    parts.append(_VARINTS[value])
    return b"".join(parts)


def long_(value: Any) -> bytes:
    """An Avro ``long``."""
    if type(value) is not int or not _LONG_MIN <= value < _LONG_LIMIT:
        raise NotEncodable
    zigzag = (value << 1) ^ (value >> 63)
    # The table lookup is inlined: most values are small, and a call costs more.
    return _VARINTS[zigzag] if zigzag < _TABLE_SIZE else varint(zigzag)


def int_(value: Any) -> bytes:
    """An Avro ``int``: the same zig-zag varint, within 32 bits. The range is what the
    encoder's range check refuses, and what fastavro refuses in an inferred union."""
    if type(value) is not int or not _INT_MIN <= value < _INT_LIMIT:
        raise NotEncodable
    zigzag = (value << 1) ^ (value >> 63)
    return _VARINTS[zigzag] if zigzag < _TABLE_SIZE else varint(zigzag)


def boolean(value: Any) -> bytes:
    if value is True:
        return TRUE
    if value is False:
        return FALSE
    raise NotEncodable


def float_(value: Any) -> bytes:
    if type(value) is not float:
        raise NotEncodable
    try:
        return _FLOAT.pack(value)
    except OverflowError:
        # fastavro's C cast turns it into an infinity; leave that to fastavro.
        raise NotEncodable from None


def double(value: Any) -> bytes:
    if type(value) is not float:
        raise NotEncodable
    return _DOUBLE.pack(value)


def bytes_(value: Any) -> bytes:
    if type(value) is not bytes:
        raise NotEncodable
    return varint(len(value) << 1) + value


def _decimal(precision: int) -> Writer:
    """A ``decimal`` as its unscaled two's-complement bytes, within ``precision`` digits
    (the encoder's range check refuses more, fastavro would write them)."""
    limit = 10**precision

    def write(value: Any) -> bytes:
        if type(value) is not bytes or abs(int.from_bytes(value, "big", signed=True)) >= limit:
            raise NotEncodable
        return varint(len(value) << 1) + value

    return write


def string(value: Any) -> bytes:
    if type(value) is not str:
        raise NotEncodable
    try:
        encoded = value.encode()
    except UnicodeEncodeError:
        raise NotEncodable from None
    return varint(len(encoded) << 1) + encoded


def string_array(values: Sequence[str]) -> bytes:
    """An ``array`` of ``string`` (not nullable items), e.g. ``unchanged_columns``."""
    if not values:
        return NULL
    if type(values) is not tuple and type(values) is not list:
        raise NotEncodable
    return b"".join([long_(len(values)), *map(string, values), NULL])


def _array(items: Writer) -> Writer:
    """An ``array`` of ``["null", T]``: one block with every item, then the empty block."""

    def write(value: Any) -> bytes:
        if type(value) is not list:
            raise NotEncodable
        if not value:
            return NULL
        parts = [varint(len(value) << 1)]
        for item in value:
            parts.append(NULL if item is None else NON_NULL + items(item))
        parts.append(NULL)
        return b"".join(parts)

    return write


_PHYSICAL: dict[AvroKind, Writer] = {
    AvroKind.BOOLEAN: boolean,
    AvroKind.INT: int_,
    AvroKind.LONG: long_,
    AvroKind.FLOAT: float_,
    AvroKind.DOUBLE: double,
    AvroKind.BYTES: bytes_,
    AvroKind.STRING: string,
    AvroKind.DATE: int_,
    AvroKind.TIME_MICROS: long_,
    AvroKind.TIMESTAMP_MICROS: long_,
    AvroKind.LOCAL_TIMESTAMP_MICROS: long_,
    AvroKind.UUID: string,
}


def writer(column_type: ColumnType) -> Writer:
    """The writer of a non-null value of ``column_type`` (physical values only)."""
    if column_type.kind is AvroKind.ARRAY:
        assert column_type.items is not None  # ColumnType guarantees it
        return _array(writer(column_type.items))
    if column_type.kind is AvroKind.DECIMAL:
        assert column_type.precision is not None  # ColumnType guarantees it
        return _decimal(column_type.precision)
    return _PHYSICAL[column_type.kind]


class RowWriter:
    """Writes a row image: a record whose fields are all ``["null", T]``, in order.

    The row must be a ``dict`` with exactly the record's field names (what
    :meth:`schemas.change_record.TableSchemas.row` and the capture's row parsing build);
    any other mapping, a missing or an extra name is :class:`NotEncodable`, so fastavro
    applies its rules for those (missing means null, extra is an error).
    """

    __slots__ = ("_fields", "_size")

    def __init__(self, names: Sequence[str], types: Sequence[ColumnType]) -> None:
        self._fields = tuple(zip(names, map(writer, types), strict=True))
        self._size = len(self._fields)

    def write(self, row: Any) -> list[bytes]:
        """The encoded fields, to be joined by the caller."""
        if type(row) is not dict or len(row) != self._size:
            raise NotEncodable
        parts = []
        try:
            for name, write in self._fields:
                value = row[name]
                parts.append(NULL if value is None else NON_NULL + write(value))
        except KeyError:
            raise NotEncodable from None
        return parts


class KeyWriter:
    """Writes a key record from a row image, after ``prefix`` (the single-object header):
    the key fields only, each a union ``["null", T]`` when nullable, else ``T``; a
    missing name reads as null."""

    __slots__ = ("_fields", "_null", "_prefix", "_single", "_value_prefix")

    def __init__(
        self,
        prefix: bytes,
        names: Sequence[str],
        types: Sequence[ColumnType],
        nullable: Sequence[bool],
    ) -> None:
        self._prefix = prefix
        self._fields = tuple(zip(names, map(writer, types), nullable, strict=True))
        # One nullable key column, the most common key: one concatenation per record.
        self._single = self._fields[0] if len(self._fields) == 1 and nullable[0] else None
        self._null = prefix + NULL
        self._value_prefix = prefix + NON_NULL

    def write(self, row: Any) -> bytes:
        if type(row) is not dict:
            raise NotEncodable
        single = self._single
        if single is not None:
            value = row.get(single[0])
            return self._null if value is None else self._value_prefix + single[1](value)
        parts = [self._prefix]
        for name, write, nullable in self._fields:
            value = row.get(name)
            if nullable:
                parts.append(NULL if value is None else NON_NULL + write(value))
            elif value is None:
                raise NotEncodable
            else:
                parts.append(write(value))
        return b"".join(parts)
