"""PostgreSQL column types onto the contract's Avro column types, and the text parsers.

pgoutput (protocol version 1, no ``binary``) sends every non-null value as the text its
type's output function prints. That text depends on session settings -- ``DateStyle``,
``TimeZone``, ``IntervalStyle``, ``bytea_output``, ``extra_float_digits``,
``client_encoding``, ``lc_monetary``, ``search_path`` -- and the output functions run in
the walsender, so the settings that count are the replication connection's own. A role
or database may carry different defaults (``ALTER ROLE ... SET DateStyle``); the
capture therefore sets :data:`SESSION_SETTINGS` on the replication connection and on the
snapshot connection, as startup options (:func:`libpq_options`), so that a row reads the
same from both and every parser here can rely on one form. PostgreSQL's own subscriber
does the same (``datestyle``, ``intervalstyle``, ``extra_float_digits``,
``client_encoding``, a fixed ``search_path``).

:func:`map_column` turns a Relation column (type OID, type modifier) into a
:class:`ColumnMapping`: the contract's :class:`~schemas.column_type.ColumnType` and a
``parse`` function built once for the column, which turns the bytes of one non-null
value into what :class:`~schemas.change_record.ChangeEncoder` takes. Parsers return Avro
*physical* values (ints for dates, times and timestamps, unscaled two's-complement
bytes for decimals, ``str`` for UUIDs), which the encoder accepts with and without
``physical_values=True``. NULL and unchanged-TOAST values never reach a parser.

=============================  =========================  ====================================
PostgreSQL type                column type                value
=============================  =========================  ====================================
bool                           BOOLEAN                    ``t``/``f``
int2, int4                     INT
int8, oid                      LONG                       oid is unsigned 32-bit; fits a long
float4                         FLOAT                      shortest exact text; ``NaN`` and
                                                          ``±Infinity`` are float values
float8                         DOUBLE                     same
numeric(p,s), 1<=p<=38,        DECIMAL(p,s)               ``NaN`` (or ``±Infinity``, which
0<=s<=p                                                   PostgreSQL refuses in such columns)
                                                          is a TableError
numeric, numeric(p,s)          STRING                     the text form, ``NaN`` and
otherwise                                                 ``±Infinity`` included
text, varchar, bpchar, name,   STRING                     bpchar keeps its padding
"char"
bytea                          BYTES                      ``\\x`` + hex
date                           DATE                       days since 1970-01-01; BC dates
                                                          proleptic Gregorian; ``±infinity``
                                                          -> DATE_(POSITIVE|NEGATIVE)_INFINITY
time                           TIME_MICROS                µs after midnight, ``24:00:00``
                                                          -> 86 400 000 000
timestamp                      LOCAL_TIMESTAMP_MICROS     µs since 1970-01-01 00:00;
                                                          ``±infinity`` -> the sentinels
timestamptz                    TIMESTAMP_MICROS           µs since 1970-01-01 00:00 UTC; same
timetz, interval               STRING                     interval in ISO 8601
                                                          (``P1Y2M3DT4H5M6.7S``)
uuid                           UUID                       canonical lowercase text
json, jsonb, xml               STRING                     jsonb as PostgreSQL normalises it
money                          STRING                     ``lc_monetary=C``: ``-$1,234.50``
inet, cidr, macaddr, macaddr8  STRING
enum                           STRING                     the label
T[] (array_out types)          ARRAY of T's type          see arrays below
domain over B                  B's mapping                with the domain's typmod
anything else: composite,      STRING                     the type's text output
range, multirange, hstore,
geometric, tsvector, bit...
=============================  =========================  ====================================

Rules:

- **Built-in types by OID.** The scalar types above are recognised by their fixed OIDs
  (below 10000, never reassigned), so they need no catalog entry. Arrays, domains,
  enums and every other type are resolved through the ``types`` mapping that
  :func:`capture.rows.type_catalog.load_types` returns; an OID missing from it (dropped since
  the Relation message) is a TableError naming the OID.
- **numeric typmod.** ``((p << 16) | (s & 0x7ff)) + 4``; the scale is an 11-bit signed
  field since PostgreSQL 15. A value's text always carries exactly ``s`` fractional
  digits (PostgreSQL rounds on input); the parser still rescales a shorter fraction and
  refuses a longer one rather than mis-scale.
- **Infinity and range.** Dates always fit an Avro int and never reach its sentinels.
  A finite timestamp at or beyond 2^63-1 µs after 1970 (after 294247-01-10) is a
  TableError, never clamped.
- **money** depends on ``lc_monetary`` for its symbol, separators and number of
  fractional digits; with ``lc_monetary=C`` it is ``$``, ``,`` and two digits on every
  server. It stays STRING: a consumer that needs the amount casts it after stripping
  ``$`` and ``,``, or the table uses ``numeric(p,2)``, which is DECIMAL.
- **Arrays.** An Avro schema fixes the nesting depth, PostgreSQL does not: any array
  column can hold values of any number of dimensions. A column is published with the
  dimensions it was declared with (``pg_attribute.attndims``, read by
  :func:`capture.rows.type_catalog.load_array_dimensions`; 0 counts as 1), a
  two-dimensional one as an ARRAY of ARRAY, and a value with a different number of
  dimensions is a TableError. The empty array ``{}`` has no dimensions and is ``[]``
  for any depth. Lower bounds other than 1 (``[0:1]={1,2}``) are dropped: the consumer
  gets the elements in order, as for any array; PostgreSQL's subscripts are not part of
  the contract. Unquoted ``NULL`` is a null element, quoted ``"NULL"`` the string.
  Elements are parsed by their own type's parser, so an array of any mapped type works,
  text-form ones included. Element types that are themselves arrays (an array of a
  domain over an array) nest one level more and may be ragged.
- **Text.** Strings are decoded as UTF-8, which ``client_encoding=UTF8`` guarantees for
  every server encoding except ``SQL_ASCII``; a value that is not UTF-8 (possible only
  there) is a TableError.
- **Wrong session settings** show up as a value not in the expected form (``29/02/2024``
  for a date, escape-format bytea) and raise :class:`~capture.errors.ConfigError`:
  the connection was opened without :data:`SESSION_SETTINGS`.

Error messages name the table, the column and its type, never the value.
"""

