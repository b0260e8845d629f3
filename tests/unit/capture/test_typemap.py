"""The PostgreSQL -> contract type mapping and its text parsers.

Expected numbers are facts PostgreSQL reports for the same text (``'0044-03-15 BC'::date
- DATE '1970-01-01'`` is -735160, ``extract(epoch ...)`` for timestamps) or follow from
a definition (Julian day 0 is 4714-11-24 BC; 2**63 - 1 µs after 1970 is
294247-01-10 04:00:54.775807). tests/integration/test_type_roundtrip.py checks the whole
path against a live server.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from datetime import date
from decimal import Context, Decimal
from typing import Any

import pytest

from capture.errors import ConfigError, TableError
from capture.rows.type_catalog import PgType, TypType
from capture.rows.typemap import (
    SESSION_SETTINGS,
    ColumnMapping,
    libpq_options,
    map_column,
    numeric_precision_scale,
)
from schemas import column_type as ct
from schemas.column_type import AvroKind, ColumnType

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, XML, FLOAT4, FLOAT8, MONEY, BPCHAR, VARCHAR = 114, 142, 700, 701, 790, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1082, 1083, 1114, 1184, 1186, 1266
NUMERIC, UUID, JSONB, BOX = 1700, 2950, 3802, 603
INT4_ARRAY, TEXT_ARRAY, BOX_ARRAY, NUMERIC_ARRAY = 1007, 1009, 1020, 1231
BYTEA_ARRAY, DATE_ARRAY, TIMESTAMPTZ_ARRAY, BOOL_ARRAY = 1001, 1182, 1185, 1000

# User-defined types get OIDs from 16384 on.
PRICE, PRICE_ALIAS, MOOD, PAIR, SPAN, SPANS, HSTORE, INTS, INTS_ARRAY = range(16384, 16393)
PRICE_ARRAY, UNKNOWN_BASE_ARRAY = 16393, 16394
WIDE = Context(prec=100)


def _typmod(precision: int, scale: int) -> int:
    """PostgreSQL's numeric type modifier (the scale is 11-bit signed since version 15)."""
    return ((precision << 16) | (scale & 0x7FF)) + 4


def _array(oid: int, name: str, element: int) -> PgType:
    return PgType(oid, "pg_catalog", name, TypType.BASE, element_oid=element)


CATALOG: dict[int, PgType] = {
    t.oid: t
    for t in (
        _array(INT4_ARRAY, "_int4", INT4),
        _array(TEXT_ARRAY, "_text", TEXT),
        _array(BOX_ARRAY, "_box", BOX),
        _array(NUMERIC_ARRAY, "_numeric", NUMERIC),
        _array(BYTEA_ARRAY, "_bytea", BYTEA),
        _array(DATE_ARRAY, "_date", DATE),
        _array(TIMESTAMPTZ_ARRAY, "_timestamptz", TIMESTAMPTZ),
        _array(BOOL_ARRAY, "_bool", BOOL),
        PgType(BOX, "pg_catalog", "box", TypType.BASE, delimiter=";"),
        PgType(
            PRICE, "public", "price", TypType.DOMAIN, base_oid=NUMERIC, base_typmod=_typmod(10, 2)
        ),
        PgType(PRICE_ALIAS, "shop", "price alias", TypType.DOMAIN, base_oid=PRICE),
        PgType(MOOD, "public", "mood", TypType.ENUM),
        PgType(PAIR, "public", "pair", TypType.COMPOSITE),
        PgType(SPAN, "public", "span", TypType.RANGE),
        PgType(SPANS, "public", "span_multirange", TypType.MULTIRANGE),
        PgType(HSTORE, "public", "hstore", TypType.BASE),
        PgType(INTS, "public", "ints", TypType.DOMAIN, base_oid=INT4_ARRAY),
        PgType(INTS_ARRAY, "public", "_ints", TypType.BASE, element_oid=INTS),
        PgType(PRICE_ARRAY, "public", "_price", TypType.BASE, element_oid=PRICE),
        PgType(UNKNOWN_BASE_ARRAY, "public", "_hstore", TypType.BASE, element_oid=HSTORE),
    )
}


