"""Avro single-object encoding: every key and value on the change topics is one of these.

Layout (https://avro.apache.org/docs/1.12.0/specification/#single-object-encoding)::

    C3 01 | fingerprint (8 bytes, little-endian) | Avro binary body

The fingerprint is the CRC-64-AVRO (Rabin) fingerprint of the writer schema's Parsing
Canonical Form. A consumer that knows the schema for a fingerprint can decode the body
with no registry service; the schemas themselves travel on the schema topic
(:mod:`schemas.schema_topic`).

Invariants:

- :func:`fingerprint64` matches the Avro specification's test vectors
  (``share/test/data/schema-tests.txt``): ``"int"`` fingerprints to
  ``8247732601305521295``, so its header is ``c3 01 8f 5c 39 3f 1a d5 75 72``.
- A :data:`Fingerprint` is the unsigned 64-bit value; :func:`format_fingerprint` shows it
  as the 16 hex digits of its little-endian bytes, which is exactly how it appears in a
  hex dump of a record and in a schema-topic key.
- :func:`split` bounds-checks the header and never returns a body for a bad marker;
  :func:`read_body` raises a typed error for a short body, bad data or trailing bytes.
- Parsing Canonical Form strips logical types and custom attributes, so two schemas that
  differ only there share a fingerprint. The builder in :mod:`schemas.change_record`
  prevents that for every schema it makes (see its docstring); this module does not.
"""

from __future__ import annotations

import io
from typing import Any, NewType

from fastavro import schemaless_reader
from fastavro.schema import to_parsing_canonical_form

from schemas.errors import BadMarkerError, MalformedRecordError, TruncatedRecordError

Fingerprint = NewType("Fingerprint", int)

MARKER = b"\xc3\x01"
FINGERPRINT_SIZE = 8
HEADER_SIZE = len(MARKER) + FINGERPRINT_SIZE

# CRC-64-AVRO: the "empty" value and the table are those of the Avro specification.
_EMPTY = 0xC15D213AA4D7A795


def _table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        fp = byte
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


_TABLE = _table()

AvroSchema = dict[str, Any] | list[Any] | str
"""A parsed JSON schema (as ``json.loads`` returns it), not JSON text."""


def fingerprint64(data: bytes) -> Fingerprint:
    """The CRC-64-AVRO (Rabin) fingerprint of ``data``."""
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return Fingerprint(fp)


def canonical_form(schema: AvroSchema) -> str:
    """The Parsing Canonical Form of ``schema``."""
    canonical: str = to_parsing_canonical_form(schema)
    return canonical


def schema_fingerprint(schema: AvroSchema) -> Fingerprint:
    """The fingerprint a single-object header carries for records written with ``schema``."""
    return fingerprint64(canonical_form(schema).encode("utf-8"))


def fingerprint_bytes(fingerprint: Fingerprint) -> bytes:
    """The 8 little-endian bytes of ``fingerprint``, as in a header and a schema-topic key."""
    return fingerprint.to_bytes(FINGERPRINT_SIZE, "little")


def format_fingerprint(fingerprint: Fingerprint) -> str:
    """The 16 hex digits of the little-endian bytes, e.g. ``8f5c393f1ad57572`` for ``"int"``."""
    return fingerprint_bytes(fingerprint).hex()


def header(fingerprint: Fingerprint) -> bytes:
    """The 10 bytes that precede every body written with the schema of ``fingerprint``."""
    return MARKER + fingerprint_bytes(fingerprint)


def split(data: bytes | memoryview) -> tuple[Fingerprint, memoryview]:
    """Split a single-object record into its writer fingerprint and its body.

    Raises :class:`BadMarkerError` when the marker is wrong and
    :class:`TruncatedRecordError` when the header is incomplete.
    """
    view = memoryview(data)
    if view[: len(MARKER)] != MARKER:
        if len(view) < len(MARKER) and MARKER.startswith(bytes(view)):
            raise TruncatedRecordError("single-object header", len(view))
        raise BadMarkerError(bytes(view[: len(MARKER)]))
    if len(view) < HEADER_SIZE:
        raise TruncatedRecordError("single-object header", len(view))
    fingerprint = Fingerprint(int.from_bytes(view[len(MARKER) : HEADER_SIZE], "little"))
    return fingerprint, view[HEADER_SIZE:]


def read_body(schema: Any, body: memoryview, size: int) -> Any:
    """Decode ``body`` with ``schema`` (parsed by fastavro); all of it, and nothing more.

    ``size`` is the size of the whole record, for the error message.
    """
    stream = io.BytesIO(body)
    try:
        datum = schemaless_reader(stream, schema, None)
    except EOFError as exc:
        raise TruncatedRecordError("body", size) from exc
    except IndexError as exc:
        # fastavro reads a varint byte by byte and indexes the empty read at the end of
        # the input: the body stops inside a varint (its last byte still says "more").
        if stream.tell() == len(body) and body and body[-1] & 0x80:
            raise TruncatedRecordError("body", size) from exc
        raise _malformed(exc) from exc
    except (ValueError, OverflowError) as exc:
        # A bad UTF-8 sequence (UnicodeDecodeError is a ValueError) or decimal.
        raise _malformed(exc) from exc
    trailing = len(body) - stream.tell()
    if trailing:
        raise MalformedRecordError(
            f"{trailing} bytes follow the end of the record body: the producer wrote it "
            "with another schema than the header names"
        )
    return datum


def _malformed(exc: Exception) -> MalformedRecordError:
    return MalformedRecordError(
        f"record body does not match its writer schema ({type(exc).__name__}: {exc}): "
        "the producer wrote it with another schema than the header names"
    )
