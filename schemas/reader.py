"""Decode the keys and values of the change topics: what any Python consumer uses.

Usage::

    reader = ContractReader(schema_topic("cdc"))
    for message in <the schema topic, from the beginning to its end>:
        reader.add_schema_message(message.key(), message.value())
    for message in <a change topic>:
        key = reader.decode_key(message.key())
        value = reader.decode_value(message.value()) if message.value() is not None else None

The reader knows the two fixed schemas of the contract (the TRUNCATE key and the
schema-topic value) from the start; every other schema comes from the caller. It does
no Kafka I/O.

Decoded values: records are dicts keyed by Avro field name, enums are their symbol
strings, decimals ``Decimal``, UUIDs ``UUID``, dates/times/timestamps ``date``/``time``/
``datetime`` (timestamps in UTC are aware). A date, time or timestamp Python's types
cannot hold -- PostgreSQL's ``infinity``/``-infinity``, a year outside 1..9999, the time
``24:00:00`` -- comes back as :class:`UnrepresentableTemporal` carrying the exact Avro
integer, never as a clamped or shifted value.

Errors (all :class:`schemas.errors.DecodeError`): wrong marker, short record, unknown
fingerprint (load the schema topic first), a body that does not match its schema, or a
key passed where a value is expected and the other way round.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from fastavro import parse_schema
from fastavro.schema import SchemaParseException

from schemas.change_record import KEY_RECORD, VALUE_RECORD
from schemas.column_type import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    MAX_TIME_MICROS,
    TIMESTAMP_NEGATIVE_INFINITY,
    TIMESTAMP_POSITIVE_INFINITY,
)
from schemas.envelope import TABLE_KEY_SCHEMA, WRITER_SCHEMA_SCHEMA
from schemas.errors import (
    RoleMismatchError,
    SchemaMessageError,
    UnknownFingerprintError,
)
from schemas.schema_topic import read_schema_message
from schemas.single_object import (
    Fingerprint,
    format_fingerprint,
    read_body,
    schema_fingerprint,
    split,
)

Converter = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class UnrepresentableTemporal:
    """A date, time or timestamp outside what Python's ``datetime`` types hold.

    ``value`` is the Avro integer as written: days since 1970-01-01 for ``date``,
    microseconds after midnight for ``time-micros``, microseconds since 1970-01-01 for
    the timestamps.
    """

    logical_type: str
    value: int

    @property
    def infinity(self) -> int:
        """1 for PostgreSQL ``infinity``, -1 for ``-infinity``, 0 for a finite value."""
        if self.logical_type == "date":
            high, low = DATE_POSITIVE_INFINITY, DATE_NEGATIVE_INFINITY
        elif self.logical_type == "time-micros":
            return 0
        else:
            high, low = TIMESTAMP_POSITIVE_INFINITY, TIMESTAMP_NEGATIVE_INFINITY
        return 1 if self.value == high else -1 if self.value == low else 0


_EPOCH_DATE = date(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_LOCAL = datetime(1970, 1, 1)  # local-timestamp-micros is zone-less
_MICROSECOND = timedelta(microseconds=1)
_MIN_DAYS = (date.min - _EPOCH_DATE).days
_MAX_DAYS = (date.max - _EPOCH_DATE).days
_MIN_MICROS = (datetime.min - _EPOCH_LOCAL) // _MICROSECOND
_MAX_MICROS = (datetime.max - _EPOCH_LOCAL) // _MICROSECOND


def _date(days: int) -> date | UnrepresentableTemporal:
    if _MIN_DAYS <= days <= _MAX_DAYS:
        return _EPOCH_DATE + timedelta(days=days)
    return UnrepresentableTemporal("date", days)


def _time(micros: int) -> time | UnrepresentableTemporal:
    if 0 <= micros < MAX_TIME_MICROS:
        seconds, micro = divmod(micros, 1_000_000)
        minutes, second = divmod(seconds, 60)
        return time(minutes // 60, minutes % 60, second, micro)
    return UnrepresentableTemporal("time-micros", micros)


def _timestamp(micros: int) -> datetime | UnrepresentableTemporal:
    if _MIN_MICROS <= micros <= _MAX_MICROS:
        return _EPOCH_UTC + timedelta(microseconds=micros)
    return UnrepresentableTemporal("timestamp-micros", micros)


def _local_timestamp(micros: int) -> datetime | UnrepresentableTemporal:
    if _MIN_MICROS <= micros <= _MAX_MICROS:
        return _EPOCH_LOCAL + timedelta(microseconds=micros)
    return UnrepresentableTemporal("local-timestamp-micros", micros)


# fastavro's own readers for these logical types raise on values Python cannot hold, so
# the reader strips them from the schema it decodes with and converts the integers here.
_TEMPORAL: dict[tuple[str, str], Converter] = {
    ("int", "date"): _date,
    ("long", "time-micros"): _time,
    ("long", "timestamp-micros"): _timestamp,
    ("long", "local-timestamp-micros"): _local_timestamp,
}

_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))


class _RecordConverter:
    """Converts the fields that need it, in place (fastavro hands back a fresh dict)."""

    __slots__ = ("fields",)

    def __init__(self) -> None:
        self.fields: list[tuple[str, Converter]] = []

    def __call__(self, datum: dict[str, Any]) -> dict[str, Any]:
        for name, convert in self.fields:
            datum[name] = convert(datum[name])
        return datum


def _nullable(convert: Converter) -> Converter:
    return lambda value: None if value is None else convert(value)


def _each(convert: Converter) -> Converter:
    return lambda values: [convert(value) for value in values]


def _each_value(convert: Converter) -> Converter:
    return lambda values: {key: convert(value) for key, value in values.items()}


class _Planner:
    """Rewrites a schema without the temporal logical types and builds the converter that
    turns the decoded integers back into dates and times."""

    def __init__(self) -> None:
        self.named: dict[str, Converter | None] = {}

    def plan(self, schema: Any, namespace: str) -> tuple[Any, Converter | None]:
        if isinstance(schema, str):
            return schema, self._reference(schema, namespace)
        if isinstance(schema, list):
            return self._union(schema, namespace)
        kind = schema.get("type")
        if not isinstance(kind, str):
            return schema, None  # not a form the contract writes; fastavro judges it
        if kind in ("record", "error"):
            return self._record(schema, namespace)
        if kind == "array":
            items, convert = self.plan(schema["items"], namespace)
            return {**schema, "items": items}, None if convert is None else _each(convert)
        if kind == "map":
            values, convert = self.plan(schema["values"], namespace)
            return {**schema, "values": values}, None if convert is None else _each_value(convert)
        if kind in ("enum", "fixed"):
            self.named[_full_name(schema, namespace)] = None
            return schema, None
        convert = _TEMPORAL.get((kind, schema.get("logicalType")))
        if convert is None:
            return schema, None
        return {key: value for key, value in schema.items() if key != "logicalType"}, convert

    def _reference(self, name: str, namespace: str) -> Converter | None:
        if name in _PRIMITIVES:
            return None
        if "." not in name and namespace:
            qualified = f"{namespace}.{name}"
            if qualified in self.named:
                return self.named[qualified]
        return self.named.get(name)

    def _union(self, branches: list[Any], namespace: str) -> tuple[Any, Converter | None]:
        planned = [self.plan(branch, namespace) for branch in branches]
        converting = [convert for _, convert in planned if convert is not None]
        rewritten = [branch for branch, _ in planned]
        if not converting:
            return rewritten, None
        if len(branches) != 2 or "null" not in branches:
            raise SchemaMessageError(
                "a union other than [null, T] holds a date or time: such schemas are not "
                "written by this contract and the reader cannot tell its branches apart"
            )
        return rewritten, _nullable(converting[0])

    def _record(self, schema: dict[str, Any], namespace: str) -> tuple[Any, Converter | None]:
        full_name = _full_name(schema, namespace)
        inner = full_name.rpartition(".")[0]
        converter = _RecordConverter()
        # Registered before the fields so a recursive reference finds it.
        self.named[full_name] = converter
        fields = []
        for field in schema["fields"]:
            field_type, convert = self.plan(field["type"], inner)
            fields.append({**field, "type": field_type})
            if convert is not None:
                converter.fields.append((field["name"], convert))
        if not converter.fields:
            self.named[full_name] = None
        return {**schema, "fields": fields}, converter if converter.fields else None


def _full_name(schema: dict[str, Any], namespace: str) -> str:
    name: str = schema["name"]
    if "." in name:
        return name
    space: str = schema.get("namespace", namespace)
    return f"{space}.{name}" if space else name


class Role(enum.Enum):
    KEY = "key"
    VALUE = "value"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class _Entry:
    schema_json: str
    full_name: str
    role: Role
    parsed: Any
    convert: Converter | None


def _role(full_name: str) -> Role:
    if full_name == _full_name(TABLE_KEY_SCHEMA, ""):
        return Role.KEY
    if full_name.startswith("pgdelta."):
        last = full_name.rpartition(".")[2]
        if last == KEY_RECORD:
            return Role.KEY
        if last == VALUE_RECORD:
            return Role.VALUE
    return Role.OTHER


class ContractReader:
    """A registry of writer schemas by fingerprint, and the decoder that uses it.

    Not thread-safe while schemas are being added; decoding alone is.
    """

    def __init__(self, schema_topic: str) -> None:
        """``schema_topic`` is named in the error for an unknown fingerprint."""
        self.schema_topic = schema_topic
        self._entries: dict[Fingerprint, _Entry] = {}
        for fixed in (TABLE_KEY_SCHEMA, WRITER_SCHEMA_SCHEMA):
            self.add_schema(json.dumps(fixed, separators=(",", ":")))

    def add_schema_message(self, key: bytes, value: bytes | None) -> Fingerprint | None:
        """Register the schema of one schema-topic record; a null value is ignored."""
        if value is None:
            return None
        fingerprint, schema_json = read_schema_message(key, value)
        self._register(fingerprint, schema_json)
        return fingerprint

    def add_schema(self, schema_json: str) -> Fingerprint:
        """Register a writer schema given as JSON text."""
        try:
            fingerprint = schema_fingerprint(json.loads(schema_json))
        except (ValueError, TypeError, SchemaParseException) as exc:
            raise SchemaMessageError(f"not a valid Avro schema: {exc}") from exc
        self._register(fingerprint, schema_json)
        return fingerprint

    def _register(self, fingerprint: Fingerprint, schema_json: str) -> None:
        if fingerprint in self._entries:
            return
        schema = json.loads(schema_json)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            raise SchemaMessageError(
                f"schema {format_fingerprint(fingerprint)} is not a record: every key and "
                "value of the contract is one"
            )
        stripped, convert = _Planner().plan(schema, "")
        try:
            parsed = parse_schema(stripped)
        except (ValueError, TypeError, SchemaParseException) as exc:
            raise SchemaMessageError(
                f"schema {format_fingerprint(fingerprint)} is not valid Avro: {exc}"
            ) from exc
        full_name = _full_name(schema, "")
        self._entries[fingerprint] = _Entry(
            schema_json, full_name, _role(full_name), parsed, convert
        )

    def __contains__(self, fingerprint: object) -> bool:
        return fingerprint in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def schema_json(self, fingerprint: Fingerprint) -> str:
        """The writer schema JSON for ``fingerprint``, e.g. for Spark's ``from_avro``."""
        return self._entry(fingerprint).schema_json

    def fingerprint(self, data: bytes) -> Fingerprint:
        """The writer fingerprint in the header of ``data``."""
        return split(data)[0]

    def decode_key(self, data: bytes) -> dict[str, Any]:
        """Decode a Kafka key of a change topic."""
        datum: dict[str, Any] = self._decode(data, Role.KEY)
        return datum

    def decode_value(self, data: bytes) -> dict[str, Any]:
        """Decode a non-null Kafka value of a change topic (a null one is a tombstone)."""
        datum: dict[str, Any] = self._decode(data, Role.VALUE)
        return datum

    def decode(self, data: bytes) -> Any:
        """Decode any single-object record whose schema is registered."""
        return self._decode(data, None)

    def _entry(self, fingerprint: Fingerprint) -> _Entry:
        entry = self._entries.get(fingerprint)
        if entry is None:
            raise UnknownFingerprintError(format_fingerprint(fingerprint), self.schema_topic)
        return entry

    def _decode(self, data: bytes, role: Role | None) -> Any:
        fingerprint, body = split(data)
        entry = self._entry(fingerprint)
        if role is not None and entry.role is not role:
            raise RoleMismatchError(
                f"record written with {entry.full_name} ({format_fingerprint(fingerprint)}) "
                f"is a {entry.role.value} record, not a {role.value}: pass the Kafka "
                f"{'key' if role is Role.VALUE else 'value'} to decode_{entry.role.value}"
                if entry.role is not Role.OTHER
                else f"record written with {entry.full_name} is not a change-topic {role.value}"
            )
        datum = read_body(entry.parsed, body, len(data))
        return datum if entry.convert is None else entry.convert(datum)
