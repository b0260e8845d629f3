"""Records of the schema topic ``<prefix>._schemas`` (see :func:`schemas.naming.schema_topic`).

The topic is compacted and holds every writer schema any key or value on the change
topics was written with:

- Kafka key: the 8 fingerprint bytes, little-endian -- the same bytes as positions 2..9
  of each record written with that schema.
- Kafka value: the single-object encoding of ``pgdelta.contract.WriterSchema``
  (``schemas/avro/writer_schema.avsc``): the fingerprint again and the complete schema
  JSON, logical types and ``pg.*`` attributes included.

Invariants:

- The capture publishes (and flushes) a schema before the first record that uses it, so a
  consumer that reads the schema topic to its end before a change topic knows every
  fingerprint it meets there.
- Key, ``fingerprint`` field and the fingerprint of ``schema`` agree;
  :func:`read_schema_message` checks all three.
- A schema is never deleted: the topic has ``cleanup.policy=compact`` and no tombstones.
  Re-publishing a schema writes identical bytes, so duplicates are harmless.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

from fastavro import parse_schema, schemaless_writer
from fastavro.schema import SchemaParseException

from schemas.change_record import TableSchemas
from schemas.envelope import TABLE_KEY_SCHEMA, WRITER_SCHEMA_FINGERPRINT, WRITER_SCHEMA_SCHEMA
from schemas.errors import DecodeError, SchemaMessageError
from schemas.single_object import (
    FINGERPRINT_SIZE,
    Fingerprint,
    fingerprint_bytes,
    format_fingerprint,
    header,
    read_body,
    schema_fingerprint,
    split,
)

_WRITER_SCHEMA = parse_schema(WRITER_SCHEMA_SCHEMA)


@dataclass(frozen=True, slots=True)
class SchemaMessage:
    """One schema-topic record, ready for the producer."""

    key: bytes
    value: bytes


def schema_message(schema_json: str) -> SchemaMessage:
    """The schema-topic record announcing ``schema_json`` (published as given)."""
    key = fingerprint_bytes(schema_fingerprint(json.loads(schema_json)))
    buffer = io.BytesIO()
    buffer.write(header(WRITER_SCHEMA_FINGERPRINT))
    schemaless_writer(buffer, _WRITER_SCHEMA, {"fingerprint": key, "schema": schema_json})
    return SchemaMessage(key, buffer.getvalue())


def table_schema_messages(schemas: TableSchemas) -> tuple[SchemaMessage, SchemaMessage]:
    """The records for a table's key schema and value schema, in that order."""
    return schema_message(schemas.key_schema_json), schema_message(schemas.value_schema_json)


TABLE_KEY_SCHEMA_MESSAGE = schema_message(json.dumps(TABLE_KEY_SCHEMA, separators=(",", ":")))
"""The record for the key of TRUNCATE records; the capture publishes it once at start."""


def read_schema_message(key: bytes, value: bytes) -> tuple[Fingerprint, str]:
    """The fingerprint and schema JSON of a schema-topic record, after checking that key,
    value and schema agree."""
    if len(key) != FINGERPRINT_SIZE:
        raise SchemaMessageError(
            f"schema-topic key of {len(key)} bytes, expected {FINGERPRINT_SIZE}: the topic "
            "holds records not written by this contract"
        )
    try:
        fingerprint, body = split(value)
        if fingerprint != WRITER_SCHEMA_FINGERPRINT:
            raise SchemaMessageError(
                f"schema-topic value written with schema {format_fingerprint(fingerprint)}, "
                f"expected pgdelta.contract.WriterSchema "
                f"{format_fingerprint(WRITER_SCHEMA_FINGERPRINT)}: the topic holds records "
                "not written by this contract"
            )
        record = read_body(_WRITER_SCHEMA, body, len(value))
    except DecodeError as exc:
        raise SchemaMessageError(f"schema-topic value cannot be decoded: {exc}") from exc
    schema_json: str = record["schema"]
    try:
        computed = fingerprint_bytes(schema_fingerprint(json.loads(schema_json)))
    except (ValueError, TypeError, SchemaParseException) as exc:
        raise SchemaMessageError(
            f"schema-topic record {key.hex()} holds a schema that is not valid Avro JSON: {exc}"
        ) from exc
    if not key == record["fingerprint"] == computed:
        raise SchemaMessageError(
            f"schema-topic record has key {key.hex()}, fingerprint field "
            f"{record['fingerprint'].hex()} and a schema fingerprinting to {computed.hex()}: "
            "they must agree; the record was altered or written by another tool"
        )
    return Fingerprint(int.from_bytes(key, "little")), schema_json
