"""Key and value schemas of a table's change topic, and the encoder of its changes.

From a :class:`TableDescription` (schema, table, columns) :func:`build_table_schemas`
makes two Avro schemas; docs/wire-contract.md shows them in full.

- Key ``<ns>.Key``: the key columns (the replica identity, by default the primary key),
  in column order, with their own nullability.
- Value ``<ns>.Change``: a flat envelope -- ``op``, ``commit_lsn``, ``change_lsn``,
  ``xid``, ``commit_ts``, ``ordinal``, ``before_key_only`` -- then ``before`` and
  ``after``, each ``["null", Row]``, then ``unchanged_columns``. ``Row`` has every
  column, each ``["null", T]`` with default null whatever the column's ``NOT NULL``
  says (``pg.nullable`` records it): a DELETE's key-only ``before`` and an unchanged
  TOAST value both leave non-null columns without a value.

Invariants:

- Deterministic: the same description gives byte-identical schema JSON, hence the same
  fingerprints, in any process.
- Distinct schemas get distinct fingerprints. Parsing Canonical Form drops logical types
  and attributes, so ``numeric(10,2)`` and ``numeric(10,4)`` would otherwise share a
  fingerprint and, on the compacted schema topic, one would replace the other and
  mis-scale the records of the first. The namespace therefore ends in ``s`` + 16 hex
  digits of a SHA-256 over the full schema JSON:
  ``pgdelta.<schema>.<table>.s<digest>``.
- The key schema depends on the key columns only. Adding or changing a non-key column
  leaves every key's bytes unchanged, so compaction and partitioning by key keep
  working across the change.
- The encoder refuses values that fastavro would write but readers would reject or
  misread: an ``int`` or ``date`` beyond 32 bits, a decimal beyond its precision, a
  decimal NaN. Array elements are not re-checked.
- An unchanged TOAST value is never published as data: the column is null in ``after``
  and listed by Avro field name in ``unchanged_columns``; the consumer keeps the value
  it has.

Encoding speed: the encoder names every union branch with fastavro's tuple notation --
``(row name, row)`` for ``before``/``after`` and ``(type, value)`` for each non-null
column -- because without a name fastavro validates the value against each branch
before writing it, which for a row means checking every column twice.
bench/avro_encode.py measures it; docs/wire-contract.md has the numbers. A consequence
for callers: values are never tuples (arrays are lists), since fastavro would read a
tuple inside a union as a branch name.

With ``physical_values=True`` (the capture's mode) fastavro is the fallback, not the
rule: :mod:`schemas.avro_binary` writes the record with writers chosen per column once,
and hands it to fastavro only when a value is not of the exact physical type it takes.
The bytes are the same either way (tests/unit/schemas/test_avro_binary.py compares
them); the fast path is two to three times quicker (bench/avro_encode.py).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from fastavro import parse_schema, schemaless_writer

from schemas import avro_binary
from schemas.column_type import AvroKind, ColumnType
from schemas.envelope import OPERATION_SCHEMA, TABLE_KEY
from schemas.errors import ChangeEncodingError, TableDefinitionError
from schemas.lsn import Lsn
from schemas.naming import avro_name
from schemas.operation import Operation
from schemas.single_object import Fingerprint, header, schema_fingerprint

NAMESPACE_ROOT = "pgdelta"
KEY_RECORD = "Key"
VALUE_RECORD = "Change"
ROW_RECORD = "Row"

Row = Mapping[str, Any]
"""A row image keyed by Avro field name (:attr:`TableSchemas.field_names`). A plain
``dict`` is the fast path. A missing column is written as null."""


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a table, as the capture's type mapping describes it."""

    name: str
    """The PostgreSQL column name, unquoted, exactly as in ``pg_attribute``."""
    type: ColumnType
    nullable: bool = True
    key: bool = False
    """Part of the row's identity: the replica-identity columns, by default the primary key."""


@dataclass(frozen=True, slots=True)
class TableDescription:
    schema: str
    table: str
    columns: tuple[Column, ...]

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True, slots=True)
class TableSchemas:
    """The two writer schemas of one table version. Treat the dicts as read-only."""

    description: TableDescription
    key_schema: dict[str, Any]
    value_schema: dict[str, Any]
    key_schema_json: str
    """Exactly the text published on the schema topic."""
    value_schema_json: str
    key_fingerprint: Fingerprint
    value_fingerprint: Fingerprint
    field_names: tuple[str, ...]
    """Avro field name of each column, in column order."""
    key_field_names: tuple[str, ...]
    row_name: str
    """Full name of the ``Row`` record, the union branch of ``before`` and ``after``."""

    def row(self, values: Sequence[Any]) -> dict[str, Any]:
        """A row image from values in column order."""
        if len(values) != len(self.field_names):
            raise ValueError(
                f"{len(values)} values for the {len(self.field_names)} columns of "
                f"{self.description.qualified_name}"
            )
        return dict(zip(self.field_names, values, strict=True))