from __future__ import annotations

import functools
import re
from binascii import unhexlify
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any, Literal

from capture.errors import ConfigError, TableError
from capture.rows.type_catalog import PgType, TypType
from schemas import column_type as ct
from schemas.column_type import ColumnType

SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO",
    "TimeZone": "UTC",
    "IntervalStyle": "iso_8601",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
    "lc_monetary": "C",
    "search_path": "pg_catalog",
}
"""GUCs of the replication and snapshot connections. Besides the text forms:
``client_encoding`` makes the walsender convert every value to UTF-8 (it converts to
the *client's* encoding), ``lc_monetary=C`` fixes money's form, and
``search_path=pg_catalog`` prints ``regclass``/``regproc``/``regtype`` values
schema-qualified whatever a role's search path is, and keeps user schemas out of the
name lookups made while values are printed, as PostgreSQL's own subscriber does. Queries
on the snapshot connection therefore qualify every name."""

Parse = Callable[[bytes], Any]

TextKind = Literal[
    "boolean",
    "int",
    "long",
    "string",
    "float",
    "double",
    "date",
    "time",
    "timestamp",
    "timestamptz",
]
"""How the compiled row encoder reads a column's text (:attr:`ColumnMapping.text_kind`)."""


def libpq_options(settings: Mapping[str, str] = SESSION_SETTINGS) -> str:
    """The libpq ``options`` connection parameter that sets ``settings`` at startup,
    e.g. ``psycopg.connect(dsn, replication="database", options=libpq_options())``."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace(" ", "\\ ")

    return " ".join(f"-c {escape(name)}={escape(value)}" for name, value in settings.items())


@dataclass(frozen=True, slots=True)
class ColumnMapping:
    """How one column is published: its contract type and the parser of its values."""

    column_type: ColumnType
    parse: Parse
    """Text bytes of one non-null value -> the encoder's input for :attr:`column_type`.
    Raises :class:`TableError` for a value the contract cannot carry, and
    :class:`ConfigError` for text not in the form :data:`SESSION_SETTINGS` gives."""
    pg_type_name: str
    """The PostgreSQL type, e.g. ``int4``, ``numeric(10,2)[]``, ``public.mood``."""
    text_kind: TextKind | None = None
    """How the compiled row encoder (:mod:`capture.rows.native`) reads this column's
    text, when it can (:data:`TextKind`): the scalar types whose text form it reads as
    ``parse`` does (``native/src/lib.rs``); None for the rest (bytea, numeric(p,s),
    arrays), whose rows take the Python path."""


@dataclass(frozen=True, slots=True)
class _Site:
    """Where values come from, for error messages."""

    table: str
    column: str
    type_name: str

    def table_error(self, message: str) -> TableError:
        return TableError(self.table, f"column {self.column} ({self.type_name}) {message}")

    def config_error(self, setting: str) -> ConfigError:
        return ConfigError(
            f"table {self.table}: a value of column {self.column} ({self.type_name}) is not "
            f"in the form {setting} gives: open the replication and snapshot connections "
            "with capture.rows.typemap.SESSION_SETTINGS (options=libpq_options())"
        )


# --- scalar parsers ------------------------------------------------------------------

_TRUE = b"t"
_HEX_PREFIX = b"\\x"
_DIGIT_9 = 0x39
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH_LOCAL = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS_PER_DAY = 86_400_000_000
_INFINITY = b"infinity"
_NEGATIVE_INFINITY = b"-infinity"

# The ISO forms PostgreSQL prints and Python's fromisoformat does not read: BC (years
# count 1 BC, 2 BC...; astronomical year = 1 - n), years after 9999, time 24:00:00.
_DATE_TEXT = re.compile(rb"(\d{4,})-(\d\d)-(\d\d)( BC)?")
_TIME_TEXT = re.compile(rb"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_TIMESTAMP_TEXT = re.compile(
    rb"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    rb"(?:([+-])(\d\d)(?::(\d\d)(?::(\d\d))?)?)?( BC)?"
)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date; ``year`` is astronomical
    (0 is 1 BC). Howard Hinnant's ``days_from_civil``."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def _astronomical(year: bytes, bc: bytes | None) -> int:
    return 1 - int(year) if bc else int(year)


def _fraction_micros(digits: bytes | None) -> int:
    return int(digits.ljust(6, b"0")) if digits else 0


def _time_of_day(hour: bytes, minute: bytes, second: bytes, fraction: bytes | None) -> int:
    seconds = (int(hour) * 60 + int(minute)) * 60 + int(second)
    return seconds * 1_000_000 + _fraction_micros(fraction)


def _parse_bool(site: _Site) -> Parse:
    return _TRUE.__eq__


def _parse_int(site: _Site) -> Parse:
    return int


def _parse_float(site: _Site) -> Parse:
    return float


def _parse_uuid(site: _Site) -> Parse:
    return bytes.decode


def _parse_text(site: _Site) -> Parse:
    def parse(value: bytes) -> str:
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise site.table_error(
                "holds bytes that are not UTF-8, which a SQL_ASCII database lets in: "
                "fix the row, or move the table to a UTF8 database"
            ) from exc

    return parse


def _parse_bytea(site: _Site) -> Parse:
    def parse(value: bytes) -> bytes:
        # Escape-form text never starts with \x (a backslash is printed as \\), so the
        # check rules out silently decoding the wrong form.
        if value[:2] != _HEX_PREFIX:
            raise site.config_error("bytea_output=hex")
        return unhexlify(value[2:])

    return parse


def _parse_date(site: _Site) -> Parse:
    def slow(value: bytes) -> int:
        if value == _INFINITY:
            return ct.DATE_POSITIVE_INFINITY
        if value == _NEGATIVE_INFINITY:
            return ct.DATE_NEGATIVE_INFINITY
        match = _DATE_TEXT.fullmatch(value)
        if match is None:
            raise site.config_error("DateStyle=ISO")
        year, month, day, bc = match.groups()
        return _days_from_civil(_astronomical(year, bc), int(month), int(day))

    def parse(value: bytes) -> int:
        # infinity and BC dates end in a letter: no exception on their way to slow().
        if not value or value[-1] > _DIGIT_9:
            return slow(value)
        try:
            return date.fromisoformat(value.decode()).toordinal() - _EPOCH_ORDINAL
        except ValueError:
            return slow(value)  # years after 9999

    return parse


def _parse_time(site: _Site) -> Parse:
    def slow(value: bytes) -> int:
        match = _TIME_TEXT.fullmatch(value)
        if match is None:
            raise site.config_error("DateStyle=ISO")
        return _time_of_day(*match.groups())

    def parse(value: bytes) -> int:
        try:
            moment = time.fromisoformat(value.decode())
        except ValueError:
            return slow(value)  # 24:00:00
        return (
            (moment.hour * 60 + moment.minute) * 60 + moment.second
        ) * 1_000_000 + moment.microsecond

    return parse


def _parse_timestamp(site: _Site, epoch: datetime) -> Parse:
    def slow(value: bytes) -> int:
        if value == _INFINITY:
            return ct.TIMESTAMP_POSITIVE_INFINITY
        if value == _NEGATIVE_INFINITY:
            return ct.TIMESTAMP_NEGATIVE_INFINITY
        match = _TIMESTAMP_TEXT.fullmatch(value)
        if match is None:
            raise site.config_error("DateStyle=ISO")
        year, month, day, hour, minute, second, fraction, sign, oh, om, osec, bc = match.groups()
        days = _days_from_civil(_astronomical(year, bc), int(month), int(day))
        micros = days * _MICROS_PER_DAY + _time_of_day(hour, minute, second, fraction)
        if sign is not None:
            offset = ((int(oh) * 60 + int(om or 0)) * 60 + int(osec or 0)) * 1_000_000
            micros -= offset if sign == b"+" else -offset
        if not ct.TIMESTAMP_NEGATIVE_INFINITY < micros < ct.TIMESTAMP_POSITIVE_INFINITY:
            raise site.table_error(
                "holds a timestamp after 294247-01-10, which microseconds since 1970 in a "
                "long cannot carry: correct or delete the row, or store such values as "
                "'infinity'"
            )
        return micros

    def parse(value: bytes) -> int:
        if not value or value[-1] > _DIGIT_9:  # infinity, BC
            return slow(value)
        try:
            since = datetime.fromisoformat(value.decode()) - epoch
        except ValueError:
            return slow(value)  # years after 9999
        # Cheaper than since // timedelta(microseconds=1).
        return (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds

    return parse


def _parse_local_timestamp(site: _Site) -> Parse:
    return _parse_timestamp(site, _EPOCH_LOCAL)


def _parse_utc_timestamp(site: _Site) -> Parse:
    return _parse_timestamp(site, _EPOCH_UTC)


def _parse_decimal(site: _Site, precision: int, scale: int) -> Parse:
    """Unscaled two's-complement bytes: what Avro's decimal holds, and cheaper for the
    encoder than a ``Decimal``."""

    def rescale(fraction: bytes) -> bytes:
        if len(fraction) < scale:
            return fraction.ljust(scale, b"0")
        if fraction[scale:].strip(b"0"):
            raise site.table_error(
                f"holds a value with more than {scale} fractional digits, which "
                f"DECIMAL({precision},{scale}) would round: check the column's declared "
                "scale"
            )
        return fraction[:scale]

    def parse(value: bytes) -> bytes:
        # Finite numeric text ends in a digit; NaN, Infinity and -Infinity do not.
        if not value or value[-1] > _DIGIT_9:
            raise site.table_error(
                f"holds {value.decode()}, which DECIMAL({precision},{scale}) cannot carry: "
                "make those values NULL or a number, or alter the column to unconstrained "
                "numeric (published as its text form); then run python -m capture resync "
                f"{site.table} and restart capture"
            )
        whole, _, fraction = value.partition(b".")
        if len(fraction) != scale:
            fraction = rescale(fraction)
        unscaled = int(whole + fraction)
        return unscaled.to_bytes((unscaled.bit_length() + 8) >> 3, "big", signed=True)

    return parse


# --- arrays --------------------------------------------------------------------------

_LEFT_BRACE = 0x7B
_BOUNDS = 0x5B  # '[': array_out prefixes "[lower:upper]...=" when a lower bound is not 1
_NULL = b"NULL"
_QUOTE = b'"'
_BACKSLASH = b"\\"
_QUOTED = rb'"[^"\\]*(?:\\.[^"\\]*)*"'


def _unescape(quoted: bytes) -> bytes:
    """The content of a quoted array element. array_out puts a backslash before exactly
    ``"`` and ``\\``; every ``"`` in the content is escaped, so dropping the backslash
    before each ``"`` first leaves only escaped backslashes, which pair up from the left."""
    return quoted.replace(b'\\"', b'"').replace(b"\\\\", b"\\")


