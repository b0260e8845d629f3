"""The Confluent Schema Registry wire format, and which framing a record uses.

Layout (https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/index.html#wire-format)::

    00 | schema id (4 bytes, big-endian) | Avro binary body

The body is exactly the body of the single-object encoding (:mod:`schemas.single_object`)
of the same change: only the header differs. A deployment chooses one framing for what
it writes (``CAPTURE_KAFKA__ENCODING``), and a topic may hold both after a switch, so a
reader decides **per record**, from its first byte (:func:`framing_of`): ``C3`` is the
single-object marker's first byte, ``00`` the registry's magic byte; anything else is
not a record of this contract.

Writer keys. apply and the dead-letter table name a record's writer schema by 8 bytes
(shown as 16 hex digits). For a single-object record that is its fingerprint; for a
registry record it is four zero bytes followed by the 4-byte big-endian id
(:func:`writer_key`), so id 7 shows as ``0000000000000007``. A real fingerprint whose
first four bytes are zero (one schema in 2^32) would share its key with a registry id;
the reader that resolves keys to schemas refuses that case when the two schemas differ
(``apply.control.feedback.SchemaCatalog``) rather than decode records with the wrong one.

Invariants:

- :func:`split` bounds-checks the header and never returns a body for a wrong magic
  byte; errors are the contract's typed :class:`~schemas.errors.DecodeError`\\ s.
- Schema ids are positive 32-bit signed integers, as the Confluent API hands them out;
  :func:`header` refuses anything else rather than write an id no client reads back.
"""

from __future__ import annotations

import enum
from typing import NewType

from schemas.errors import DecodeError, TruncatedRecordError
from schemas.single_object import FINGERPRINT_SIZE, MARKER, Fingerprint

SchemaId = NewType("SchemaId", int)

MAGIC = b"\x00"
ID_SIZE = 4
HEADER_SIZE = len(MAGIC) + ID_SIZE
MAX_SCHEMA_ID = 2**31 - 1

_KEY_PAD = bytes(FINGERPRINT_SIZE - ID_SIZE)


class Framing(enum.Enum):
    SINGLE_OBJECT = "single-object"
    REGISTRY = "registry"


_FRAMINGS: dict[int, Framing] = {
    MARKER[0]: Framing.SINGLE_OBJECT,
    MAGIC[0]: Framing.REGISTRY,
}


class UnknownFramingError(DecodeError):
    """The first byte is neither the single-object marker nor the registry magic byte."""

    def __init__(self, found: bytes) -> None:
        super().__init__(
            f"record starts with {found.hex(' ') or 'nothing'}: neither the Avro "
            "single-object marker c3 01 nor the Schema Registry magic byte 00, so it was "
            "not written by this contract (check that the consumer reads a change topic "
            "and decodes the right field, key or value)"
        )
        self.found = found


def framing_of(data: bytes | memoryview) -> Framing:
    """Which framing ``data`` uses, from its first byte (see the module docstring)."""
    if not data:
        raise TruncatedRecordError("framing byte", 0)
    framing = _FRAMINGS.get(data[0])
    if framing is None:
        raise UnknownFramingError(bytes(data[:2]))
    return framing


def header(schema_id: SchemaId) -> bytes:
    """The 5 bytes that precede every body written with the registered schema ``schema_id``."""
    if not 0 < schema_id <= MAX_SCHEMA_ID:
        raise ValueError(f"schema id {schema_id} is not a positive 32-bit integer")
    return MAGIC + schema_id.to_bytes(ID_SIZE, "big")


def split(data: bytes | memoryview) -> tuple[SchemaId, memoryview]:
    """Split a registry-framed record into its schema id and its body.

    Raises :class:`UnknownFramingError` for a wrong magic byte and
    :class:`~schemas.errors.TruncatedRecordError` for an incomplete header.
    """
    view = memoryview(data)
    if not view:
        raise TruncatedRecordError("registry header", 0)
    if view[:1] != MAGIC:
        raise UnknownFramingError(bytes(view[:2]))
    if len(view) < HEADER_SIZE:
        raise TruncatedRecordError("registry header", len(view))
    return SchemaId(int.from_bytes(view[1:HEADER_SIZE], "big")), view[HEADER_SIZE:]


def writer_key(schema_id: SchemaId) -> Fingerprint:
    """The 8-byte writer key of registry id ``schema_id`` (module docstring), as the
    :data:`~schemas.single_object.Fingerprint` whose little-endian bytes they are."""
    return Fingerprint(int.from_bytes(_KEY_PAD + schema_id.to_bytes(ID_SIZE, "big"), "little"))


def registry_id_of(key: Fingerprint) -> SchemaId | None:
    """The registry id a writer key stands for, or None when it is not of that form."""
    raw = key.to_bytes(FINGERPRINT_SIZE, "little")
    if raw[: len(_KEY_PAD)] != _KEY_PAD:
        return None
    schema_id = int.from_bytes(raw[len(_KEY_PAD) :], "big")
    return SchemaId(schema_id) if 0 < schema_id <= MAX_SCHEMA_ID else None
