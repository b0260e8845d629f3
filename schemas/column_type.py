"""The Avro types a column can have on the wire: the target of the PostgreSQL type mapping.

The mapping from PostgreSQL types lives in the capture service; this module fixes what
it may map to, how each type is written, and which Python values the encoder accepts for
it (``int`` is always accepted for the temporal types and is the fastest input):

=========================  ======================================  ==========================
kind                       Avro type                               encoder input
=========================  ======================================  ==========================
BOOLEAN                    boolean                                 bool
INT                        int                                     int (32 bit)
LONG                       long                                    int (64 bit)
FLOAT                      float                                   float
DOUBLE                     double                                  float
BYTES                      bytes                                   bytes
STRING                     string                                  str
DECIMAL                    bytes, decimal(precision, scale)        Decimal, or the unscaled
                                                                   value as big-endian two's
                                                                   complement bytes
DATE                       int, date                               date, or days since
                                                                   1970-01-01
TIME_MICROS                long, time-micros                       time, or microseconds
                                                                   after midnight
TIMESTAMP_MICROS           long, timestamp-micros (UTC instant)    aware datetime, or
                                                                   microseconds since epoch
LOCAL_TIMESTAMP_MICROS     long, local-timestamp-micros            naive datetime, or
                                                                   microseconds since epoch
UUID                       string, uuid                            UUID or str
ARRAY                      array of nullable items                 list (elements may be
                                                                   None)
=========================  ======================================  ==========================

Rules that keep every value lossless and readable by Spark's ``from_avro``:

- DECIMAL carries ``1 <= precision <= 38`` and ``0 <= scale <= precision`` (Spark's
  ``DecimalType`` stops at 38 digits, Avro forbids negative scales). Unconstrained
  ``numeric``, wider precisions and negative or oversized scales map to STRING holding
  PostgreSQL's text form (which also carries ``NaN`` and ``Infinity``). A ``NaN`` in a
  column mapped to DECIMAL has no representation: the encoder refuses it with a table
  error and never substitutes a value.
- ``infinity`` and ``-infinity`` of ``date`` and ``timestamp[tz]`` are written as the
  extreme values of the Avro integer: :data:`DATE_POSITIVE_INFINITY` /
  :data:`DATE_NEGATIVE_INFINITY` and :data:`TIMESTAMP_POSITIVE_INFINITY` /
  :data:`TIMESTAMP_NEGATIVE_INFINITY`. PostgreSQL itself stores them as the extreme
  ``int32``/``int64``, no finite value of either type reaches them, and Spark keeps them
  exactly (``unix_date``/``unix_micros`` give them back). Clamping to a finite date is not
  allowed: it would turn a sentinel into a real-looking value. Finite timestamps after
  294247-01-10 (PostgreSQL goes to 294276) do not fit in microseconds since 1970 and are
  a table error.
- TIME_MICROS values run from 0 to 86 400 000 000 inclusive: PostgreSQL's ``24:00:00``
  is written as is. Spark's ``TIME`` type rejects that one value, so a Spark consumer of
  such a column reads it as ``long`` (see docs/wire-contract.md).
- ARRAY items are always nullable (a PostgreSQL array may hold NULL elements); a
  multi-dimensional array is an ARRAY of ARRAY.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

MAX_DECIMAL_PRECISION = 38

DATE_POSITIVE_INFINITY = 2**31 - 1
DATE_NEGATIVE_INFINITY = -(2**31)
TIMESTAMP_POSITIVE_INFINITY = 2**63 - 1
TIMESTAMP_NEGATIVE_INFINITY = -(2**63)
MAX_TIME_MICROS = 86_400_000_000


class AvroKind(enum.Enum):
    """The closed set of column types of the contract; the value is the Avro (logical) type."""

    BOOLEAN = "boolean"
    INT = "int"
    LONG = "long"
    FLOAT = "float"
    DOUBLE = "double"
    BYTES = "bytes"
    STRING = "string"
    DECIMAL = "decimal"
    DATE = "date"
    TIME_MICROS = "time-micros"
    TIMESTAMP_MICROS = "timestamp-micros"
    LOCAL_TIMESTAMP_MICROS = "local-timestamp-micros"
    UUID = "uuid"
    ARRAY = "array"


# Logical kinds: (physical Avro type, logicalType).
_LOGICAL: dict[AvroKind, tuple[str, str]] = {
    AvroKind.DATE: ("int", "date"),
    AvroKind.TIME_MICROS: ("long", "time-micros"),
    AvroKind.TIMESTAMP_MICROS: ("long", "timestamp-micros"),
    AvroKind.LOCAL_TIMESTAMP_MICROS: ("long", "local-timestamp-micros"),
    AvroKind.UUID: ("string", "uuid"),
}


@dataclass(frozen=True, slots=True)
class ColumnType:
    """The Avro type of one column. Build parameterised ones with :meth:`decimal` and
    :meth:`array`; the plain ones are module constants (:data:`LONG`, :data:`STRING`...)."""

    kind: AvroKind
    precision: int | None = None
    scale: int | None = None
    items: ColumnType | None = None

    def __post_init__(self) -> None:
        if self.kind is AvroKind.DECIMAL:
            if self.precision is None or self.scale is None:
                raise ValueError("a DECIMAL column type needs a precision and a scale")
            if not 1 <= self.precision <= MAX_DECIMAL_PRECISION:
                raise ValueError(
                    f"decimal precision {self.precision} is outside 1..{MAX_DECIMAL_PRECISION}: "
                    "map such numeric columns to STRING (their text form)"
                )
            if not 0 <= self.scale <= self.precision:
                raise ValueError(
                    f"decimal scale {self.scale} is outside 0..{self.precision}: map such "
                    "numeric columns to STRING (their text form)"
                )
        elif self.precision is not None or self.scale is not None:
            raise ValueError(f"{self.kind.name} takes no precision or scale")
        if (self.kind is AvroKind.ARRAY) != (self.items is not None):
            raise ValueError("items are given for ARRAY, and only for ARRAY")

    @classmethod
    def decimal(cls, precision: int, scale: int) -> ColumnType:
        return cls(AvroKind.DECIMAL, precision=precision, scale=scale)

    @classmethod
    def array(cls, items: ColumnType) -> ColumnType:
        return cls(AvroKind.ARRAY, items=items)

    def avro(self) -> str | dict[str, Any]:
        """The Avro type of a non-null value of this column."""
        if self.kind is AvroKind.DECIMAL:
            return {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": self.precision,
                "scale": self.scale,
            }
        if self.kind is AvroKind.ARRAY:
            assert self.items is not None  # __post_init__ guarantees it
            return {"type": "array", "items": ["null", self.items.avro()]}
        logical = _LOGICAL.get(self.kind)
        if logical is not None:
            return {"type": logical[0], "logicalType": logical[1]}
        primitive: str = self.kind.value
        return primitive


BOOLEAN = ColumnType(AvroKind.BOOLEAN)
INT = ColumnType(AvroKind.INT)
LONG = ColumnType(AvroKind.LONG)
FLOAT = ColumnType(AvroKind.FLOAT)
DOUBLE = ColumnType(AvroKind.DOUBLE)
BYTES = ColumnType(AvroKind.BYTES)
STRING = ColumnType(AvroKind.STRING)
DATE = ColumnType(AvroKind.DATE)
TIME_MICROS = ColumnType(AvroKind.TIME_MICROS)
TIMESTAMP_MICROS = ColumnType(AvroKind.TIMESTAMP_MICROS)
LOCAL_TIMESTAMP_MICROS = ColumnType(AvroKind.LOCAL_TIMESTAMP_MICROS)
UUID = ColumnType(AvroKind.UUID)
