"""Delta table columns from the contract's value schemas: type mapping, metadata columns,
table creation and evolution.

A value schema's ``Row`` record (docs/wire-contract.md, value) lists the table's
columns by Avro field name; each becomes a Delta column of the same name. Avro names
are ``[A-Za-z_][A-Za-z0-9_]*``, valid Delta column names without column mapping, and
for snake_case PostgreSQL names they are the names themselves (``"Order Note"`` becomes
``_pg_Order_20Note``; the escape is in the wire contract).

Type mapping (``Row`` field, non-null branch -> Delta):

========================================  ==============  ===========================
Avro                                      Delta           note
========================================  ==============  ===========================
boolean                                   boolean
int                                       int
long                                      bigint
float                                     float
double                                    double
bytes                                     binary
string                                    string          text, varchar, json, numeric
                                                          without (p, s) ... as text
bytes + decimal(p, s)                     decimal(p,s)    precision and scale kept
int + date                                date            +-infinity: the int32 extremes
long + time-micros                        bigint          microseconds after midnight
long + timestamp-micros                   timestamp       a UTC instant
long + local-timestamp-micros             timestamp_ntz   zone-less
string + uuid                             string
array of [null, T]                        array<T>        elements nullable
========================================  ==============  ===========================

``time-micros`` is read as plain ``long``: Delta has no TIME type, and Spark's rejects
PostgreSQL's ``24:00:00`` (docs/wire-contract.md, column types), while the microseconds
are exact. Every other mapping is what ``from_avro`` produces for the writer schema, so
decoding needs no cast.

Metadata columns, after the data columns: :data:`COMMIT_LSN_COLUMN` and
:data:`ORDINAL_COLUMN` hold the position of the change that last wrote the row, and
:data:`COMMIT_TS_COLUMN` its commit time. A MERGE updates a row only from a later
position, and a TRUNCATE deletes the rows whose position is before its own.

Evolution: a column that a writer schema has and the table lacks is added (nullable)
before the batch's MERGE; adding a column is idempotent, so a replayed batch adds
nothing. A column the table has and newer schemas lack (dropped at the source) stays;
rows the batch writes get null there. A column whose type changed, a changed set of key
columns, two names that differ only in case (Delta compares names case-insensitively)
or a source column named like a metadata column raise
:class:`~apply.errors.SchemaChangeError`: the lake cannot follow, and the table needs a
resync (``python -m capture resync SCHEMA.TABLE``, whose TRUNCATE replaces the Delta
table) or a rename at the source.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from apply.errors import SchemaChangeError, TableError
from apply.lake.table_lock import TABLE_LOCKS
from apply.lake.tables import TableId
from schemas.change_record import VALUE_RECORD
from schemas.single_object import Fingerprint, format_fingerprint

COMMIT_LSN_COLUMN = "_cdc_commit_lsn"
ORDINAL_COLUMN = "_cdc_ordinal"
COMMIT_TS_COLUMN = "_cdc_commit_ts"
METADATA_FIELDS: tuple[StructField, ...] = (
    StructField(COMMIT_LSN_COLUMN, LongType(), nullable=True),
    StructField(ORDINAL_COLUMN, LongType(), nullable=True),
    StructField(COMMIT_TS_COLUMN, TimestampType(), nullable=True),
)

TABLE_PROPERTY = "pgdelta.table"
"""Table property naming the source table, ``schema.table``."""
KEY_COLUMNS_PROPERTY = "pgdelta.keyColumns"
"""Table property listing the key columns (JSON array of column names)."""
DELETION_VECTORS_PROPERTY = "delta.enableDeletionVectors"

_TIMESTAMP_NTZ_FEATURE = "timestampNtz"
_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_PRIMITIVES: dict[str, DataType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
}
_LOGICAL: dict[tuple[str, str], DataType] = {
    ("int", "date"): DateType(),
    ("long", "time-micros"): LongType(),
    ("long", "timestamp-micros"): TimestampType(),
    ("long", "local-timestamp-micros"): TimestampNTZType(),
    ("string", "uuid"): StringType(),
}


class UnsupportedAvroTypeError(ValueError):
    """A writer schema uses an Avro type outside the contract's column types."""


def _non_null(avro_type: Any) -> Any:
    if isinstance(avro_type, list):
        branches = [branch for branch in avro_type if branch != "null"]
        if len(branches) != 1 or len(avro_type) != 2:
            raise UnsupportedAvroTypeError(f"union {json.dumps(avro_type)} is not [null, T]")
        return branches[0]
    return avro_type