def _namespace(description: TableDescription) -> str:
    return f"{NAMESPACE_ROOT}.{avro_name(description.schema)}.{avro_name(description.table)}"


def _seal(schema: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Append the content digest to the namespace; return the schema and its JSON text."""
    digest = hashlib.sha256(
        json.dumps(schema, sort_keys=True, separators=(",", ":")).encode("utf-8")
    ).hexdigest()[:16]
    schema["namespace"] = f"{schema['namespace']}.s{digest}"
    return schema, json.dumps(schema, separators=(",", ":"))


def _check(description: TableDescription) -> None:
    table = description.qualified_name
    if not description.schema or not description.table:
        raise TableDefinitionError(table, "schema and table names must not be empty")
    if not description.columns:
        raise TableDefinitionError(table, "a table without columns has no change records")
    names = [column.name for column in description.columns]
    if "" in names:
        raise TableDefinitionError(table, "a column has an empty name")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise TableDefinitionError(table, f"columns {duplicates} appear more than once")
    if not any(column.key for column in description.columns):
        raise TableDefinitionError(
            table,
            "no key column: give the table a primary key, or set REPLICA IDENTITY USING "
            "INDEX (or FULL) and mark those columns as key",
        )


def build_table_schemas(description: TableDescription) -> TableSchemas:
    """Build the key and value schemas of a table (see the module docstring)."""
    _check(description)
    namespace = _namespace(description)
    table_attrs = {"pg.schema": description.schema, "pg.table": description.table}
    field_names = tuple(avro_name(column.name) for column in description.columns)
    key_columns = [
        (name, column)
        for name, column in zip(field_names, description.columns, strict=True)
        if column.key
    ]

    key_schema, key_json = _seal(
        {
            "type": "record",
            "name": KEY_RECORD,
            "namespace": namespace,
            **table_attrs,
            "fields": [
                {
                    "name": name,
                    "type": ["null", column.type.avro()] if column.nullable else column.type.avro(),
                    "pg.name": column.name,
                }
                for name, column in key_columns
            ],
        }
    )
    row = {
        "type": "record",
        "name": ROW_RECORD,
        "fields": [
            {
                "name": name,
                "type": ["null", column.type.avro()],
                "default": None,
                "pg.name": column.name,
                "pg.nullable": column.nullable,
                "pg.key": column.key,
            }
            for name, column in zip(field_names, description.columns, strict=True)
        ],
    }
    value_schema, value_json = _seal(
        {
            "type": "record",
            "name": VALUE_RECORD,
            "namespace": namespace,
            **table_attrs,
            "fields": [
                {"name": "op", "type": OPERATION_SCHEMA},
                {"name": "commit_lsn", "type": "long"},
                {"name": "change_lsn", "type": "long"},
                {"name": "xid", "type": "long"},
                {"name": "commit_ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
                {"name": "ordinal", "type": "long"},
                {"name": "before_key_only", "type": "boolean", "default": False},
                {"name": "before", "type": ["null", row], "default": None},
                {"name": "after", "type": ["null", ROW_RECORD], "default": None},
                {
                    "name": "unchanged_columns",
                    "type": {"type": "array", "items": "string"},
                    "default": [],
                },
            ],
        }
    )
    return TableSchemas(
        description=description,
        key_schema=key_schema,
        value_schema=value_schema,
        key_schema_json=key_json,
        value_schema_json=value_json,
        key_fingerprint=schema_fingerprint(key_schema),
        value_fingerprint=schema_fingerprint(value_schema),
        field_names=field_names,
        key_field_names=tuple(name for name, _ in key_columns),
        row_name=f"{value_schema['namespace']}.{ROW_RECORD}",
    )


# Which row images each operation carries: (before, after), each "required", "optional"
# or "absent", and how to say it in an error message.
_REQUIRED, _OPTIONAL, _ABSENT = "required", "optional", "absent"
_IMAGES: dict[Operation, tuple[str, str, str]] = {
    Operation.INSERT: (_ABSENT, _REQUIRED, "an after image only"),
    Operation.READ: (_ABSENT, _REQUIRED, "an after image only"),
    Operation.UPDATE: (_OPTIONAL, _REQUIRED, "an after image, and a before image or none"),
    Operation.DELETE: (_REQUIRED, _ABSENT, "a before image only"),
    Operation.TRUNCATE: (_ABSENT, _ABSENT, "no row image"),
}


def _image_ok(rule: str, image: Row | None) -> bool:
    if image is None:
        return rule != _REQUIRED
    return rule != _ABSENT


@dataclass(frozen=True, slots=True)
class Change:
    """One row change (or one truncate) with its position in the WAL.

    ``(commit_lsn, ordinal)`` orders all records of a table; a re-sent record carries
    the same pair. Row images are keyed by Avro field name (:data:`Row`).
    """

    op: Operation
    commit_lsn: Lsn
    """LSN of the transaction's commit record, as pgoutput's Begin and Commit carry it
    (snapshot: the consistent point of its exported snapshot minus one)."""
    change_lsn: Lsn
    """LSN of this change's WAL record (snapshot: same as ``commit_lsn``)."""
    xid: int
    commit_ts: int
    """Commit time, microseconds since 1970-01-01 UTC."""
    ordinal: int
    """0-based count of the records the transaction produced before this one, over all
    tables (snapshot: 0 for its leading TRUNCATE; row ``i``, from 1, of chunk ``k`` is
    ``k * 2**32 + i``: unique and increasing in publish order, not consecutive)."""
    before: Row | None = None
    after: Row | None = None
    unchanged_columns: tuple[str, ...] = ()
    """Avro field names of columns whose value the server did not send (unchanged TOAST)."""
    before_key_only: bool = False
    """``before`` holds only the key columns (the rest are null because they were not sent)."""

    def __post_init__(self) -> None:
        before_rule, after_rule, expected = _IMAGES[self.op]
        if not _image_ok(before_rule, self.before) or not _image_ok(after_rule, self.after):
            raise ValueError(f"a {self.op.value} change carries {expected}")
        if self.unchanged_columns and self.op is not Operation.UPDATE:
            raise ValueError("only an UPDATE can have unchanged (TOAST) columns")
        if self.before_key_only and self.before is None:
            raise ValueError("before_key_only needs a before image")


# The enum's symbols are the Operation values, in the order the schema lists them.
_OPERATION_INDEX = {
    Operation(symbol): avro_binary.int_(index)
    for index, symbol in enumerate(OPERATION_SCHEMA["symbols"])
}


_AFTER_ONLY = avro_binary.FALSE + avro_binary.NULL + avro_binary.NON_NULL
"""``before_key_only`` false, no ``before``, then the ``after`` union's value branch."""


@functools.lru_cache(maxsize=16, typed=True)
def transaction_fields(commit_lsn: int, xid: int, commit_ts: int) -> tuple[bytes, bytes]:
    """``commit_lsn``, and ``xid`` + ``commit_ts``: the value fields every record of a
    transaction shares, encoded once per transaction rather than once per record (records
    of one transaction follow each other, over all tables)."""
    return avro_binary.long_(commit_lsn), avro_binary.long_(xid) + avro_binary.long_(commit_ts)


def _same(schema: Any) -> Any:
    return schema


def _without_logical_types(schema: Any) -> Any:
    """``schema`` minus its ``logicalType`` attributes: the same binary encoding, since a
    logical type only says how to read the physical value."""
    if isinstance(schema, dict):
        return {
            key: _without_logical_types(value)
            for key, value in schema.items()
            if key != "logicalType"
        }
    if isinstance(schema, list):
        return [_without_logical_types(item) for item in schema]
    return schema


def _branch(column_type: ColumnType) -> str:
    """The name fastavro's tuple notation uses for the non-null branch of a column."""
    avro = column_type.avro()
    return avro if isinstance(avro, str) else str(avro["type"])


_FASTAVRO_FIELD = re.compile(r" on field (\S+)")
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


def _int32(value: object) -> bool:
    # date inputs are converted by fastavro and cannot leave the range.
    return not isinstance(value, int) or _INT_MIN <= value <= _INT_MAX


def _decimal_check(precision: int, scale: int) -> Callable[[object], bool]:
    limit: int = 10**precision

    def fits(value: object) -> bool:
        if isinstance(value, Decimal):
            # NaN and infinities have no Avro decimal form; the scale is fastavro's check.
            return value.is_finite() and (value.is_zero() or value.adjusted() < precision - scale)
        if isinstance(value, bytes):
            return abs(int.from_bytes(value, "big", signed=True)) < limit
        return True  # anything else fails in fastavro with a typed error

    return fits


def _range_check(column_type: ColumnType) -> Callable[[object], bool] | None:
    """A check for values fastavro would write without complaint but readers reject or
    misread: Avro ints beyond 32 bits, decimals beyond their precision."""
    if column_type.kind in (AvroKind.INT, AvroKind.DATE):
        return _int32
    if column_type.kind is AvroKind.DECIMAL:
        # ColumnType.__post_init__ guarantees both for a DECIMAL.
        assert column_type.precision is not None
        assert column_type.scale is not None
        return _decimal_check(column_type.precision, column_type.scale)
    return None


@dataclass(frozen=True, slots=True)
class RecordFraming:
    """The header bytes a :class:`ChangeEncoder` writes before each Avro body: the
    single-object encoding's (the default) or the Schema Registry's
    (:mod:`schemas.registry_framing`); the bodies are the same either way."""

    key: bytes
    """Before each key body."""
    value: bytes
    """Before each value body."""
    table_key: bytes
    """The whole key of a TRUNCATE record: its ``TableKey`` record has no fields, so the
    header is all of it."""


def single_object_framing(schemas: TableSchemas) -> RecordFraming:
    """The single-object headers of ``schemas`` (docs/wire-contract.md)."""
    return RecordFraming(
        key=header(schemas.key_fingerprint),
        value=header(schemas.value_fingerprint),
        table_key=TABLE_KEY,
    )


class ChangeEncoder:
    """Encodes the keys and values of one table version to single-object bytes (or
    registry-framed ones, with a :class:`RecordFraming` of registry headers).

    Schemas are parsed once; each call reuses one buffer that already holds the header,
    so an instance is not thread-safe (use one per thread).
    """

    __slots__ = (
        "_branches",
        "_key",
        "_key_buffer",
        "_key_header",
        "_key_names",
        "_key_writer",
        "_range_checks",
        "_row_name",
        "_row_writer",
        "_table",
        "_table_key",
        "_value",
        "_value_buffer",
        "_value_header",
        "schemas",
    )

    def __init__(
        self,
        schemas: TableSchemas,
        *,
        physical_values: bool = False,
        framing: RecordFraming | None = None,
    ) -> None:
        """With ``physical_values`` the rows must hold Avro physical values only -- ints
        for dates, times and timestamps, unscaled two's-complement bytes for decimals,
        ``str`` for UUIDs -- and the encoder writes them with the writers of
        :mod:`schemas.avro_binary`, falling back to fastavro for any value those do not
        take. The bytes are the same; the encoding is faster (bench/avro_encode.py).

        ``framing``: the headers written before the bodies; single-object headers
        (:func:`single_object_framing`) by default. The bodies never depend on it."""
        framing = framing or single_object_framing(schemas)
        self.schemas = schemas
        self._table = schemas.description.qualified_name
        prepare = _without_logical_types if physical_values else _same
        self._value = parse_schema(prepare(schemas.value_schema))
        self._key = parse_schema(prepare(schemas.key_schema))
        self._row_name = schemas.row_name
        columns = schemas.description.columns
        self._branches = {
            name: _branch(column.type)
            for name, column in zip(schemas.field_names, columns, strict=True)
        }
        self._key_names = schemas.key_field_names
        self._range_checks = [
            (name, fits)
            for name, column in zip(schemas.field_names, columns, strict=True)
            if (fits := _range_check(column.type)) is not None
        ]
        self._value_header = framing.value
        self._key_header = framing.key
        self._table_key = framing.table_key
        self._value_buffer = io.BytesIO()
        self._value_buffer.write(self._value_header)
        self._key_buffer = io.BytesIO()
        self._key_buffer.write(self._key_header)
        self._row_writer: avro_binary.RowWriter | None = None
        self._key_writer: avro_binary.KeyWriter | None = None
        if physical_values:
            self._row_writer = avro_binary.RowWriter(
                schemas.field_names, [column.type for column in columns]
            )
            keys = [(n, c) for n, c in zip(schemas.field_names, columns, strict=True) if c.key]
            self._key_writer = avro_binary.KeyWriter(
                self._key_header,
                [name for name, _ in keys],
                [column.type for _, column in keys],
                [column.nullable for _, column in keys],
            )

    def encode_value(self, change: Change) -> bytes:
        """The Kafka value of ``change``."""
        return self.encode_fields(
            op=change.op,
            commit_lsn=change.commit_lsn,
            change_lsn=change.change_lsn,
            xid=change.xid,
            commit_ts=change.commit_ts,
            ordinal=change.ordinal,
            before=change.before,
            after=change.after,
            unchanged_columns=change.unchanged_columns,
            before_key_only=change.before_key_only,
        )

    def encode_fields(
        self,
        *,
        op: Operation,
        commit_lsn: Lsn,
        change_lsn: Lsn,
        xid: int,
        commit_ts: int,
        ordinal: int,
        before: Row | None,
        after: Row | None,
        unchanged_columns: tuple[str, ...],
        before_key_only: bool,
    ) -> bytes:
        """:meth:`encode_value` of the :class:`Change` with these fields, without
        building one: for callers on a hot path that already guarantee what
        ``Change.__post_init__`` checks (which row images an operation carries)."""
        if unchanged_columns:
            self._check_unchanged(after, unchanged_columns)
        if (
            before is not None
            and after is not None
            and any(before.get(name) != after.get(name) for name in self._key_names)
        ):
            raise ChangeEncodingError(
                self._table,
                "an UPDATE that changes the key is published as a DELETE of the old key "
                "followed by an INSERT of the new one, never as one UPDATE",
            )
        rows = self._row_writer
        if rows is not None:
            try:
                commit, transaction = transaction_fields(commit_lsn, xid, commit_ts)
                parts = [
                    self._value_header,
                    _OPERATION_INDEX[op],
                    commit,
                    avro_binary.long_(change_lsn),
                    transaction,
                    avro_binary.long_(ordinal),
                    avro_binary.boolean(before_key_only),
                ]
                if before is None:
                    parts.append(avro_binary.NULL)
                else:
                    parts.append(avro_binary.NON_NULL)
                    parts += rows.write(before)
                if after is None:
                    parts.append(avro_binary.NULL)
                else:
                    parts.append(avro_binary.NON_NULL)
                    parts += rows.write(after)
                parts.append(avro_binary.string_array(unchanged_columns))
                return b"".join(parts)
            except (avro_binary.NotEncodable, KeyError, TypeError):
                pass  # fastavro writes it, or the checks below say why it cannot
        # The fast path's writers refuse what these refuse, so running them only here
        # gives the same errors.
        if self._range_checks:
            if before is not None:
                self._check_ranges(before)
            if after is not None:
                self._check_ranges(after)
        record = {
            "op": op.value,
            "commit_lsn": commit_lsn,
            "change_lsn": change_lsn,
            "xid": xid,
            "commit_ts": commit_ts,
            "ordinal": ordinal,
            "before_key_only": before_key_only,
            "before": None if before is None else self._hinted(before),
            "after": None if after is None else self._hinted(after),
            "unchanged_columns": unchanged_columns,
        }
        return self._write(self._value_buffer, self._value, record)

    def value_head(
        self, *, op: Operation, commit_lsn: Lsn, change_lsn: Lsn, xid: int, commit_ts: int
    ) -> bytes:
        """The bytes of a value before its ``ordinal``: header, ``op``, ``commit_lsn``,
        ``change_lsn``, ``xid`` and ``commit_ts``, shared by all the records of a
        snapshot chunk (what the compiled encoder's ``encode_copy`` starts each value
        with)."""
        start, middle = self.value_around_change_lsn(
            op=op, commit_lsn=commit_lsn, xid=xid, commit_ts=commit_ts
        )
        return b"".join((start, avro_binary.long_(change_lsn), middle))

    def value_around_change_lsn(
        self, *, op: Operation, commit_lsn: Lsn, xid: int, commit_ts: int
    ) -> tuple[bytes, bytes]:
        """:meth:`value_head` in the two parts around its ``change_lsn``: header, ``op``
        and ``commit_lsn``; then ``xid`` and ``commit_ts``. Both are the same for every
        record of one transaction, table version and operation, so the stream computes
        them once and its compiled encoder writes each record's ``change_lsn`` between
        them (``encode_change``)."""
        commit, transaction = transaction_fields(commit_lsn, xid, commit_ts)
        return self.value_prefix(op) + commit, transaction

    def value_prefix(self, op: Operation) -> bytes:
        """The bytes of a value before its ``commit_lsn``: header and ``op``, the same
        for every record of the table version and operation."""
        return self._value_header + _OPERATION_INDEX[op]

    @property
    def key_header(self) -> bytes:
        """The bytes every key of the table version starts with (single-object or
        registry header)."""
        return self._key_header

    def encode_encoded_after(
        self,
        *,
        op: Operation,
        commit_lsn: Lsn,
        change_lsn: Lsn,
        xid: int,
        commit_ts: int,
        ordinal: int,
        after_fields: bytes,
    ) -> bytes:
        """:meth:`encode_fields` of a change whose only image is ``after`` (an INSERT, a
        snapshot READ, an UPDATE without a ``before``), given as its fields already
        encoded (every field of :attr:`TableSchemas.field_names`, in order, each a
        ``["null", T]`` union): what capture's compiled row encoder produces."""
        head = self.value_head(
            op=op, commit_lsn=commit_lsn, change_lsn=change_lsn, xid=xid, commit_ts=commit_ts
        )
        return b"".join(
            (
                head,
                avro_binary.long_(ordinal),
                _AFTER_ONLY,
                after_fields,
                avro_binary.NULL,  # unchanged_columns: none
            )
        )

    def encode_encoded_key(self, key_fields: bytes) -> bytes:
        """:meth:`encode_row_key` given the key record's fields already encoded."""
        return self._key_header + key_fields

    def encode_key(self, change: Change) -> bytes:
        """The Kafka key of ``change``: the key columns of ``after`` (``before`` for a
        DELETE), or :data:`schemas.envelope.TABLE_KEY` for a TRUNCATE."""
        return self.encode_row_key(change.after if change.after is not None else change.before)

    def encode_row_key(self, row: Row | None) -> bytes:
        """The Kafka key of a change whose row image is ``row`` (``after``, or ``before``
        when there is no ``after``); the TRUNCATE key (:attr:`RecordFraming.table_key`,
        by default :data:`schemas.envelope.TABLE_KEY`) for None."""
        if row is None:
            return self._table_key
        if self._key_writer is not None:
            try:
                return self._key_writer.write(row)
            except avro_binary.NotEncodable:
                pass  # fastavro writes it, or says why it cannot
        # fastavro reads only the key schema's fields from the row, so no copy is needed.
        return self._write(self._key_buffer, self._key, row)

    def _hinted(self, row: Row) -> tuple[str, dict[str, Any]]:
        """``row`` with every union branch named, for fastavro's tuple notation."""
        branches = self._branches
        try:
            return self._row_name, {
                name: None if value is None else (branches[name], value)
                for name, value in row.items()
            }
        except KeyError as exc:
            raise ChangeEncodingError(
                self._table,
                f"row image has a column {exc.args[0]!r} that is not an Avro field name of "
                "the table (use TableSchemas.field_names)",
            ) from exc

    def _write(self, buffer: io.BytesIO, schema: Any, datum: Any) -> bytes:
        # The buffer starts with its header (single-object or registry, see __init__).
        header_size = len(self._value_header if buffer is self._value_buffer else self._key_header)
        buffer.seek(header_size)
        buffer.truncate()
        try:
            schemaless_writer(buffer, schema, datum)
        except (ValueError, TypeError, OverflowError) as exc:
            # Some fastavro messages quote the value; ours names only the field, and the
            # original stays attached as the cause.
            fields = _FASTAVRO_FIELD.findall(str(exc))
            where = f"column {fields[0]!r}" if fields else "a column"
            raise ChangeEncodingError(
                self._table,
                f"the value of {where} does not fit its Avro type ({type(exc).__name__}): "
                "fix the type mapping of that column",
            ) from exc
        return buffer.getvalue()

    def _check_ranges(self, row: Row) -> None:
        for name, fits in self._range_checks:
            value = row.get(name)
            if value is not None and not fits(value):
                raise ChangeEncodingError(
                    self._table,
                    f"the value of column {name!r} is outside the range of its Avro type: "
                    "fix the type mapping of that column",
                )

    def _check_unchanged(self, after: Row | None, unchanged_columns: tuple[str, ...]) -> None:
        assert after is not None  # Change guarantees an after image for an UPDATE
        for name in unchanged_columns:
            if name not in self._branches:
                raise ChangeEncodingError(
                    self._table,
                    f"unchanged column {name!r} is not an Avro field name of the table "
                    "(use TableSchemas.field_names)",
                )
            if after.get(name) is not None:
                raise ChangeEncodingError(
                    self._table,
                    f"column {name!r} is marked unchanged but has a value in the after "
                    "image: an unchanged TOAST column must be null there",
                )
