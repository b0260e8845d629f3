"""What the type mapping needs to know about PostgreSQL types, read from ``pg_type``.

A Relation message gives each column's type OID and type modifier, nothing more. To map
a column, :func:`capture.rows.typemap.map_column` must know whether the type is an array (and
of what), a domain (and over what), an enum, a composite... :func:`load_types` reads
that for a set of OIDs *and everything they lead to* -- array elements, domain base
types, transitively -- in one query, so a mapping never needs another round trip.

Invariants:

- An OID is an array type when its output function is ``array_out``, and then
  :attr:`PgType.element_oid` is its ``typelem``. The output function is what decides
  the text the server sends, so it is the test that matters: ``int2vector`` and
  ``oidvector`` have ``typcategory = 'A'`` and ``array_subscript_handler`` too, but
  print ``1 2 3`` rather than ``{1,2,3}``; ``name``, ``point`` and ``box`` have a
  ``typelem`` and are no arrays at all.
- :attr:`PgType.base_oid` is the *immediate* base of a domain, which may itself be a
  domain; the loader follows the chain to its end.
- The catalog is read when asked: a type changed later (an enum value added, a domain
  dropped and recreated) is seen only by the next :func:`load_types`. The capture calls
  it for each Relation message, which PostgreSQL sends again after every DDL on the
  table.
- :func:`load_array_dimensions` reads ``pg_attribute.attndims``: PostgreSQL does not
  enforce it, but it is the only place a table says that a column holds two-dimensional
  arrays, and an Avro schema must fix the nesting depth up front.

Both functions run plain SQL, so they need a normal connection (a replication
connection is busy streaming).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

PG_CATALOG = "pg_catalog"


class TypType(enum.Enum):
    """``pg_type.typtype``."""

    BASE = "b"
    COMPOSITE = "c"
    DOMAIN = "d"
    ENUM = "e"
    PSEUDO = "p"
    RANGE = "r"
    MULTIRANGE = "m"


@dataclass(frozen=True, slots=True)
class PgType:
    """One row of ``pg_type``, reduced to what the type mapping reads."""

    oid: int
    namespace: str
    name: str
    typtype: TypType
    element_oid: int | None = None
    """For an array type (output function ``array_out``): the type of its elements."""
    base_oid: int | None = None
    """For a domain: the type it is declared over (possibly another domain)."""
    base_typmod: int = -1
    """For a domain: the type modifier of its base type (``numeric(10,2)`` -> 655366)."""
    delimiter: str = ","
    """``typdelim``: separates this type's values inside an array literal."""

    @property
    def qualified_name(self) -> str:
        """The name as ``format_type`` would print it with an empty search path, minus the
        quoting: unqualified in ``pg_catalog``, ``schema.name`` elsewhere."""
        if self.namespace == PG_CATALOG:
            return self.name
        return f"{self.namespace}.{self.name}"


# Starts from the requested OIDs and follows array elements and domain bases until
# nothing new turns up; UNION (not UNION ALL) makes the recursion stop on repeats.
_LOAD_TYPES = sql.SQL(
    """
    WITH RECURSIVE wanted(oid) AS (
        SELECT pg_catalog.unnest(%(oids)s::pg_catalog.oid[])
      UNION
        SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.typelem END
        FROM wanted AS w
        JOIN pg_catalog.pg_type AS t ON t.oid = w.oid
        WHERE t.typtype = 'd'
           OR (t.typelem <> 0 AND t.typoutput = 'pg_catalog.array_out'::pg_catalog.regproc)
    )
    SELECT t.oid::pg_catalog.int8,
           n.nspname::pg_catalog.text,
           t.typname::pg_catalog.text,
           t.typtype::pg_catalog.text,
           CASE WHEN t.typelem <> 0
                 AND t.typoutput = 'pg_catalog.array_out'::pg_catalog.regproc
                THEN t.typelem::pg_catalog.int8 END,
           CASE WHEN t.typtype = 'd' THEN t.typbasetype::pg_catalog.int8 END,
           t.typtypmod,
           t.typdelim::pg_catalog.text
    FROM pg_catalog.pg_type AS t
    JOIN pg_catalog.pg_namespace AS n ON n.oid = t.typnamespace
    WHERE t.oid IN (SELECT oid FROM wanted)
    """
)

_ARRAY_DIMENSIONS = sql.SQL(
    """
    SELECT a.attname::pg_catalog.text, a.attndims
    FROM pg_catalog.pg_attribute AS a
    WHERE a.attrelid = %(relation)s::pg_catalog.oid
      AND a.attnum > 0
      AND NOT a.attisdropped
      AND a.attndims > 0
    """
)


def load_types(conn: psycopg.Connection[Any], oids: Iterable[int]) -> dict[int, PgType]:
    """``pg_type`` entries of ``oids`` and of every type they reference, by OID.

    An OID that no longer exists (a type dropped since the Relation message was sent)
    is missing from the result; mapping a column of it then names the OID.
    """
    wanted = sorted(set(oids))
    if not wanted:
        return {}
    rows = conn.execute(_LOAD_TYPES, {"oids": wanted}).fetchall()
    types: dict[int, PgType] = {}
    for oid, namespace, name, typtype, element_oid, base_oid, typmod, delimiter in rows:
        types[oid] = PgType(
            oid=oid,
            namespace=namespace,
            name=name,
            typtype=TypType(typtype),
            element_oid=element_oid,
            base_oid=base_oid,
            base_typmod=typmod,
            delimiter=delimiter,
        )
    return types


def load_array_dimensions(conn: psycopg.Connection[Any], relation_oid: int) -> dict[str, int]:
    """Declared dimensions of the array columns of a table, by column name.

    Columns declared without dimensions (``attndims = 0``, e.g. made by ``CREATE TABLE
    AS`` or declared with the array type's own name ``_int4``) and non-array columns are
    left out; map those as one-dimensional.
    """
    rows = conn.execute(_ARRAY_DIMENSIONS, {"relation": relation_oid}).fetchall()
    return dict(rows)