def spark_type(avro_type: Any) -> DataType:
    """The Delta type of a column whose Avro type (non-null branch) is ``avro_type``."""
    if isinstance(avro_type, str):
        primitive = _PRIMITIVES.get(avro_type)
        if primitive is None:
            raise UnsupportedAvroTypeError(f"Avro type {avro_type!r}")
        return primitive
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        logical = avro_type.get("logicalType")
        if kind == "array":
            return ArrayType(spark_type(_non_null(avro_type.get("items"))), containsNull=True)
        if kind == "bytes" and logical == "decimal":
            precision, scale = avro_type.get("precision"), avro_type.get("scale", 0)
            if not isinstance(precision, int) or not isinstance(scale, int):
                raise UnsupportedAvroTypeError(
                    f"decimal without integer precision, scale: {avro_type}"
                )
            return DecimalType(precision, scale)
        if isinstance(kind, str) and isinstance(logical, str):
            mapped = _LOGICAL.get((kind, logical))
            if mapped is not None:
                return mapped
        if isinstance(kind, str) and logical is None:
            return spark_type(kind)
    raise UnsupportedAvroTypeError(f"Avro type {json.dumps(avro_type)}")


def _read_times_as_long(schema: Any) -> Any:
    """``schema`` with ``time-micros`` read as plain long (same bytes; see the docstring)."""
    if isinstance(schema, dict):
        if schema.get("logicalType") == "time-micros":
            return {key: value for key, value in schema.items() if key != "logicalType"}
        return {key: _read_times_as_long(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_read_times_as_long(item) for item in schema]
    return schema


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One data column of a Delta table."""

    name: str
    """Avro field name, which is also the Delta column name."""
    data_type: DataType
    key: bool = False


@dataclass(frozen=True, slots=True)
class ValueSchema:
    """What apply needs from one writer schema of a table's values."""

    fingerprint: Fingerprint
    table: TableId
    columns: tuple[ColumnSpec, ...]
    decode_json: str
    """The schema text handed to ``from_avro``: the writer schema with ``time-micros``
    read as long."""

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns if column.key)


def _row_record(schema: dict[str, Any]) -> dict[str, Any]:
    for field in schema.get("fields", ()):
        if field.get("name") == "before":
            row = _non_null(field["type"])
            if isinstance(row, dict) and row.get("type") == "record":
                return row
    raise UnsupportedAvroTypeError("no before field holding the Row record")


@lru_cache(maxsize=1024)
def parse_value_schema(table: TableId, fingerprint: Fingerprint, schema_json: str) -> ValueSchema:
    """The columns of a ``Change`` writer schema of ``table`` (pure; cached).

    Raises :class:`~apply.errors.TableError` when the schema is not a value schema of
    ``table``, and :class:`SchemaChangeError` when a column has no Delta mapping.
    """
    schema = json.loads(schema_json)
    where = f"writer schema {format_fingerprint(fingerprint)}"
    if not isinstance(schema, dict) or schema.get("name") != VALUE_RECORD:
        name = schema.get("name") if isinstance(schema, dict) else None
        raise TableError(
            str(table),
            f"{where} is a {name!r} record, not a {VALUE_RECORD} value: the topic's values "
            "were written with a key or foreign schema; check the producer",
        )
    described = TableId(str(schema.get("pg.schema")), str(schema.get("pg.table")))
    if described != table:
        raise TableError(
            str(table),
            f"{where} describes table {described}, yet its records are on this table's "
            "topic: check the producer's topic naming",
        )
    columns = []
    try:
        for field in _row_record(schema)["fields"]:
            columns.append(
                ColumnSpec(
                    name=field["name"],
                    data_type=spark_type(_non_null(field["type"])),
                    key=bool(field.get("pg.key", False)),
                )
            )
    except (UnsupportedAvroTypeError, KeyError, TypeError) as exc:
        raise SchemaChangeError(
            str(table),
            f"{where} has a column this apply release cannot map to Delta ({exc}): "
            "upgrade apply to a release that knows the contract version the capture writes",
        ) from exc
    if not any(column.key for column in columns):
        raise SchemaChangeError(
            str(table), f"{where} marks no key column (pg.key): rows could not be matched"
        )
    return ValueSchema(
        fingerprint=fingerprint,
        table=table,
        columns=tuple(columns),
        decode_json=json.dumps(_read_times_as_long(schema), separators=(",", ":")),
    )


@dataclass(frozen=True, slots=True)
class ExistingTable:
    """The data columns and key of a Delta table apply created earlier."""

    columns: tuple[ColumnSpec, ...]
    key_columns: tuple[str, ...]
    has_timestamp_ntz: bool


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """The table's data columns after this batch, and which of them the batch adds."""

    columns: tuple[ColumnSpec, ...]
    added: tuple[ColumnSpec, ...]
    key_columns: tuple[str, ...]
    create: bool
    """The Delta table does not exist yet."""

    def column(self, name: str) -> ColumnSpec:
        return next(column for column in self.columns if column.name == name)


