"""The operation a change record carries.

On the wire it is the Avro enum ``pgdelta.contract.Operation`` (``schemas/avro/
operation.avsc``) whose symbols are the member values below, in this order. An enum
costs one byte per record, names every possible value in the schema itself, and Spark's
``from_avro`` reads it as a plain string column; docs/wire-contract.md has the
measurements against a string field.

The set is closed: adding a symbol is a new contract version, because a consumer that
dispatches on the operation must learn what the new one means before it sees one.
"""

from __future__ import annotations

import enum


class Operation(enum.Enum):
    INSERT = "INSERT"
    """A row was inserted; ``after`` holds it."""
    UPDATE = "UPDATE"
    """A row changed without changing its key; ``after`` holds it, ``before`` the old row
    when the table has ``REPLICA IDENTITY FULL``."""
    DELETE = "DELETE"
    """A row was deleted; ``before`` holds its key columns, or the whole old row with
    ``REPLICA IDENTITY FULL``."""
    READ = "READ"
    """A row read by the initial snapshot; ``after`` holds it."""
    TRUNCATE = "TRUNCATE"
    """The table was truncated; no row images."""


SYMBOLS: tuple[str, ...] = tuple(op.value for op in Operation)