@dataclass(frozen=True, slots=True)
class _ArraySyntax:
    delimiter: bytes
    items: re.Pattern[bytes]
    """Elements of a one-dimensional literal with quotes: (quoted, bare) pairs."""
    tokens: re.Pattern[bytes]
    """Tokens of any literal: ``{``, ``}``, quoted content, a bare element."""


@functools.cache
def _array_syntax(delimiter: bytes) -> _ArraySyntax:
    d = re.escape(delimiter)
    return _ArraySyntax(
        delimiter,
        re.compile(b"(" + _QUOTED + rb')|([^"' + d + b"]+)", re.DOTALL),
        re.compile(rb"(\{)|(\})|(" + _QUOTED + rb')|([^{}"' + d + b"]+)", re.DOTALL),
    )


def _element_bytes(quoted: bytes, bare: bytes) -> bytes | None:
    if quoted:
        content = quoted[1:-1]
        return _unescape(content) if _BACKSLASH in content else content
    return None if bare == _NULL else bare


def _nest(value: bytes, tokens: re.Pattern[bytes]) -> list[Any]:
    """A multi-dimensional literal as nested lists of element bytes (``None`` for NULL)."""
    stack: list[list[Any]] = [[]]
    for token in tokens.finditer(value):
        kind = token.lastindex
        if kind == 1:
            inner: list[Any] = []
            stack[-1].append(inner)
            stack.append(inner)
        elif kind == 2:
            stack.pop()
        elif kind == 3:
            stack[-1].append(_element_bytes(token.group(3), b""))
        else:
            stack[-1].append(_element_bytes(b"", token.group(4)))
    result: list[Any] = stack[0][0]
    return result