def mapping(
    oid: int, typmod: int = -1, types: Mapping[int, PgType] = CATALOG, **options: Any
) -> ColumnMapping:
    return map_column(oid, typmod, types, table="public.t", column="c", **options)


def parse(oid: int, text: bytes, typmod: int = -1, **options: Any) -> Any:
    return mapping(oid, typmod, **options).parse(text)


def unscaled(value: bytes) -> int:
    return int.from_bytes(value, "big", signed=True)


# --- session settings ------------------------------------------------------------------


def test_session_settings_fix_every_text_form_the_parsers_rely_on() -> None:
    assert SESSION_SETTINGS == {
        "DateStyle": "ISO",
        "TimeZone": "UTC",
        "IntervalStyle": "iso_8601",
        "extra_float_digits": "3",
        "bytea_output": "hex",
        "client_encoding": "UTF8",
        "lc_monetary": "C",
        "search_path": "pg_catalog",
    }


def test_libpq_options_sets_each_setting_and_escapes_spaces_and_backslashes() -> None:
    assert libpq_options({"DateStyle": "ISO", "TimeZone": "UTC"}) == (
        "-c DateStyle=ISO -c TimeZone=UTC"
    )
    assert libpq_options({"application_name": "a b\\c"}) == r"-c application_name=a\ b\\c"
    assert libpq_options().count("-c ") == len(SESSION_SETTINGS)


# --- mapping decisions -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("oid", "kind", "name"),
    [
        (BOOL, AvroKind.BOOLEAN, "bool"),
        (INT2, AvroKind.INT, "int2"),
        (INT4, AvroKind.INT, "int4"),
        (INT8, AvroKind.LONG, "int8"),
        (OID, AvroKind.LONG, "oid"),
        (FLOAT4, AvroKind.FLOAT, "float4"),
        (FLOAT8, AvroKind.DOUBLE, "float8"),
        (TEXT, AvroKind.STRING, "text"),
        (VARCHAR, AvroKind.STRING, "varchar"),
        (BPCHAR, AvroKind.STRING, "bpchar"),
        (NAME, AvroKind.STRING, "name"),
        (CHAR, AvroKind.STRING, '"char"'),
        (BYTEA, AvroKind.BYTES, "bytea"),
        (DATE, AvroKind.DATE, "date"),
        (TIME, AvroKind.TIME_MICROS, "time"),
        (TIMETZ, AvroKind.STRING, "timetz"),
        (TIMESTAMP, AvroKind.LOCAL_TIMESTAMP_MICROS, "timestamp"),
        (TIMESTAMPTZ, AvroKind.TIMESTAMP_MICROS, "timestamptz"),
        (INTERVAL, AvroKind.STRING, "interval"),
        (UUID, AvroKind.UUID, "uuid"),
        (JSON, AvroKind.STRING, "json"),
        (JSONB, AvroKind.STRING, "jsonb"),
        (XML, AvroKind.STRING, "xml"),
        (MONEY, AvroKind.STRING, "money"),
        (869, AvroKind.STRING, "inet"),
        (650, AvroKind.STRING, "cidr"),
        (829, AvroKind.STRING, "macaddr"),
        (774, AvroKind.STRING, "macaddr8"),
    ],
)
def test_built_in_scalars_map_by_oid_without_a_catalog(oid: int, kind: AvroKind, name: str) -> None:
    mapped = mapping(oid, types={})
    assert mapped.column_type == ColumnType(kind)
    assert mapped.pg_type_name == name


@pytest.mark.parametrize(
    ("precision", "scale", "expected"),
    [
        (1, 0, ColumnType.decimal(1, 0)),
        (10, 2, ColumnType.decimal(10, 2)),
        (38, 0, ColumnType.decimal(38, 0)),
        (38, 38, ColumnType.decimal(38, 38)),
        (39, 2, ct.STRING),
        (1000, 0, ct.STRING),
        (5, -2, ct.STRING),  # PostgreSQL 15+: rounds to hundreds; Avro has no negative scale
        (3, 5, ct.STRING),  # PostgreSQL 15+: scale above precision
    ],
)
def test_numeric_is_decimal_only_within_sparks_38_digits(
    precision: int, scale: int, expected: ColumnType
) -> None:
    mapped = mapping(NUMERIC, _typmod(precision, scale), types={})
    assert mapped.column_type == expected
    assert mapped.pg_type_name == f"numeric({precision},{scale})"


