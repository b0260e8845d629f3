"""Kafka record headers of the change topics.

Headers repeat what the value holds, as ASCII text, so tools that do not decode Avro
(``kcat``, log inspection, broker-side tooling) can see where a record sits:

- ``pgdelta.commit_lsn``: the commit LSN in PostgreSQL's text form (``0/16B3748``);
- ``pgdelta.change_lsn``: the change LSN, same form;
- ``pgdelta.op``: the :class:`~schemas.operation.Operation` symbol (``INSERT``...);
- ``pgdelta.schema``: the writer-schema fingerprint of the value, 16 hex digits as
  :func:`~schemas.single_object.format_fingerprint` writes them.

A tombstone (null value after a DELETE) carries only the two LSN headers, those of the
DELETE it follows. Consumers must not require other headers to be absent: more may be
added without a new contract version.
"""

from __future__ import annotations

import functools

from schemas.change_record import Change
from schemas.lsn import Lsn, format_lsn
from schemas.operation import Operation
from schemas.single_object import Fingerprint, format_fingerprint

COMMIT_LSN = "pgdelta.commit_lsn"
CHANGE_LSN = "pgdelta.change_lsn"
OPERATION = "pgdelta.op"
SCHEMA_FINGERPRINT = "pgdelta.schema"

Headers = list[tuple[str, bytes]]
"""The shape confluent-kafka's ``Producer.produce(headers=...)`` accepts."""

_OPERATIONS = {op: (OPERATION, op.value.encode("ascii")) for op in Operation}


def change_headers(change: Change, value_fingerprint: Fingerprint) -> Headers:
    """The headers of the record carrying ``change`` (key and value)."""
    return record_headers(change.op, change.commit_lsn, change.change_lsn, value_fingerprint)


def record_headers(
    op: Operation, commit_lsn: Lsn, change_lsn: Lsn, value_fingerprint: Fingerprint
) -> Headers:
    """:func:`change_headers` from the fields it reads, for callers that have no
    :class:`Change` at hand."""
    return headers_at(
        shared_headers(op, commit_lsn, value_fingerprint), format_lsn(change_lsn).encode("ascii")
    )


SharedHeaders = tuple[tuple[str, bytes], tuple[str, bytes], tuple[str, bytes]]
"""The headers of a change record but ``change_lsn``: ``commit_lsn``, ``op`` and the
schema fingerprint, the same for every record of one transaction, operation and table
version."""


def shared_headers(op: Operation, commit_lsn: Lsn, value_fingerprint: Fingerprint) -> SharedHeaders:
    """The :data:`SharedHeaders` of records of this operation, transaction and table
    version."""
    operation, fingerprint = operation_headers(op, value_fingerprint)
    return commit_lsn_header(commit_lsn), operation, fingerprint


def operation_headers(
    op: Operation, value_fingerprint: Fingerprint
) -> tuple[tuple[str, bytes], tuple[str, bytes]]:
    """The ``op`` and schema fingerprint headers, the same for every record of one
    operation and table version, whatever its transaction."""
    return _OPERATIONS[op], _fingerprint_header(value_fingerprint)


def commit_lsn_header(commit_lsn: Lsn) -> tuple[str, bytes]:
    """The ``commit_lsn`` header, the same for every record of one transaction."""
    return _commit_lsn_header(commit_lsn)


def headers_at(shared: SharedHeaders, change_lsn_text: bytes) -> Headers:
    """The headers of the record at ``change_lsn_text`` (an LSN as
    :func:`schemas.lsn.format_lsn` writes it, ASCII) that shares the rest: one
    definition of their order for both encoders."""
    commit, operation, fingerprint = shared
    return [commit, (CHANGE_LSN, change_lsn_text), operation, fingerprint]


def tombstone_headers(delete: Change) -> Headers:
    """The headers of the tombstone that follows the record of ``delete``."""
    if delete.op is not Operation.DELETE:
        raise ValueError(f"only a DELETE is followed by a tombstone, not a {delete.op.value}")
    return position_headers(delete.commit_lsn, delete.change_lsn)


def position_headers(commit_lsn: Lsn, change_lsn: Lsn) -> Headers:
    """The two LSN headers alone: a tombstone's, from the DELETE it follows."""
    return [
        _commit_lsn_header(commit_lsn),
        (CHANGE_LSN, format_lsn(change_lsn).encode("ascii")),
    ]


# Every record of a transaction carries the same commit LSN header, and every record of a
# table version the same fingerprint header: formatted once, shared (tuples are immutable).
@functools.lru_cache(maxsize=16, typed=True)
def _commit_lsn_header(commit_lsn: Lsn) -> tuple[str, bytes]:
    return COMMIT_LSN, format_lsn(commit_lsn).encode("ascii")


@functools.lru_cache(maxsize=1024, typed=True)
def _fingerprint_header(value_fingerprint: Fingerprint) -> tuple[str, bytes]:
    return SCHEMA_FINGERPRINT, format_fingerprint(value_fingerprint).encode("ascii")