def _parse_array(
    site: _Site, element: Parse, element_name: str, delimiter: str, dimensions: int
) -> Parse:
    syntax = _array_syntax(delimiter.encode())
    delim, items, tokens = syntax.delimiter, syntax.items, syntax.tokens

    def mismatch(found: int) -> TableError:
        return site.table_error(
            f"holds a {found}-dimensional array but is published as {dimensions}-dimensional "
            "(its declared dimensions): declare the dimensions its values have (ALTER TABLE "
            f"... ALTER COLUMN {site.column} TYPE {element_name}{'[]' * found}), or store "
            f"only {dimensions}-dimensional values; then run python -m capture resync "
            f"{site.table} and restart capture"
        )

    def convert(node: list[Any], level: int) -> list[Any]:
        if level == dimensions:
            return [None if item is None else element(item) for item in node]
        return [convert(item, level + 1) for item in node]

    def parse(value: bytes) -> list[Any]:
        if value[0] == _BOUNDS:
            value = value[value.index(b"=") + 1 :]
        if len(value) == 2:  # {}: no dimensions at all
            return []
        # Arrays are rectangular and elements never start with a bare "{", so the
        # leading braces count the dimensions.
        found = 1
        while value[found] == _LEFT_BRACE:
            found += 1
        if found != dimensions:
            raise mismatch(found)
        if dimensions > 1:
            return convert(_nest(value, tokens), 1)
        if _QUOTE not in value:
            return [None if item == _NULL else element(item) for item in value[1:-1].split(delim)]
        parsed: list[Any] = []
        for quoted, bare in items.findall(value, 1, len(value) - 1):
            raw = _element_bytes(quoted, bare)
            parsed.append(None if raw is None else element(raw))
        return parsed

    return parse


