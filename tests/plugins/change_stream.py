"""Decoded messages for the change stream's unit tests: the ``public.orders`` relation, column
mappings without a catalog, and a stream run over a list of messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from capture.errors import TableError
from capture.pgoutput import Relation, RelationColumn, ReplicaIdentity
from capture.rows.typemap import ColumnMapping
from capture.stream.change_stream import ChangeStream, Output
from schemas.column_type import LONG, STRING
from schemas.lsn import Lsn

ORDERS = Relation(
    xid=None,
    oid=16384,
    namespace="public",
    name="orders",
    replica_identity=ReplicaIdentity.DEFAULT,
    columns=(
        RelationColumn(True, "id", 20, -1),
        RelationColumn(False, "note", 25, -1),
        RelationColumn(False, "blob", 25, -1),
    ),
)
"""Key ``id`` int8, ``note`` and ``blob`` text, replica identity default."""


def describe_relation(relation: Relation) -> Sequence[ColumnMapping]:
    """Column mappings for int8 and text columns; any other type is a :class:`TableError`."""

    def mapping(oid: int) -> ColumnMapping:
        if oid == 20:
            return ColumnMapping(LONG, int, "int8")
        if oid == 25:
            return ColumnMapping(STRING, lambda b: b.decode(), "text")
        raise TableError(f"{relation.namespace}.{relation.name}", f"type {oid} unsupported")

    return [mapping(c.type_oid) for c in relation.columns]


def run_stream(stream: ChangeStream, messages: list[Any]) -> list[Output]:
    """Every output of ``messages`` handed to ``stream``, the n-th at LSN 0x1000 + n."""
    out: list[Output] = []
    for i, message in enumerate(messages):
        out += stream.handle(message, Lsn(0x1000 + i))
    return out