def test_unconstrained_numeric_is_its_text_form() -> None:
    mapped = mapping(NUMERIC, -1, types={})
    assert mapped.column_type == ct.STRING
    assert mapped.pg_type_name == "numeric"
    assert [mapped.parse(v) for v in (b"NaN", b"-Infinity", b"1.50")] == [
        "NaN",
        "-Infinity",
        "1.50",
    ]


def test_numeric_typmod_decodes_like_postgresql() -> None:
    assert numeric_precision_scale(-1) is None
    assert numeric_precision_scale(655366) == (10, 2)  # atttypmod of numeric(10,2)
    assert numeric_precision_scale(_typmod(5, -2)) == (5, -2)
    assert numeric_precision_scale(_typmod(1000, 1000)) == (1000, 1000)


def test_domain_takes_its_base_mapping_with_the_domains_typmod() -> None:
    mapped = mapping(PRICE)
    assert mapped.column_type == ColumnType.decimal(10, 2)
    assert mapped.pg_type_name == "public.price"
    assert unscaled(mapped.parse(b"12.34")) == 1234


def test_domain_over_a_domain_follows_the_chain() -> None:
    mapped = mapping(PRICE_ALIAS)
    assert mapped.column_type == ColumnType.decimal(10, 2)
    assert mapped.pg_type_name == "shop.price alias"


def test_a_column_typmod_wins_over_the_domains() -> None:
    assert mapping(PRICE, _typmod(12, 4)).column_type == ColumnType.decimal(12, 4)


def test_domain_over_an_array_is_an_array() -> None:
    mapped = mapping(INTS)
    assert mapped.column_type == ColumnType.array(ct.INT)
    assert mapped.parse(b"{1,NULL}") == [1, None]


@pytest.mark.parametrize(
    ("oid", "text", "name"),
    [
        (MOOD, b"happy", "public.mood"),
        (PAIR, b'(1,"a b",)', "public.pair"),
        (SPAN, b"[1,10)", "public.span"),
        (SPANS, b"{[1,3),[5,7)}", "public.span_multirange"),
        (HSTORE, b'"a"=>"1", "b"=>NULL', "public.hstore"),
        (BOX, b"(3,4),(1,2)", "box"),
    ],
)
def test_other_types_are_their_text_form(oid: int, text: bytes, name: str) -> None:
    mapped = mapping(oid)
    assert mapped.column_type == ct.STRING
    assert mapped.pg_type_name == name
    assert mapped.parse(text) == text.decode()


def test_a_type_missing_from_the_catalog_is_a_table_error_naming_the_oid() -> None:
    with pytest.raises(TableError, match=r"table public\.t: column c uses type oid 99999") as info:
        mapping(99999)
    assert "load_types" in str(info.value)
    # A domain whose base type was not loaded.
    with pytest.raises(TableError, match=f"uses type oid {PRICE}, "):
        mapping(PRICE_ALIAS, types={PRICE_ALIAS: CATALOG[PRICE_ALIAS]})


def test_arrays_map_to_array_of_the_element_type() -> None:
    assert mapping(INT4_ARRAY).column_type == ColumnType.array(ct.INT)
    assert mapping(INT4_ARRAY).pg_type_name == "int4[]"
    assert mapping(UNKNOWN_BASE_ARRAY).column_type == ColumnType.array(ct.STRING)
    numeric = mapping(NUMERIC_ARRAY, _typmod(10, 2))
    assert numeric.column_type == ColumnType.array(ColumnType.decimal(10, 2))
    assert numeric.pg_type_name == "numeric(10,2)[]"
    prices = mapping(PRICE_ARRAY)
    assert prices.column_type == ColumnType.array(ColumnType.decimal(10, 2))
    assert [unscaled(v) for v in prices.parse(b"{1.00,-2.50}")] == [100, -250]