# --- the mapping ---------------------------------------------------------------------

NUMERIC_OID = 1700
_VARHDRSZ = 4


@dataclass(frozen=True, slots=True)
class _Scalar:
    name: str
    column_type: ColumnType
    parser: Callable[[_Site], Parse]
    text_kind: TextKind | None = None
    """:attr:`ColumnMapping.text_kind`: only where the compiled encoder reads the text
    exactly as ``parser`` does (``tests/unit/capture/test_native_rows.py``)."""


_SCALARS: dict[int, _Scalar] = {
    16: _Scalar("bool", ct.BOOLEAN, _parse_bool, "boolean"),
    17: _Scalar("bytea", ct.BYTES, _parse_bytea),
    18: _Scalar('"char"', ct.STRING, _parse_text, "string"),
    19: _Scalar("name", ct.STRING, _parse_text, "string"),
    20: _Scalar("int8", ct.LONG, _parse_int, "long"),
    21: _Scalar("int2", ct.INT, _parse_int, "int"),
    23: _Scalar("int4", ct.INT, _parse_int, "int"),
    25: _Scalar("text", ct.STRING, _parse_text, "string"),
    26: _Scalar("oid", ct.LONG, _parse_int, "long"),
    114: _Scalar("json", ct.STRING, _parse_text, "string"),
    142: _Scalar("xml", ct.STRING, _parse_text, "string"),
    650: _Scalar("cidr", ct.STRING, _parse_text, "string"),
    700: _Scalar("float4", ct.FLOAT, _parse_float, "float"),
    701: _Scalar("float8", ct.DOUBLE, _parse_float, "double"),
    774: _Scalar("macaddr8", ct.STRING, _parse_text, "string"),
    790: _Scalar("money", ct.STRING, _parse_text, "string"),
    829: _Scalar("macaddr", ct.STRING, _parse_text, "string"),
    869: _Scalar("inet", ct.STRING, _parse_text, "string"),
    1042: _Scalar("bpchar", ct.STRING, _parse_text, "string"),
    1043: _Scalar("varchar", ct.STRING, _parse_text, "string"),
    1082: _Scalar("date", ct.DATE, _parse_date, "date"),
    1083: _Scalar("time", ct.TIME_MICROS, _parse_time, "time"),
    1114: _Scalar("timestamp", ct.LOCAL_TIMESTAMP_MICROS, _parse_local_timestamp, "timestamp"),
    1184: _Scalar("timestamptz", ct.TIMESTAMP_MICROS, _parse_utc_timestamp, "timestamptz"),
    1186: _Scalar("interval", ct.STRING, _parse_text, "string"),
    1266: _Scalar("timetz", ct.STRING, _parse_text, "string"),
    2950: _Scalar("uuid", ct.UUID, _parse_uuid, "string"),
    3802: _Scalar("jsonb", ct.STRING, _parse_text, "string"),
}


