"""Errors of the wire contract, classified by what the caller does next.

- :class:`UnknownFingerprintError` -- the reader has not seen the writer schema yet. The
  consumer loads the schema topic from the beginning and decodes the record again; the
  record itself is fine.
- :class:`BadMarkerError`, :class:`TruncatedRecordError`, :class:`MalformedRecordError`,
  :class:`RoleMismatchError` -- the bytes are not a record of this contract, or not the
  kind the caller asked for. Decoding again cannot help: the consumer stops at that
  offset (or parks it) and someone looks at the topic or the calling code.
- :class:`SchemaMessageError` -- a schema-topic record is inconsistent. Definite.
- :class:`TableDefinitionError`, :class:`ChangeEncodingError` -- a table or one of its
  changes cannot be expressed in the contract. The capture parks that table (its
  ``TableError``); the others keep streaming.

Every message names the cause and the fix, never a row value.
"""

from __future__ import annotations


class ContractError(Exception):
    """Base of every error the wire contract raises on purpose."""


class DecodeError(ContractError):
    """A Kafka key or value could not be decoded."""


class BadMarkerError(DecodeError):
    """The bytes do not start with the Avro single-object marker ``C3 01``."""

    def __init__(self, found: bytes) -> None:
        super().__init__(
            f"record starts with {found.hex(' ') or 'nothing'} instead of the Avro "
            "single-object marker c3 01: it was not written by this contract (check that "
            "the consumer reads a change topic and decodes the right field, key or value)"
        )
        self.found = found


class UnknownFingerprintError(DecodeError):
    """The writer schema of a record is not (yet) known to the reader."""

    def __init__(self, fingerprint: str, schema_topic: str) -> None:
        super().__init__(
            f"schema fingerprint {fingerprint} not found: consume the schema topic "
            f"{schema_topic} from the beginning first"
        )
        self.fingerprint = fingerprint
        self.schema_topic = schema_topic


class TruncatedRecordError(DecodeError):
    """The bytes end before the header or the body is complete."""

    def __init__(self, wanted: str, size: int) -> None:
        super().__init__(
            f"record of {size} bytes ends before its {wanted} is complete: the record was "
            "cut short on its way (compare its size with what the producer sent)"
        )
        self.size = size


class MalformedRecordError(DecodeError):
    """The body does not match its writer schema (bad data, trailing bytes)."""


class RoleMismatchError(DecodeError):
    """A value was passed where a key was expected, or the other way round."""


class SchemaMessageError(ContractError):
    """A schema-topic record is inconsistent or holds a schema the reader cannot use."""


class TableDefinitionError(ContractError):
    """A table description cannot be expressed in the contract."""

    def __init__(self, table: str, message: str) -> None:
        super().__init__(f"table {table}: {message}")
        self.table = table


class ChangeEncodingError(ContractError):
    """A change does not fit the schemas of its table."""

    def __init__(self, table: str, message: str) -> None:
        super().__init__(f"table {table}: {message}")
        self.table = table
