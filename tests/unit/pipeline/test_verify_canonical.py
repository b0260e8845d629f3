"""The canonical expressions verify emits for each side (pipeline.verify.canonical).

These pin the text; tests/integration/test_verify.py proves that both sides print the
same string for every type against a real PostgreSQL and Spark."""

from __future__ import annotations

import pytest
from psycopg import sql

from pipeline.verify.canonical import (
    ABSENT_TEXT,
    CanonColumn,
    lake_bucket,
    lake_column,
    lake_row,
    lake_value60,
    source_bucket,
    source_column,
    source_row,
    source_value60,
    spark_identifier,
    spark_literal,
)
from schemas import column_type as ct
from schemas.column_type import ColumnType


def pg(composable: object) -> str:
    """The SQL text, with runs of spaces folded (psycopg pads E'' literals)."""
    text: str = composable.as_string(None)  # type: ignore[attr-defined]
    return " ".join(text.split())


def test_spark_literals_and_identifiers_escape() -> None:
    assert spark_literal("a'b\\c") == "'a\\'b\\\\c'"
    assert spark_identifier("we`ird") == "`we``ird`"


def test_integers_print_as_decimal_text() -> None:
    column = CanonColumn("n", ct.LONG)
    assert pg(source_column(column)) == """coalesce(("_t"."n")::text, E'\\\\N')"""
    assert lake_column(column) == "coalesce(cast(`n` as string), '\\\\N')"


def test_doubles_print_their_ieee_bits_with_one_nan() -> None:
    column = CanonColumn("d", ct.DOUBLE)
    text = pg(source_column(column))
    assert 'float8send("_t"."d")' in text
    assert "::bit(64)::int8" in text
    assert "WHEN \"_t\".\"d\" = 'NaN' THEN 'NaN'" in text
    lake = lake_column(column)
    assert "reflect('java.lang.Double', 'doubleToLongBits', `d`)" in lake
    assert "WHEN `d` IS NULL THEN NULL WHEN isnan(`d`) THEN 'NaN'" in lake


def test_reals_use_32_bits() -> None:
    column = CanonColumn("r", ct.FLOAT)
    assert "float4send" in pg(source_column(column))
    assert "::bit(32)::int4" in pg(source_column(column))
    assert "floatToIntBits" in lake_column(column)


def test_text_form_columns_print_through_their_output_function_and_are_escaped() -> None:
    column = CanonColumn("c", ct.STRING, output_function=("pg_catalog", "bpcharout"))
    assert pg(source_column(column)) == (
        """coalesce(replace(replace("pg_catalog"."bpcharout"("_t"."c")::text, E'\\\\', """
        """E'\\\\\\\\'), ',', E'\\\\,'), E'\\\\N')"""
    )
    assert lake_column(column) == (
        "coalesce(replace(replace(`c`, '\\\\', '\\\\\\\\'), ',', '\\\\,'), '\\\\N')"
    )


def test_a_text_form_column_without_its_output_function_is_refused() -> None:
    with pytest.raises(ValueError, match="output function"):
        source_column(CanonColumn("c", ct.STRING))


@pytest.mark.parametrize(
    ("column_type", "source_part", "lake_part"),
    [
        (ct.DATE, '("_t"."v" - DATE \'1970-01-01\')::text', "unix_date(`v`)"),
        (ct.DATE, "'2147483647'", "unix_date(`v`)"),
        (ct.TIMESTAMP_MICROS, "'9223372036854775807'", "unix_micros(`v`)"),
        (
            ct.LOCAL_TIMESTAMP_MICROS,
            '(EXTRACT(EPOCH FROM "_t"."v") * 1000000)::int8::text',
            "unix_micros(cast(`v` as timestamp))",
        ),
        (ct.TIME_MICROS, "EXTRACT(EPOCH FROM", "cast(`v` as string)"),
        (ct.BYTES, 'encode("_t"."v", \'hex\')', "lower(hex(`v`))"),
        (ColumnType.decimal(38, 10), '("_t"."v")::text', "cast(`v` as string)"),
        (ct.BOOLEAN, '("_t"."v")::text', "cast(`v` as string)"),
        (ct.UUID, '("_t"."v")::text', "coalesce(`v`, '\\\\N')"),
    ],
)
def test_scalar_forms(column_type: ColumnType, source_part: str, lake_part: str) -> None:
    column = CanonColumn("v", column_type)
    assert source_part in pg(source_column(column))
    assert lake_part in lake_column(column)


def test_two_dimensional_arrays_print_their_shape_and_elements() -> None:
    column = CanonColumn("a", ColumnType.array(ColumnType.array(ct.INT)))
    source = pg(source_column(column))
    assert 'cardinality("_t"."a") = 0 THEN \'0():\'' in source
    assert 'array_fill(array_length("_t"."a", 2)::text, ARRAY[array_length("_t"."a", 1)])' in source
    assert 'FROM unnest("_t"."a") WITH ORDINALITY AS "u"("e", "o")' in source
    lake = lake_column(column)
    assert "transform(flatten(`a`), _verify_e -> coalesce(cast(_verify_e as string)" in lake
    assert "transform(`a`, _verify_a2 -> cast(size(_verify_a2) as string))" in lake


def test_one_dimensional_arrays_escape_string_elements() -> None:
    column = CanonColumn(
        "a", ColumnType.array(ct.STRING), output_function=("pg_catalog", "textout")
    )
    source = pg(source_column(column))
    assert 'cardinality("_t"."a") = 0 THEN \'0:\'' in source
    assert 'replace(replace("pg_catalog"."textout"("u"."e")::text' in source
    assert "replace(replace(_verify_e," in lake_column(column)


def test_rows_join_columns_and_mark_absent_lake_columns() -> None:
    columns = [CanonColumn("id", ct.INT), CanonColumn("n", ct.LONG)]
    assert pg(source_row(columns)).count(" || ',' || ") == 1
    assert lake_row(columns).startswith("concat_ws(',', coalesce(cast(`id` as string)")
    assert lake_row(columns, frozenset({"n"})).endswith(spark_literal(ABSENT_TEXT) + ")")
    assert lake_row(columns[:1]) == lake_column(columns[0])
    with pytest.raises(ValueError, match="at least one column"):
        lake_row([])


def test_hash_parts_agree_in_width() -> None:
    assert pg(source_bucket(_md5(), 7)) == ("mod(('x' || substr(h, 1, 8))::bit(32)::int8, 7)")
    assert lake_bucket("h", 7) == "pmod(cast(conv(substr(h, 1, 8), 16, 10) as bigint), 7)"
    assert pg(source_value60(_md5())) == "('x' || substr(h, 1, 15))::bit(60)::int8"
    assert lake_value60("h") == "cast(conv(substr(h, 1, 15), 16, 10) as bigint)"


def _md5() -> sql.Composable:
    return sql.SQL("h")
