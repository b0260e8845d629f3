"""The type round trip's cases: one column per mapped PostgreSQL type with edge values, and
how a decoded value is compared with what PostgreSQL returns for it (:class:`Check`).

``tests/integration/test_type_roundtrip.py`` explains each check and holds the cases to a
live pgoutput stream; the lake readers (``test_lake_readers.py``) and the Confluent
registry test (``test_registry_confluent.py``) use the same table and comparisons.
"""

from __future__ import annotations

import enum
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from schemas import column_type as ct
from schemas.column_type import ColumnType
from schemas.reader import UnrepresentableTemporal

Connection = psycopg.Connection[tuple[Any, ...]]


class Check(enum.Enum):
    NATIVE = "native"
    FLOAT4 = "float4"
    FLOAT8 = "float8"
    DECIMAL = "decimal"
    TEXT = "text"
    TEXT_ARRAY = "text array"
    DATE = "date"
    TIME = "time"
    TIMESTAMP = "timestamp"
    JSON_ARRAYS = "json arrays"


@dataclass(frozen=True)
class Case:
    column: str
    sql_type: str
    values: tuple[str, ...]
    """SQL expressions, one per row; the rows after the last are NULL."""
    column_type: ColumnType
    check: Check
    native: str = "{c}"
    """What psycopg loads for NATIVE and DECIMAL, as SQL over the column ``{c}``."""


DEC_10_2 = ColumnType.decimal(10, 2)