def plan_columns(
    table: TableId, existing: ExistingTable | None, schemas: Sequence[ValueSchema]
) -> ColumnPlan:
    """The union of the table's columns and the batch's writer schemas' columns: the
    table's columns in their order, then new ones in writer-schema order. Raises
    :class:`SchemaChangeError` when the union is not a valid evolution (module docstring).
    """
    name = str(table)
    keys = {schema.key_columns for schema in schemas}
    if existing is not None:
        keys.add(existing.key_columns)
    if len(keys) > 1:
        raise SchemaChangeError(
            name,
            f"key columns changed ({' vs '.join(sorted(map(str, map(list, keys))))}): "
            "rows can no longer be matched; resync the table: python -m capture resync "
            f"{name}, then restart capture (the resync's TRUNCATE replaces the Delta table "
            "and releases it)",
        )
    if not keys:
        raise ValueError("plan_columns needs an existing table or at least one schema")
    columns: dict[str, ColumnSpec] = {}
    if existing is not None:
        columns.update((column.name, column) for column in existing.columns)
    added: list[ColumnSpec] = []
    for schema in schemas:
        for column in schema.columns:
            known = columns.get(column.name)
            if known is None:
                columns[column.name] = column
                added.append(column)
            elif known.data_type != column.data_type:
                raise SchemaChangeError(
                    name,
                    f"column {column.name} changed type from {known.data_type.simpleString()} "
                    f"to {column.data_type.simpleString()}: Delta cannot follow; resync the "
                    f"table: python -m capture resync {name}, then restart capture (the "
                    "resync's TRUNCATE replaces the Delta table and releases it), or add a "
                    "new column at the source instead of retyping",
                )
    # Each name appears once in this list, so any repeat of a folded name is a clash.
    reserved = ", ".join(field.name for field in METADATA_FIELDS)
    seen: dict[str, str] = {}
    for column_name in [*(field.name for field in METADATA_FIELDS), *columns]:
        folded = column_name.lower()
        if folded in seen:
            raise SchemaChangeError(
                name,
                f"column {column_name} collides with column {seen[folded]} in Delta, which "
                f"compares names case-insensitively and reserves {reserved} for apply's "
                "metadata: rename the source column",
            )
        seen[folded] = column_name
    return ColumnPlan(
        columns=tuple(columns.values()),
        added=tuple(added) if existing is not None else (),
        key_columns=next(iter(keys)),
        create=existing is None,
    )


def read_existing_table(spark: SparkSession, path: str, table: TableId) -> ExistingTable | None:
    """The apply-created Delta table at ``path``, or None when there is none yet."""
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    delta = DeltaTable.forPath(spark, path)
    detail = delta.detail().select("properties").head()
    properties: dict[str, str] = (detail[0] if detail is not None else None) or {}
    return existing_table(path, table, properties, delta.toDF().schema.fields)


def existing_table(
    path: str, table: TableId, properties: Mapping[str, str], fields: Sequence[StructField]
) -> ExistingTable:
    """The apply-created table at ``path`` from its properties and schema, however they
    were read (Spark, or delta-rs in the driver: :mod:`apply.lake.driver_merge`)."""
    if properties.get(TABLE_PROPERTY) != str(table):
        raise TableError(
            str(table),
            f"{path} holds a Delta table that apply did not create for this table (property "
            f"{TABLE_PROPERTY} is {properties.get(TABLE_PROPERTY)!r}): move it away or point "
            "the lake root elsewhere",
        )
    key_columns = tuple(json.loads(properties.get(KEY_COLUMNS_PROPERTY, "[]")))
    metadata = {field.name for field in METADATA_FIELDS}
    return ExistingTable(
        columns=tuple(
            ColumnSpec(field.name, field.dataType, key=field.name in key_columns)
            for field in fields
            if field.name not in metadata
        ),
        key_columns=key_columns,
        has_timestamp_ntz=any(_contains_timestamp_ntz(field.dataType) for field in fields),
    )


def _contains_timestamp_ntz(data_type: DataType) -> bool:
    if isinstance(data_type, TimestampNTZType):
        return True
    if isinstance(data_type, ArrayType):
        return _contains_timestamp_ntz(data_type.elementType)
    return False


def support_timestamp_ntz(spark: SparkSession, path: str, columns: Sequence[ColumnSpec]) -> None:
    """Turn on the ``timestampNtz`` feature of the existing Delta table at ``path`` when
    ``columns`` hold a zone-less timestamp: Delta turns it on by itself only when a table
    is created with one."""
    if any(_contains_timestamp_ntz(column.data_type) for column in columns):
        DeltaTable.forPath(spark, path).addFeatureSupport(_TIMESTAMP_NTZ_FEATURE)