def test_declared_dimensions_nest_arrays() -> None:
    assert mapping(INT4_ARRAY, dimensions=2).column_type == ColumnType.array(
        ColumnType.array(ct.INT)
    )
    assert mapping(INT4_ARRAY, dimensions=3).column_type.avro() == {
        "type": "array",
        "items": [
            "null",
            {"type": "array", "items": ["null", {"type": "array", "items": ["null", "int"]}]},
        ],
    }
    # attndims 0 (CREATE TABLE AS, a column declared as _int4) means one dimension.
    assert mapping(INT4_ARRAY, dimensions=0).column_type == ColumnType.array(ct.INT)


def test_array_of_a_domain_over_an_array_nests_one_level_more() -> None:
    mapped = mapping(INTS_ARRAY)
    assert mapped.column_type == ColumnType.array(ColumnType.array(ct.INT))
    assert mapped.parse(b'{"{1,2}","{3}",NULL,"{}"}') == [[1, 2], [3], None, []]


# --- scalar parsers ---------------------------------------------------------------------


def test_bool() -> None:
    assert parse(BOOL, b"t") is True
    assert parse(BOOL, b"f") is False


@pytest.mark.parametrize(
    ("oid", "text", "value"),
    [
        (INT2, b"-32768", -32768),
        (INT2, b"32767", 32767),
        (INT4, b"0", 0),
        (INT4, b"-1", -1),
        (INT4, b"-2147483648", -(2**31)),
        (INT4, b"2147483647", 2**31 - 1),
        (INT8, b"-9223372036854775808", -(2**63)),
        (INT8, b"9223372036854775807", 2**63 - 1),
        (OID, b"4294967295", 2**32 - 1),
    ],
)
def test_integers(oid: int, text: bytes, value: int) -> None:
    assert parse(oid, text) == value


def test_float8_special_values_are_floats() -> None:
    assert math.isnan(parse(FLOAT8, b"NaN"))
    assert parse(FLOAT8, b"Infinity") == math.inf
    assert parse(FLOAT8, b"-Infinity") == -math.inf
    negative_zero = parse(FLOAT8, b"-0")
    assert negative_zero == 0.0
    assert math.copysign(1.0, negative_zero) == -1.0
    assert parse(FLOAT8, b"0.1") == 0.1
    assert parse(FLOAT8, b"1.7976931348623157e+308") == 1.7976931348623157e308
    assert parse(FLOAT8, b"5e-324") == 5e-324


def test_float4_shortest_text_rounds_back_to_the_same_32_bit_value() -> None:
    # extra_float_digits=3 prints the shortest text that reads back exactly.
    for text, bits in [
        (b"3.4028235e+38", 0x7F7FFFFF),
        (b"1e-45", 0x00000001),
        (b"0.1", 0x3DCCCCCD),
        (b"-1.1", 0xBF8CCCCD),
    ]:
        value = parse(FLOAT4, text)
        assert struct.unpack("<I", struct.pack("<f", value))[0] == bits
    assert math.isnan(parse(FLOAT4, b"NaN"))
    assert parse(FLOAT4, b"-Infinity") == -math.inf


@pytest.mark.parametrize(
    ("precision", "scale", "text", "value"),
    [
        (10, 2, b"0.00", 0),
        (10, 2, b"-0.50", -50),
        (10, 2, b"12345678.90", 1234567890),
        (10, 2, b"-99999999.99", -9999999999),
        (10, 0, b"42", 42),
        (38, 0, b"9" * 38, 10**38 - 1),
        (38, 0, b"-" + b"9" * 38, -(10**38) + 1),
        (38, 38, b"0." + b"0" * 37 + b"1", 1),
        (10, 2, b"1.5", 150),  # a shorter fraction is rescaled
        (10, 2, b"1.500", 150),  # a longer one only when the extra digits are zeros
    ],
)
def test_decimal_is_the_unscaled_twos_complement(
    precision: int, scale: int, text: bytes, value: int
) -> None:
    raw = parse(NUMERIC, text, _typmod(precision, scale))
    assert isinstance(raw, bytes)
    assert unscaled(raw) == value
    # Minimal length: one sign bit to spare at most.
    assert len(raw) == (value.bit_length() + 8) // 8
    assert Decimal(unscaled(raw)).scaleb(-scale, WIDE) == Decimal(text.decode())


