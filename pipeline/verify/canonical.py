"""Canonical row text: one string per row that PostgreSQL and Spark print identically
for equal values, so a row is compared by the md5 of its text on each side.

Pure: this module builds SQL text (PostgreSQL as :mod:`psycopg.sql` compositions, Spark
as SQL expression strings) and runs nothing. Every pair of expressions for a column type
lives in :data:`_FORMS`, one entry per contract kind (docs/type-mapping.md), so the two
sides can only agree or disagree in one place. docs/verify.md lists the forms.

Invariants:

- **Equal values print equal text, different values print different text.** Numbers
  print as decimal integers (floats as their IEEE-754 bits, so ``-0``, ``NaN`` and
  ``±Infinity`` compare exactly; every NaN prints ``NaN``); decimals as plain text with
  their scale; temporal values as the integers the wire carries (days, microseconds,
  with the ``±infinity`` sentinels); bytes as lowercase hex; text-form types as the
  exact text their output function prints under capture's session settings (what
  capture sends); arrays as their shape and their elements, NULL elements included.
- **NULL is not a value.** A NULL column prints :data:`NULL_TEXT` (``\\N``). Texts that
  may hold the separator or a backslash are escaped (``\\`` -> ``\\\\``, ``,`` ->
  ``\\,``), so an escaped text never holds ``\\N`` or :data:`ABSENT_TEXT`, and the
  comma-joined row splits back into its columns one way only.
- **Spark runs with the session time zone UTC** (timestamp without time zone is read as
  UTC microseconds); the lake side checks it before it builds anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from psycopg import sql

from schemas.column_type import (
    DATE_NEGATIVE_INFINITY,
    DATE_POSITIVE_INFINITY,
    TIMESTAMP_NEGATIVE_INFINITY,
    TIMESTAMP_POSITIVE_INFINITY,
    AvroKind,
    ColumnType,
)

SEPARATOR = ","
NULL_TEXT = "\\N"
"""A NULL value (column or array element)."""
ABSENT_TEXT = "\\?"
"""Stands for a lake column that is missing or of another type: never equal to a value."""

SOURCE_ALIAS = "_t"
"""Alias of the source table in every PostgreSQL query built here."""
_ELEMENT, _ORDINAL, _ELEMENTS = "e", "o", "u"
_LAMBDA = "_verify_"


@dataclass(frozen=True, slots=True)
class CanonColumn:
    """One column as both sides print it."""

    name: str
    """The PostgreSQL column name, which is also the Delta column name."""
    column_type: ColumnType
    """The contract type capture publishes it as."""
    output_function: tuple[str, str] | None = None
    """``(schema, function)`` of the scalar's output function: what prints a STRING
    value (or a STRING array's elements) exactly as capture sends it."""

    @property
    def dimensions(self) -> int:
        depth, column_type = 0, self.column_type
        while column_type.kind is AvroKind.ARRAY:
            assert column_type.items is not None
            depth, column_type = depth + 1, column_type.items
        return depth

    @property
    def scalar(self) -> ColumnType:
        column_type = self.column_type
        while column_type.items is not None:
            column_type = column_type.items
        return column_type


def spark_literal(text: str) -> str:
    """A Spark SQL string literal (default parser: backslash escapes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def spark_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# --- per-kind forms ------------------------------------------------------------------

SourceForm = Callable[[sql.Composable, CanonColumn], sql.Composable]
LakeForm = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class _Form:
    source: SourceForm
    lake: LakeForm
    escaped: bool
    """The text may hold the separator or a backslash."""


def _q(template: str, **parts: sql.Composable) -> sql.Composable:
    return sql.SQL(template).format(**parts)


def _text_cast(value: sql.Composable, _: CanonColumn) -> sql.Composable:
    return _q("({v})::text", v=value)


def _lake_cast(value: str) -> str:
    return f"cast({value} as string)"


def _lake_identity(value: str) -> str:
    return value


def _output_text(value: sql.Composable, column: CanonColumn) -> sql.Composable:
    if column.output_function is None:
        raise ValueError(f"column {column.name}: a text-form column needs its output function")
    return _q("{f}({v})::text", f=sql.Identifier(*column.output_function), v=value)


def _float_bits(bits: int, send: str, int_type: str) -> SourceForm:
    def form(value: sql.Composable, _: CanonColumn) -> sql.Composable:
        return _q(
            "CASE WHEN {v} = 'NaN' THEN 'NaN' "
            "ELSE (('x' || encode({send}({v}), 'hex'))::bit({bits})::{int_type})::text END",
            v=value,
            send=sql.SQL(send),
            bits=sql.SQL(str(bits)),
            int_type=sql.SQL(int_type),
        )

    return form


def _lake_float_bits(java_class: str, method: str) -> LakeForm:
    def form(value: str) -> str:
        # reflect() cannot pass a NULL to a primitive parameter: guard it.
        return (
            f"CASE WHEN {value} IS NULL THEN NULL WHEN isnan({value}) THEN 'NaN' "
            f"ELSE reflect('{java_class}', '{method}', {value}) END"
        )

    return form


def _infinity_guard(
    finite: sql.Composable, value: sql.Composable, positive: int, negative: int
) -> sql.Composable:
    return _q(
        # No ELSE: a NULL stays NULL.
        "CASE WHEN isfinite({v}) THEN {finite} WHEN {v} > 'epoch' THEN {pos} "
        "WHEN {v} < 'epoch' THEN {neg} END",
        v=value,
        finite=finite,
        pos=sql.Literal(str(positive)),
        neg=sql.Literal(str(negative)),
    )


def _date_days(value: sql.Composable, _: CanonColumn) -> sql.Composable:
    days = _q("({v} - DATE '1970-01-01')::text", v=value)
    return _infinity_guard(days, value, DATE_POSITIVE_INFINITY, DATE_NEGATIVE_INFINITY)


def _epoch_micros(value: sql.Composable) -> sql.Composable:
    # EXTRACT returns an exact numeric (PostgreSQL 14+), so the product is exact.
    return _q("(EXTRACT(EPOCH FROM {v}) * 1000000)::int8::text", v=value)


def _time_micros(value: sql.Composable, _: CanonColumn) -> sql.Composable:
    return _epoch_micros(value)


def _timestamp_micros(value: sql.Composable, _: CanonColumn) -> sql.Composable:
    return _infinity_guard(
        _epoch_micros(value), value, TIMESTAMP_POSITIVE_INFINITY, TIMESTAMP_NEGATIVE_INFINITY
    )


_FORMS: dict[AvroKind, _Form] = {
    AvroKind.BOOLEAN: _Form(_text_cast, _lake_cast, escaped=False),  # true / false
    AvroKind.INT: _Form(_text_cast, _lake_cast, escaped=False),
    AvroKind.LONG: _Form(_text_cast, _lake_cast, escaped=False),
    # Plain text with exactly the scale on both sides (Spark prints decimals with
    # toPlainString, never in E notation).
    AvroKind.DECIMAL: _Form(_text_cast, _lake_cast, escaped=False),
    AvroKind.FLOAT: _Form(
        _float_bits(32, "float4send", "int4"),
        _lake_float_bits("java.lang.Float", "floatToIntBits"),
        escaped=False,
    ),
    AvroKind.DOUBLE: _Form(
        _float_bits(64, "float8send", "int8"),
        _lake_float_bits("java.lang.Double", "doubleToLongBits"),
        escaped=False,
    ),
    AvroKind.UUID: _Form(_text_cast, _lake_identity, escaped=False),  # lowercase both sides
    AvroKind.STRING: _Form(_output_text, _lake_identity, escaped=True),
    AvroKind.BYTES: _Form(
        lambda v, _: _q("encode({v}, 'hex')", v=v), lambda v: f"lower(hex({v}))", escaped=False
    ),
    AvroKind.DATE: _Form(_date_days, lambda v: f"cast(unix_date({v}) as string)", escaped=False),
    AvroKind.TIME_MICROS: _Form(_time_micros, _lake_cast, escaped=False),  # long in Delta
    AvroKind.TIMESTAMP_MICROS: _Form(
        _timestamp_micros, lambda v: f"cast(unix_micros({v}) as string)", escaped=False
    ),
    AvroKind.LOCAL_TIMESTAMP_MICROS: _Form(
        _timestamp_micros,
        lambda v: f"cast(unix_micros(cast({v} as timestamp)) as string)",
        escaped=False,
    ),
}


def _escape_source(text: sql.Composable) -> sql.Composable:
    return _q(
        "replace(replace({t}, {bs}, {bs2}), {sep}, {esep})",
        t=text,
        bs=sql.Literal("\\"),
        bs2=sql.Literal("\\\\"),
        sep=sql.Literal(SEPARATOR),
        esep=sql.Literal("\\" + SEPARATOR),
    )


def _escape_lake(text: str) -> str:
    return (
        f"replace(replace({text}, {spark_literal(chr(92))}, {spark_literal(chr(92) * 2)}), "
        f"{spark_literal(SEPARATOR)}, {spark_literal(chr(92) + SEPARATOR)})"
    )


def _scalar_form(column: CanonColumn) -> _Form:
    kind = column.scalar.kind
    form = _FORMS.get(kind)
    if form is None:
        raise ValueError(f"column {column.name}: no canonical form for {kind.name}")
    return form


# --- arrays --------------------------------------------------------------------------
#
# Text: "<shape>:<e1>,<e2>,..." with the elements in row-major order, each printed by
# its scalar form (escaped) or NULL_TEXT. The shape nests the lengths:
# 1-D "3"; 2-D "2(3,3)" (two rows of three); the empty array "0", or "0()" for more
# dimensions, as Spark's recursion prints it. Lower bounds are not part of it: the lake
# does not keep them (docs/type-mapping.md, arrays).


def _empty_shape(dimensions: int) -> str:
    return "0" if dimensions == 1 else "0()"


def _source_shape(value: sql.Composable, dimension: int, dimensions: int) -> sql.Composable:
    length = _q("array_length({v}, {d})::text", v=value, d=sql.Literal(dimension))
    if dimension == dimensions:
        return length
    inner = _source_shape(value, dimension + 1, dimensions)
    return _q(
        "{n} || '(' || array_to_string(array_fill({inner}, ARRAY[array_length({v}, {d})]), "
        "',') || ')'",
        n=length,
        inner=inner,
        v=value,
        d=sql.Literal(dimension),
    )


def _source_array(value: sql.Composable, column: CanonColumn) -> sql.Composable:
    form = _scalar_form(column)
    element = form.source(sql.Identifier(_ELEMENTS, _ELEMENT), column)
    if form.escaped:
        element = _escape_source(element)
    dimensions = column.dimensions
    return _q(
        "CASE WHEN {v} IS NULL THEN NULL WHEN cardinality({v}) = 0 THEN {empty} "
        "ELSE {shape} || ':' || (SELECT string_agg(coalesce({element}, {null}), ',' "
        "ORDER BY {u}.{o}) FROM unnest({v}) WITH ORDINALITY AS {u}({e}, {o})) END",
        v=value,
        empty=sql.Literal(_empty_shape(dimensions) + ":"),
        shape=_source_shape(value, 1, dimensions),
        element=element,
        null=sql.Literal(NULL_TEXT),
        u=sql.Identifier(_ELEMENTS),
        e=sql.Identifier(_ELEMENT),
        o=sql.Identifier(_ORDINAL),
    )


def _lake_shape(value: str, dimensions: int) -> str:
    length = f"cast(size({value}) as string)"
    if dimensions == 1:
        return length
    inner = f"{_LAMBDA}a{dimensions}"
    return (
        f"concat({length}, '(', array_join(transform({value}, {inner} -> "
        f"{_lake_shape(inner, dimensions - 1)}), ','), ')')"
    )


def _lake_array(value: str, column: CanonColumn) -> str:
    form = _scalar_form(column)
    flat = value
    for _ in range(column.dimensions - 1):
        flat = f"flatten({flat})"
    element = f"{_LAMBDA}e"
    text = form.lake(element)
    if form.escaped:
        text = _escape_lake(text)
    return (
        f"CASE WHEN {value} IS NULL THEN NULL ELSE concat({_lake_shape(value, column.dimensions)}"
        f", ':', array_join(transform({flat}, {element} -> coalesce({text}, "
        f"{spark_literal(NULL_TEXT)})), ',')) END"
    )


# --- columns and rows ----------------------------------------------------------------


def source_column(column: CanonColumn) -> sql.Composable:
    """The column's canonical text in PostgreSQL, escaped, ``\\N`` for NULL."""
    value = sql.Identifier(SOURCE_ALIAS, column.name)
    if column.dimensions:
        text = _escape_source(_source_array(value, column))
    else:
        form = _scalar_form(column)
        text = form.source(value, column)
        if form.escaped:
            text = _escape_source(text)
    return _q("coalesce({t}, {null})", t=text, null=sql.Literal(NULL_TEXT))


def lake_column(column: CanonColumn) -> str:
    """The column's canonical text in Spark SQL, escaped, ``\\N`` for NULL."""
    value = spark_identifier(column.name)
    if column.dimensions:
        text = _escape_lake(_lake_array(value, column))
    else:
        form = _scalar_form(column)
        text = form.lake(value)
        if form.escaped:
            text = _escape_lake(text)
    return f"coalesce({text}, {spark_literal(NULL_TEXT)})"


def source_row(columns: Sequence[CanonColumn]) -> sql.Composable:
    """The columns' texts joined by the separator (``||``: no argument limit)."""
    if not columns:
        raise ValueError("a row needs at least one column")
    return sql.SQL(" || ',' || ").join([source_column(column) for column in columns])


def lake_row(columns: Sequence[CanonColumn], absent: frozenset[str] = frozenset()) -> str:
    """The Spark twin of :func:`source_row`; columns named in ``absent`` (missing from
    the lake, or of another type) print :data:`ABSENT_TEXT`."""
    if not columns:
        raise ValueError("a row needs at least one column")
    texts = [
        spark_literal(ABSENT_TEXT) if column.name in absent else lake_column(column)
        for column in columns
    ]
    return texts[0] if len(texts) == 1 else f"concat_ws(',', {', '.join(texts)})"


# --- hashes --------------------------------------------------------------------------
#
# h = md5 of the UTF-8 row text (hex). A row contributes the first 15 hex digits of h
# (a 60-bit integer) to its bucket's sum; the bucket is the first 8 hex digits of the
# md5 of the key text, modulo the number of buckets.


def source_md5(text: sql.Composable) -> sql.Composable:
    return _q("md5(convert_to({t}, 'UTF8'))", t=text)


def source_bucket(key_md5: sql.Composable, buckets: int) -> sql.Composable:
    return _q(
        # mod(), not %: psycopg reads % in a query with parameters as a placeholder.
        "mod(('x' || substr({h}, 1, 8))::bit(32)::int8, {n})",
        h=key_md5,
        n=sql.Literal(buckets),
    )


def source_value60(row_md5: sql.Composable) -> sql.Composable:
    return _q("('x' || substr({h}, 1, 15))::bit(60)::int8", h=row_md5)


def lake_md5(text: str) -> str:
    return f"md5({text})"


def lake_bucket(key_md5: str, buckets: int) -> str:
    return f"pmod(cast(conv(substr({key_md5}, 1, 8), 16, 10) as bigint), {int(buckets)})"


def lake_value60(row_md5: str) -> str:
    return f"cast(conv(substr({row_md5}, 1, 15), 16, 10) as bigint)"