CASES: tuple[Case, ...] = (
    Case("b", "boolean", ("true", "false"), ct.BOOLEAN, Check.NATIVE),
    Case("i2", "int2", ("0", "-32768", "32767"), ct.INT, Check.NATIVE),
    Case("i4", "int4", ("1", "-2147483648", "2147483647", "-1"), ct.INT, Check.NATIVE),
    Case(
        "i8",
        "int8",
        ("0", "-9223372036854775808", "9223372036854775807"),
        ct.LONG,
        Check.NATIVE,
    ),
    Case("o", "oid", ("0", "1", "4294967295"), ct.LONG, Check.NATIVE),
    Case(
        "f4",
        "float4",
        ("1.1", "-3.4028235e38", "'NaN'", "'-Infinity'", "1e-45"),
        ct.FLOAT,
        Check.FLOAT4,
    ),
    Case(
        "f8",
        "float8",
        ("0.1", "'-0'", "'NaN'", "'Infinity'", "5e-324"),
        ct.DOUBLE,
        Check.FLOAT8,
    ),
    Case(
        "n10_2",
        "numeric(10,2)",
        ("0", "-0.5", "12345678.9", "-99999999.99", "1.005"),
        DEC_10_2,
        Check.DECIMAL,
    ),
    Case(
        "n38",
        "numeric(38,0)",
        ("99999999999999999999999999999999999999", "-99999999999999999999999999999999999999"),
        ColumnType.decimal(38, 0),
        Check.DECIMAL,
    ),
    Case(
        "n40_5",
        "numeric(40,5)",
        ("12345678901234567890123456789012345.12345", "'NaN'", "-1.5", "0.00001"),
        ct.STRING,
        Check.TEXT,
    ),
    Case(
        "n",
        "numeric",
        ("'NaN'", "'Infinity'", "'-Infinity'", "1.50", "-0.000001"),
        ct.STRING,
        Check.TEXT,
    ),
    Case("price", "price", ("12.34", "-0.01", "99999999.99"), DEC_10_2, Check.DECIMAL),
    Case(
        "t",
        "text",
        ("'plain'", "''", "'é ∑ 𝄞'", "E'tab\\there \"q\" \\\\'", "'NULL'"),
        ct.STRING,
        Check.NATIVE,
    ),
    Case("vc", "varchar(10)", ("'ab'", "' x '"), ct.STRING, Check.NATIVE),
    Case("bp", "char(5)", ("'ab'", "'abcde'"), ct.STRING, Check.NATIVE),
    Case("nm", "name", ("'pg_class'",), ct.STRING, Check.NATIVE),
    Case("ch", '"char"', ("'x'",), ct.STRING, Check.NATIVE),
    Case("by", "bytea", ("'\\x'", "'\\x00ff10'", "'ab\\000'::bytea"), ct.BYTES, Check.NATIVE),
    Case(
        "d",
        "date",
        ("'2024-02-29'", "'0044-03-15 BC'", "'infinity'", "'-infinity'", "'5874897-12-31'"),
        ct.DATE,
        Check.DATE,
    ),
    Case(
        "tm",
        "time",
        ("'00:00:00'", "'24:00:00'", "'12:34:56.123456'", "'23:59:59.999999'"),
        ct.TIME_MICROS,
        Check.TIME,
    ),
    Case("ttz", "timetz", ("'12:34:56+05:30'", "'00:00:00-01'"), ct.STRING, Check.TEXT),
    Case(
        "ts",
        "timestamp",
        (
            "'2024-02-29 12:34:56.123456'",
            "'0044-03-15 12:00:00 BC'",
            "'infinity'",
            "'-infinity'",
            "'10000-01-01 00:00:00'",
            "'1969-12-31 23:59:59.999999'",
        ),
        ct.LOCAL_TIMESTAMP_MICROS,
        Check.TIMESTAMP,
    ),
    Case(
        "tstz",
        "timestamptz",
        (
            "'2024-02-29 12:34:56.123456+05:30'",
            "'0044-03-15 12:00:00+00 BC'",
            "'infinity'",
            "'-infinity'",
            "'294247-01-10 04:00:54.775806+00'",
            "'1969-12-31 23:59:59.999999+00'",
        ),
        ct.TIMESTAMP_MICROS,
        Check.TIMESTAMP,
    ),
    Case(
        "itv",
        "interval",
        ("'1 year 2 mons 3 days 04:05:06.7'", "'-1 day'", "'0'"),
        ct.STRING,
        Check.TEXT,
    ),
    Case(
        "u",
        "uuid",
        ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-000000000000'"),
        ct.UUID,
        Check.NATIVE,
    ),
    Case("js", "json", ("'{\"a\": [1, 2.50]}'", "'\"x\"'"), ct.STRING, Check.TEXT),
    Case("jb", "jsonb", ('\'{"b": 1, "a": [1, 2.50]}\'', "'null'"), ct.STRING, Check.TEXT),
    Case("x", "xml", ("'<a>1</a>'",), ct.STRING, Check.TEXT),
    Case("e", "mood", ("'happy'", "'so-so'"), ct.STRING, Check.TEXT),
    Case("ip", "inet", ("'192.168.0.1/24'", "'::1'"), ct.STRING, Check.TEXT),
    Case("net", "cidr", ("'10.0.0.0/8'",), ct.STRING, Check.TEXT),
    Case("mac", "macaddr", ("'08:00:2b:01:02:03'",), ct.STRING, Check.TEXT),
    Case("mac8", "macaddr8", ("'08:00:2b:01:02:03:04:05'",), ct.STRING, Check.TEXT),
    Case("m", "money", ("12.5", "-1234.5"), ct.STRING, Check.TEXT),
    Case("comp", "pair", ("'(1,\"a b\")'", "ROW(NULL, 'x')"), ct.STRING, Check.TEXT),
    Case("rng", "int4range", ("'[1,10)'", "'empty'"), ct.STRING, Check.TEXT),
    Case("mrng", "int4multirange", ("'{[1,3),[5,7)}'",), ct.STRING, Check.TEXT),
    Case("hs", "hstore", ('\'a=>1, b=>NULL, "c d"=>"\\""\'',), ct.STRING, Check.TEXT),
    Case(
        "ia",
        "int4[]",
        ("'{1,NULL,3}'", "'{}'", "'[0:1]={1,2}'", "'{NULL}'"),
        ColumnType.array(ct.INT),
        Check.NATIVE,
    ),
    Case(
        "ta",
        "text[]",
        (
            "ARRAY['a b', 'NULL', NULL, 'x\"y\\z', '', ' lead', '{}', 'a,b']",
            "'{}'",
            "ARRAY['é', 'plain']",
        ),
        ColumnType.array(ct.STRING),
        Check.NATIVE,
    ),
    Case(
        "ia2",
        "int4[][]",
        ("'{{1,2},{3,NULL}}'", "'{}'", "'[0:1][1:2]={{1,2},{3,4}}'"),
        ColumnType.array(ColumnType.array(ct.INT)),
        Check.NATIVE,
    ),
    Case(
        "na",
        "numeric(10,2)[]",
        ("'{1.5,NULL,-2}'",),
        ColumnType.array(DEC_10_2),
        Check.NATIVE,
    ),
    Case(
        "bya",
        "bytea[]",
        ("ARRAY['\\x0102'::bytea, NULL, '\\x'::bytea]",),
        ColumnType.array(ct.BYTES),
        Check.NATIVE,
    ),
    Case("ba", "boolean[]", ("'{t,f,NULL}'",), ColumnType.array(ct.BOOLEAN), Check.NATIVE),
    Case(
        "tza",
        "timestamptz[]",
        ("ARRAY['2024-02-29 12:00:00.5+00'::timestamptz, NULL]",),
        ColumnType.array(ct.TIMESTAMP_MICROS),
        Check.NATIVE,
    ),
    Case(
        "da",
        "date[]",
        ("ARRAY['2024-02-29'::date, NULL, '1970-01-01']",),
        ColumnType.array(ct.DATE),
        Check.NATIVE,
    ),
    Case(
        "ua",
        "uuid[]",
        ("ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, NULL]",),
        ColumnType.array(ct.UUID),
        Check.NATIVE,
    ),
    Case(
        "ita",
        "interval[]",
        ("ARRAY['P1D'::interval, NULL, '-1 year 2 mons']",),
        ColumnType.array(ct.STRING),
        Check.TEXT_ARRAY,
    ),
    Case(
        "compa",
        "pair[]",
        ("ARRAY['(1,\"a b\")'::pair, NULL, ROW(2, 'q\"')::pair]",),
        ColumnType.array(ct.STRING),
        Check.TEXT_ARRAY,
    ),
    Case(
        "jba",
        "jsonb[]",
        ("ARRAY['{\"a\": [1, 2]}'::jsonb, 'null', NULL]",),
        ColumnType.array(ct.STRING),
        Check.TEXT_ARRAY,
    ),
    Case(
        "bxa",
        "box[]",
        ("ARRAY['(1,2),(3,4)'::box, '(0,0),(1,1)']",),
        ColumnType.array(ct.STRING),
        Check.TEXT_ARRAY,
    ),
    Case(
        "pa",
        "price[]",
        ("ARRAY[1.5, NULL, -2]::price[]",),
        ColumnType.array(DEC_10_2),
        Check.NATIVE,
        native="{c}::numeric(10,2)[]",
    ),
    Case(
        "ints",
        "ints",
        ("'{1,NULL,3}'", "'{}'"),
        ColumnType.array(ct.INT),
        Check.NATIVE,
        native="{c}::int4[]",
    ),
    Case(
        "intsa",
        "ints[]",
        ('\'{"{1,2}","{3}",NULL,"{}"}\'',),
        ColumnType.array(ColumnType.array(ct.INT)),
        Check.JSON_ARRAYS,
    ),
)
ROWS = max(len(case.values) for case in CASES) + 1  # the last row is NULL throughout