def test_decimal_refuses_to_round() -> None:
    with pytest.raises(TableError, match="more than 2 fractional digits"):
        parse(NUMERIC, b"1.505", _typmod(10, 2))


@pytest.mark.parametrize("text", [b"NaN", b"Infinity", b"-Infinity"])
def test_decimal_column_with_a_non_finite_value_is_a_table_error(text: bytes) -> None:
    with pytest.raises(TableError) as info:
        parse(NUMERIC, text, _typmod(10, 2))
    message = str(info.value)
    assert info.value.table == "public.t"
    assert message.startswith("table public.t: column c (numeric(10,2)) holds ")
    assert text.decode() in message
    assert "DECIMAL(10,2)" in message
    assert "unconstrained numeric" in message
    assert message.endswith("then run python -m capture resync public.t and restart capture")
    assert "restart the table" not in message, "no such action: the table stays errored"


def test_text_keeps_every_character_and_bpchar_padding() -> None:
    assert parse(TEXT, "é ∑ 𝄞".encode()) == "é ∑ 𝄞"
    assert parse(TEXT, b"") == ""
    assert parse(BPCHAR, b"ab   ") == "ab   "
    assert parse(VARCHAR, b" x ") == " x "
    assert parse(INTERVAL, b"P1Y2M3DT4H5M6.7S") == "P1Y2M3DT4H5M6.7S"
    assert parse(MONEY, b"-$1,234.50") == "-$1,234.50"


def test_text_that_is_not_utf8_is_a_table_error() -> None:
    with pytest.raises(TableError, match=r"column c \(text\) holds bytes that are not UTF-8"):
        parse(TEXT, b"\xe9")


def test_bytea_hex() -> None:
    assert parse(BYTEA, b"\\x") == b""
    assert parse(BYTEA, b"\\x00ff10") == b"\x00\xff\x10"


def test_bytea_in_escape_form_means_the_session_settings_are_missing() -> None:
    with pytest.raises(ConfigError, match="bytea_output=hex"):
        parse(BYTEA, b"ab")
    # The escape form of the four bytes \x41: a doubled backslash, never \x.
    with pytest.raises(ConfigError, match="bytea_output=hex"):
        parse(BYTEA, rb"\\x41")


def test_uuid_is_its_canonical_text() -> None:
    text = b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert parse(UUID, text) == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"


# --- dates, times, timestamps -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "days"),
    [
        (b"1970-01-01", 0),
        (b"1969-12-31", -1),
        (b"2000-02-29", 11016),
        (b"2024-02-29", 19782),
        (b"2100-03-01", 47541),
        (b"0001-01-01", -719162),
        (b"9999-12-31", 2932896),
        (b"10000-01-01", 2932897),
        (b"0001-12-31 BC", -719163),  # the day before 0001-01-01
        (b"0001-01-01 BC", -719528),  # 1 BC is a leap year (astronomical year 0)
        (b"0044-03-15 BC", -735160),
        (b"4714-11-24 BC", -2440588),  # Julian day 0, PostgreSQL's first date
        (b"5874897-12-31", 2145042905),  # PostgreSQL's last date
    ],
)
def test_date_is_days_since_1970(text: bytes, days: int) -> None:
    assert parse(DATE, text) == days


def test_date_fast_path_agrees_with_the_calendar() -> None:
    for day in (date(1, 1, 1), date(1582, 10, 15), date(1900, 3, 1), date(2038, 1, 19)):
        assert parse(DATE, day.isoformat().encode()) == (day - date(1970, 1, 1)).days


def test_date_infinity_is_the_contract_sentinel() -> None:
    assert parse(DATE, b"infinity") == ct.DATE_POSITIVE_INFINITY == 2**31 - 1
    assert parse(DATE, b"-infinity") == ct.DATE_NEGATIVE_INFINITY == -(2**31)