def table_schema(columns: Sequence[ColumnSpec]) -> StructType:
    """The full Delta schema: data columns, then the metadata columns."""
    return StructType(
        [StructField(column.name, column.data_type, nullable=True) for column in columns]
        + list(METADATA_FIELDS)
    )


def table_properties(
    table: TableId, key_columns: Sequence[str], *, deletion_vectors: bool
) -> dict[str, str]:
    """The properties apply gives a table it creates, whichever writer creates it: the
    table it mirrors, its key, and deletion vectors on or off explicitly, whatever the
    session's defaults."""
    return {
        TABLE_PROPERTY: str(table),
        KEY_COLUMNS_PROPERTY: json.dumps(list(key_columns)),
        DELETION_VECTORS_PROPERTY: "true" if deletion_vectors else "false",
    }


def ensure_table(
    spark: SparkSession,
    path: str,
    table: TableId,
    plan: ColumnPlan,
    existing: ExistingTable | None,
    *,
    deletion_vectors: bool = False,
) -> None:
    """Create the Delta table, or add the plan's new columns to it. A table is created
    with deletion vectors only when ``deletion_vectors`` says so, whatever the session's
    defaults: a table with them takes every batch through Spark's MERGE
    (:mod:`apply.lake.driver_merge`).

    Both are commits of their own, before the batch's MERGE, and both are idempotent: a
    replayed batch finds the table and its columns in place and commits nothing. They
    run while no transaction id is set, so they never consume the batch's ``txnVersion``.
    The caller holds the table's lock (:mod:`apply.lake.table_lock`).
    """
    if plan.create or plan.added:
        TABLE_LOCKS.require(path, "a table's creation or new columns")
    if plan.create:
        builder = (
            DeltaTable.createIfNotExists(spark)
            .location(path)
            .addColumns(table_schema(plan.columns))
        )
        properties = table_properties(table, plan.key_columns, deletion_vectors=deletion_vectors)
        for key, value in properties.items():
            builder = builder.property(key, value)
        builder.execute()
        return
    if not plan.added:
        return
    adds_timestamp_ntz = any(_contains_timestamp_ntz(column.data_type) for column in plan.added)
    if adds_timestamp_ntz and existing is not None and not existing.has_timestamp_ntz:
        # Delta enables this feature by itself only when a table is created with it.
        DeltaTable.forPath(spark, path).addFeatureSupport(_TIMESTAMP_NTZ_FEATURE)
    # An empty append with mergeSchema adds the columns through the DataFrame API, with
    # no SQL text to compose.
    (
        spark.createDataFrame([], table_schema(plan.columns))
        .write.format("delta")
        .mode("append")
        .option("mergeSchema", "true")
        .save(path)
    )


def prepare_replacement(
    spark: SparkSession, path: str, plan: ColumnPlan, existing: ExistingTable
) -> None:
    """Ready the table for a replacement by ``plan``'s columns (:mod:`apply.batch.superseded`):
    the table features and key-column property the new columns need, which an overwrite
    cannot set. Idempotent commits of their own, before the replacement, like the
    evolution in :func:`ensure_table`: should the replacement not follow, the next
    attempt plans against the new key and replaces again, or, when the types now fit,
    merges the same batch with its TRUNCATE, which leaves the same rows. The caller
    holds the table's lock (:mod:`apply.lake.table_lock`)."""
    TABLE_LOCKS.require(path, "a replacement's table features and key columns")
    adds_timestamp_ntz = any(_contains_timestamp_ntz(column.data_type) for column in plan.columns)
    if adds_timestamp_ntz and not existing.has_timestamp_ntz:
        DeltaTable.forPath(spark, path).addFeatureSupport(_TIMESTAMP_NTZ_FEATURE)
    if plan.key_columns != existing.key_columns:
        # Spark has no API for a table property of an existing table, and neither
        # TBLPROPERTIES nor ALTER TABLE's name take parameter markers (Spark 4.0), so this
        # is SQL text: the path as a quoted identifier (backticks doubled), the value a
        # JSON array of Avro names, [A-Za-z_][A-Za-z0-9_]* (checked): nothing to escape.
        keys = json.dumps(list(plan.key_columns))
        if not all(_AVRO_NAME.fullmatch(name) for name in plan.key_columns):
            raise ValueError(f"key columns {keys} are not Avro names")
        quoted = "`" + path.replace("`", "``") + "`"
        spark.sql(
            f"ALTER TABLE delta.{quoted} SET TBLPROPERTIES ('{KEY_COLUMNS_PROPERTY}' = '{keys}')"
        )