# What PostgreSQL computes for a temporal value: (psycopg-loadable value or NULL, the
# contract's integer or NULL when infinite). Years 0001-01-02..9999-12-30 load as
# datetime whatever the connection's time zone.
TEMPORAL_SQL: dict[Check, tuple[str, str]] = {
    Check.DATE: (
        "CASE WHEN isfinite({c}) AND {c} BETWEEN '0001-01-01' AND '9999-12-31' THEN {c} END",
        "CASE WHEN isfinite({c}) THEN {c} - DATE '1970-01-01' END",
    ),
    Check.TIME: (
        "CASE WHEN {c} < '24:00:00' THEN {c} END",
        "(extract(epoch FROM {c}) * 1000000)::int8",
    ),
    Check.TIMESTAMP: (
        "CASE WHEN isfinite({c}) AND {c} BETWEEN '0001-01-02' AND '9999-12-30' THEN {c} END",
        "CASE WHEN isfinite({c}) THEN (extract(epoch FROM {c}) * 1000000)::int8 END",
    ),
}
SENTINELS: dict[str, dict[str, int]] = {
    "date": {"infinity": ct.DATE_POSITIVE_INFINITY, "-infinity": ct.DATE_NEGATIVE_INFINITY},
    "timestamp": {
        "infinity": ct.TIMESTAMP_POSITIVE_INFINITY,
        "-infinity": ct.TIMESTAMP_NEGATIVE_INFINITY,
    },
}


def create_table(pg: Connection, table: sql.Composable, cases: Sequence[Case] = CASES) -> None:
    pg.execute("CREATE TYPE mood AS ENUM ('sad', 'so-so', 'happy')")
    pg.execute("CREATE TYPE pair AS (n int4, label text)")
    pg.execute("CREATE DOMAIN price AS numeric(10,2)")
    pg.execute("CREATE DOMAIN ints AS int4[]")
    columns = [sql.SQL("id int4 PRIMARY KEY")] + [
        sql.SQL("{} {}").format(sql.Identifier(case.column), sql.SQL(case.sql_type))
        for case in cases
    ]
    pg.execute(sql.SQL("CREATE TABLE {} ({})").format(table, sql.SQL(", ").join(columns)))


