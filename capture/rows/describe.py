"""A relation's columns onto the contract's types, read from the catalog.

A Relation (streamed, or built from the catalog for a snapshot) names each column's type
OID and modifier only; :func:`describe_columns` reads what the type map needs about those
types (:mod:`capture.rows.type_catalog`) and the declared array dimensions, then maps
each column (:func:`capture.rows.typemap.map_column`). The stream and the snapshot both
describe a table with it, so a row reads the same whichever path it took.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from capture.pgoutput import Relation
from capture.rows.type_catalog import load_array_dimensions, load_types
from capture.rows.typemap import ColumnMapping, map_column


def describe_columns(
    conn: psycopg.Connection[tuple[object, ...]], relation: Relation
) -> Sequence[ColumnMapping]:
    """The contract type and parser of each column of ``relation``, from the catalog."""
    types = load_types(conn, [c.type_oid for c in relation.columns])
    dims = load_array_dimensions(conn, relation.oid)
    table = f"{relation.namespace}.{relation.name}"
    return [
        map_column(
            c.type_oid,
            c.type_modifier,
            types,
            table=table,
            column=c.name,
            dimensions=dims.get(c.name, 1),
        )
        for c in relation.columns
    ]