def test_date_not_in_iso_form_means_the_session_settings_are_missing() -> None:
    with pytest.raises(ConfigError, match="DateStyle=ISO"):
        parse(DATE, b"02/29/2024")
    # An empty text too (found by tests/fuzz/fuzz_row_encoder.py: it raised IndexError).
    for type_oid in (DATE, 1114, 1184):
        with pytest.raises(ConfigError, match="DateStyle=ISO"):
            parse(type_oid, b"")


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        (b"00:00:00", 0),
        (b"00:00:00.000001", 1),
        (b"12:34:56.5", 45_296_500_000),
        (b"12:34:56.123456", 45_296_123_456),
        (b"23:59:59.999999", 86_399_999_999),
        (b"24:00:00", ct.MAX_TIME_MICROS),
    ],
)
def test_time_is_micros_after_midnight(text: bytes, micros: int) -> None:
    assert parse(TIME, text) == micros


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        (b"1970-01-01 00:00:00", 0),
        (b"1969-12-31 23:59:59.999999", -1),
        (b"2024-02-29 12:34:56.123456", 1_709_210_096_123_456),
        (b"2024-02-29 12:34:56.5", 1_709_210_096_500_000),
        (b"0001-01-01 00:00:00", -62_135_596_800_000_000),
        (b"0001-12-31 23:59:59.999999 BC", -62_135_596_800_000_001),
        (b"0044-03-15 12:00:00 BC", -63_517_780_800_000_000),
        (b"10000-01-01 00:00:00", 253_402_300_800_000_000),
        (b"294247-01-10 04:00:54.775806", 2**63 - 2),
        (b"infinity", ct.TIMESTAMP_POSITIVE_INFINITY),
        (b"-infinity", ct.TIMESTAMP_NEGATIVE_INFINITY),
    ],
)
def test_timestamp_is_micros_since_1970(text: bytes, micros: int) -> None:
    assert parse(TIMESTAMP, text) == micros


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        (b"1970-01-01 00:00:00+00", 0),
        (b"2024-02-29 12:34:56.123456+00", 1_709_210_096_123_456),
        (b"2024-02-29 18:04:56.123456+05:30", 1_709_210_096_123_456),
        (b"0044-03-15 12:00:00+00 BC", -63_517_780_800_000_000),
        (b"10000-01-01 05:30:00+05:30", 253_402_300_800_000_000),
        (b"294247-01-10 04:00:54.775806+00", 2**63 - 2),
        (b"infinity", ct.TIMESTAMP_POSITIVE_INFINITY),
        (b"-infinity", ct.TIMESTAMP_NEGATIVE_INFINITY),
    ],
)
def test_timestamptz_is_the_utc_instant(text: bytes, micros: int) -> None:
    assert parse(TIMESTAMPTZ, text) == micros


@pytest.mark.parametrize(
    ("oid", "text"),
    [
        (TIMESTAMP, b"294247-01-10 04:00:54.775807"),
        (TIMESTAMP, b"294276-12-31 23:59:59.999999"),
        (TIMESTAMPTZ, b"294276-12-31 23:59:59.999999+00"),
    ],
)
def test_a_finite_timestamp_beyond_the_long_range_is_a_table_error(oid: int, text: bytes) -> None:
    with pytest.raises(TableError, match="after 294247-01-10"):
        parse(oid, text)


# --- arrays -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (b"{}", []),
        (b"{1}", [1]),
        (b"{1,-2,NULL,2147483647}", [1, -2, None, 2**31 - 1]),
        (b"{NULL}", [None]),
        (b"[0:1]={1,2}", [1, 2]),  # lower bounds are dropped
        (b"[-5:-4]={7,NULL}", [7, None]),
    ],
)
def test_int_array(text: bytes, value: list[Any]) -> None:
    assert parse(INT4_ARRAY, text) == value