def insert_rows(pg: Connection, table: sql.Composable, cases: Sequence[Case] = CASES) -> None:
    names = sql.SQL(", ").join(
        [sql.Identifier("id")] + [sql.Identifier(case.column) for case in cases]
    )
    rows = []
    for row in range(ROWS):
        values = [sql.Literal(row)] + [
            sql.SQL(case.values[row] if row < len(case.values) else "NULL") for case in cases
        ]
        rows.append(sql.SQL("({})").format(sql.SQL(", ").join(values)))
    pg.execute(
        sql.SQL("INSERT INTO {} ({}) VALUES {}").format(table, names, sql.SQL(", ").join(rows))
    )


def _column_sql(template: str, column: str) -> sql.Composable:
    return sql.SQL(template).format(c=sql.Identifier(column))


def _select(conn: Connection, table: sql.Composable, expression: sql.Composable) -> list[Any]:
    rows = conn.execute(
        sql.SQL("SELECT {} FROM {} ORDER BY id").format(expression, table)
    ).fetchall()
    return [row[0] for row in rows]


def _select_output_text(conn: Connection, table: sql.Composable, column: str) -> list[Any]:
    """The column's values as the text the server sent, before psycopg loads them."""
    cursor = conn.execute(
        sql.SQL("SELECT {} FROM {} ORDER BY id").format(sql.Identifier(column), table)
    )
    result = cursor.pgresult
    assert result is not None
    assert result.fformat(0) == psycopg.pq.Format.TEXT
    texts: list[str | None] = []
    for row in range(result.ntuples):
        raw = result.get_value(row, 0)
        texts.append(None if raw is None else bytes(raw).decode())
    return texts


def _same_float(decoded: Any, expected: Any, fmt: str) -> bool:
    if decoded is None or expected is None:
        return decoded is expected
    if math.isnan(expected):
        return math.isnan(decoded)
    return struct.pack(fmt, decoded) == struct.pack(fmt, expected)


def _same_decimal(decoded: Any, expected: Any) -> bool:
    if decoded is None or expected is None:
        return decoded is expected
    assert isinstance(decoded, Decimal)
    return bool(decoded == expected) and (
        decoded.as_tuple().exponent == expected.as_tuple().exponent
    )


def _same_temporal(decoded: Any, native: Any, number: Any, text: str | None, kind: str) -> bool:
    if text is None:
        return decoded is None
    if text in ("infinity", "-infinity"):
        return (
            isinstance(decoded, UnrepresentableTemporal)
            and decoded.value == SENTINELS[kind][text]
            and decoded.infinity == (1 if text == "infinity" else -1)
        )
    if isinstance(decoded, UnrepresentableTemporal):
        return native is None and decoded.value == number
    return native is not None and bool(decoded == native)


def expected_values(
    case: Case, pg: Connection, session: Connection, table: sql.Composable
) -> list[Any]:
    """What PostgreSQL returns for the column, per row, in the form the check compares."""
    column = case.column
    if case.check is Check.TEXT:
        return _select_output_text(session, table, column)
    if case.check is Check.TEXT_ARRAY:
        return _select(session, table, _column_sql("{c}::text[]", column))
    if case.check is Check.JSON_ARRAYS:
        texts = _select(
            pg,
            table,
            _column_sql(
                "(SELECT array_agg(array_to_json(e::int4[])::text ORDER BY n) "
                "FROM unnest({c}) WITH ORDINALITY AS u(e, n))",
                column,
            ),
        )
        return [
            None if items is None else [None if e is None else json.loads(e) for e in items]
            for items in texts
        ]
    if case.check in TEMPORAL_SQL:
        native_sql, number_sql = TEMPORAL_SQL[case.check]
        return list(
            zip(
                _select(pg, table, _column_sql(native_sql, column)),
                _select(pg, table, _column_sql(number_sql, column)),
                _select_output_text(session, table, column),
                strict=True,
            )
        )
    return _select(pg, table, _column_sql(case.native, column))


def agrees(case: Case, decoded: Any, expected: Any) -> bool:
    check = case.check
    if check is Check.FLOAT4:
        return _same_float(decoded, expected, "<f")
    if check is Check.FLOAT8:
        return _same_float(decoded, expected, "<d")
    if check is Check.DECIMAL:
        return _same_decimal(decoded, expected)
    if check in TEMPORAL_SQL:
        native, number, text = expected
        kind = "date" if check is Check.DATE else "timestamp"
        return _same_temporal(decoded, native, number, text, kind)
    return bool(decoded == expected)