def numeric_precision_scale(type_modifier: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a numeric type modifier, ``None`` when unconstrained."""
    if type_modifier < _VARHDRSZ:
        return None
    packed = type_modifier - _VARHDRSZ
    return (packed >> 16) & 0xFFFF, ((packed & 0x7FF) ^ 1024) - 1024


def _numeric_name(type_modifier: int) -> str:
    constraint = numeric_precision_scale(type_modifier)
    return "numeric" if constraint is None else "numeric({},{})".format(*constraint)


class _Mapper:
    """One column's mapping, resolved through the catalog."""

    def __init__(self, types: Mapping[int, PgType], table: str, column: str) -> None:
        self.types = types
        self.table = table
        self.column = column

    def pg_type(self, oid: int) -> PgType:
        found = self.types.get(oid)
        if found is None:
            raise TableError(
                self.table,
                f"column {self.column} uses type oid {oid}, which is not in the type catalog "
                "given to the mapping: load it with capture.rows.type_catalog.load_types; if it "
                "is missing from pg_type, the type was dropped, so restore it or drop the "
                "column",
            )
        return found

    def name(self, oid: int, type_modifier: int) -> str:
        if oid == NUMERIC_OID:
            return _numeric_name(type_modifier)
        scalar = _SCALARS.get(oid)
        if scalar is not None:
            return scalar.name
        pg_type = self.pg_type(oid)
        if pg_type.element_oid is not None:
            return self.name(pg_type.element_oid, type_modifier) + "[]"
        return pg_type.qualified_name

    def map(self, oid: int, type_modifier: int, dimensions: int, site: _Site) -> ColumnMapping:
        name = self.name(oid, type_modifier)
        if oid == NUMERIC_OID:
            return self.numeric(type_modifier, site, name)
        scalar = _SCALARS.get(oid)
        if scalar is not None:
            return ColumnMapping(scalar.column_type, scalar.parser(site), name, scalar.text_kind)
        pg_type = self.pg_type(oid)
        if pg_type.typtype is TypType.DOMAIN and pg_type.base_oid is not None:
            modifier = type_modifier if type_modifier != -1 else pg_type.base_typmod
            base = self.map(pg_type.base_oid, modifier, dimensions, site)
            return ColumnMapping(base.column_type, base.parse, name, base.text_kind)
        if pg_type.element_oid is not None:
            element_oid = pg_type.element_oid
            element = self.map(element_oid, type_modifier, 1, site)
            element_type = self.types.get(element_oid)
            delimiter = "," if element_type is None else element_type.delimiter
            column_type = element.column_type
            for _ in range(dimensions):
                column_type = ColumnType.array(column_type)
            element_name = self.name(element_oid, type_modifier)
            parse = _parse_array(site, element.parse, element_name, delimiter, dimensions)
            return ColumnMapping(column_type, parse, name)
        return ColumnMapping(ct.STRING, _parse_text(site), name, "string")

    def numeric(self, type_modifier: int, site: _Site, name: str) -> ColumnMapping:
        constraint = numeric_precision_scale(type_modifier)
        if constraint is not None:
            precision, scale = constraint
            if 1 <= precision <= ct.MAX_DECIMAL_PRECISION and 0 <= scale <= precision:
                return ColumnMapping(
                    ColumnType.decimal(precision, scale),
                    _parse_decimal(site, precision, scale),
                    name,
                )
        return ColumnMapping(ct.STRING, _parse_text(site), name, "string")


def map_column(
    type_oid: int,
    type_modifier: int,
    types: Mapping[int, PgType],
    *,
    table: str = "?",
    column: str = "?",
    dimensions: int = 1,
) -> ColumnMapping:
    """The contract type and value parser of one Relation column.

    ``types`` comes from :func:`capture.rows.type_catalog.load_types` over the Relation's
    column types; built-in scalar types need no entry. ``table`` (``schema.table``) and
    ``column`` name the column in errors. ``dimensions`` is the column's declared
    number of array dimensions (``pg_attribute.attndims``); values below 1 mean 1.

    Raises :class:`TableError` when a type is not in ``types``; never for a type it
    does not know, which is published as its text form.
    """
    mapper = _Mapper(types, table, column)
    site = _Site(table, column, mapper.name(type_oid, type_modifier))
    return mapper.map(type_oid, type_modifier, max(dimensions, 1), site)