def test_text_array_quotes_escapes_and_null() -> None:
    text = rb'{"a b","NULL",NULL,"x\"y\\z",""," lead","{}","a,b",plain,"\\\\"}'
    assert parse(TEXT_ARRAY, text) == [
        "a b",
        "NULL",  # quoted: the string
        None,  # bare: a null element
        'x"y\\z',
        "",
        " lead",
        "{}",
        "a,b",
        "plain",
        "\\\\",
    ]


def test_text_array_quote_after_escaped_backslash() -> None:
    # The element \" (backslash, quote) is printed as "\\\"".
    assert parse(TEXT_ARRAY, rb'{"\\\"","\"\\"}') == ['\\"', '"\\']


def test_text_array_with_non_ascii() -> None:
    assert parse(TEXT_ARRAY, '{é,"∑ x"}'.encode()) == ["é", "∑ x"]


def test_two_dimensional_array() -> None:
    assert parse(INT4_ARRAY, b"{{1,2},{3,NULL}}", dimensions=2) == [[1, 2], [3, None]]
    assert parse(INT4_ARRAY, b"[0:1][1:2]={{1,2},{3,4}}", dimensions=2) == [[1, 2], [3, 4]]
    assert parse(INT4_ARRAY, b"{}", dimensions=2) == []
    assert parse(TEXT_ARRAY, rb'{{"a,b",NULL},{"\"",x},{"{}","}{"}}', dimensions=2) == [
        ["a,b", None],
        ['"', "x"],
        ["{}", "}{"],
    ]
    assert parse(INT4_ARRAY, b"{{{1},{2}},{{3},{4}}}", dimensions=3) == [[[1], [2]], [[3], [4]]]


@pytest.mark.parametrize(
    ("text", "declared", "found"),
    [
        (b"{{1,2},{3,4}}", 1, 2),
        (b"{1,2}", 2, 1),
        (b"[0:0][0:0]={{1}}", 1, 2),
    ],
)
def test_array_with_other_dimensions_than_declared_is_a_table_error(
    text: bytes, declared: int, found: int
) -> None:
    with pytest.raises(TableError) as info:
        parse(INT4_ARRAY, text, dimensions=declared)
    message = str(info.value)
    assert f"holds a {found}-dimensional array" in message
    assert f"published as {declared}-dimensional" in message
    assert f"TYPE int4{'[]' * found}" in message
    assert message.endswith("then run python -m capture resync public.t and restart capture")


def test_array_elements_use_their_own_parsers() -> None:
    assert parse(BOOL_ARRAY, b"{t,f,NULL}") == [True, False, None]
    assert parse(BYTEA_ARRAY, rb'{"\\x0102",NULL,"\\x"}') == [b"\x01\x02", None, b""]
    assert parse(DATE_ARRAY, b'{infinity,"0044-03-15 BC",2024-02-29}') == [
        ct.DATE_POSITIVE_INFINITY,
        -735160,
        19782,
    ]
    assert parse(TIMESTAMPTZ_ARRAY, b'{"1970-01-01 00:00:00.000001+00",-infinity}') == [
        1,
        ct.TIMESTAMP_NEGATIVE_INFINITY,
    ]
    decimals = parse(NUMERIC_ARRAY, b"{1.50,NULL,-2.00}", _typmod(10, 2))
    assert [None if v is None else unscaled(v) for v in decimals] == [150, None, -200]


def test_array_element_errors_name_the_column() -> None:
    with pytest.raises(TableError, match=r"column c \(numeric\(10,2\)\[\]\) holds NaN"):
        parse(NUMERIC_ARRAY, b"{1.00,NaN}", _typmod(10, 2))


def test_array_of_text_form_elements() -> None:
    assert parse(UNKNOWN_BASE_ARRAY, rb'{"\"a\"=>\"1\"",NULL}') == ['"a"=>"1"', None]


def test_box_array_uses_the_semicolon_delimiter() -> None:
    assert parse(BOX_ARRAY, b"{(3,4),(1,2);(1,1),(0,0)}") == ["(3,4),(1,2)", "(1,1),(0,0)"]
    assert parse(BOX_ARRAY, b'{(3,4),(1,2);NULL;"NULL"}') == ["(3,4),(1,2)", None, "NULL"]
