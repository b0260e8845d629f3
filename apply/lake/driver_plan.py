"""A batch collected to the driver, decoded and reduced to the latest change per key.

A small batch's time was Spark's fixed cost per job (planning, scheduling, a task per
partition), not its data (docs/benchmarks.md). So a batch of at most
``lake.driver_write_records`` records is held in the driver once
(:mod:`apply.batch.micro_batch`), and each table's part takes the steps the JVM takes,
as plain Python over those records, before :mod:`apply.lake.driver_merge` MERGEs it with
delta-rs:

1. **decode** (:func:`decode_records`): fastavro, with the writer schema's dates, times,
   timestamps and UUIDs read as their physical Avro values, so every value is the exact
   integer or text ``from_avro`` hands Spark (PostgreSQL's infinities included, which
   Python's ``date`` and ``datetime`` cannot hold), and decimals as ``Decimal``. Where
   the ``capture_native`` extension is built, its ``ChangeDecoder`` decodes instead,
   with the same results (``native/src/change_decoder.rs``; fastavro stays for a schema
   it does not read and where it is not built);
2. **measure** (:func:`measure_changes`): per partition the newest position and its
   commit time, replays, TRUNCATEs and malformed records, as
   :func:`apply.lake.spark_merge.measure` does;
3. **the latest change per key** (:func:`latest_changes`) after the replay filter and
   the newest applied TRUNCATE, as :func:`apply.lake.spark_merge.merge_source` does;
4. **Arrow arrays** (:func:`change_arrays`) in the table's types, as Delta holds them.

Only the batches the driver is sure to write exactly as Spark would take this path
(:func:`apply.batch.write.plan_in_driver` checks), and only on a lake delta-rs can
commit to beside Spark: a local file system, or S3 (:mod:`apply.lake.driver_store`).
``tests/integration/test_apply_driver_merge.py``
writes the same records both ways and compares the tables column by column.

One difference is deliberate: Java's Avro decoder reads a body cut inside a trailing
number as if the missing bytes were zeros (:mod:`apply.lake.decode`); fastavro refuses it,
so such a record is malformed here and the table is parked, where the JVM would have
written the zeros. The compiled decoder also refuses a varint longer than 10 bytes, as
the JVM does, where fastavro reads one (no writer produces it).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped]
from fastavro import parse_schema, schemaless_reader
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
    TimestampNTZType,
    TimestampType,
)

from apply.lake.delta_schema import (
    COMMIT_LSN_COLUMN,
    COMMIT_TS_COLUMN,
    ORDINAL_COLUMN,
    ColumnSpec,
    ValueSchema,
)
from apply.lake.positions import AppliedState, Position
from apply.lake.spark_merge import BatchMeasure, PartitionMeasure
from schemas import registry_framing
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.single_object import FINGERPRINT_SIZE, HEADER_SIZE, MARKER, fingerprint_bytes

if TYPE_CHECKING:
    from capture_native import ChangeDecoder, DecodedFields

try:
    from capture_native import ChangeDecoder as _Compiled

    _COMPILED: type[ChangeDecoder] | None = _Compiled
except ImportError:  # not built here: fastavro decodes every record
    _COMPILED = None

log = logging.getLogger(__name__)

_REGISTRY_KEY_PAD = bytes(FINGERPRINT_SIZE - registry_framing.ID_SIZE)
_TRUNCATE = Operation.TRUNCATE.value
_DELETE = Operation.DELETE.value


@dataclass(frozen=True, slots=True)
class CollectedRecord:
    """One record of the batch as the driver holds it: a change topic's value and where
    it sits. Tombstones are not collected (the survey counted them)."""

    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True, slots=True)
class DecodedChange:
    """One decoded record: the envelope, and the row projected onto the table's columns
    (the ``after`` image, or ``before`` when there is none: a DELETE's key)."""

    partition: int
    offset: int
    op: str
    position: Position
    commit_ts: int
    """Microseconds since 1970-01-01 UTC."""
    unchanged: tuple[str, ...]
    row: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class DecodedRecords:
    changes: tuple[DecodedChange, ...]
    malformed: Mapping[int, tuple[int, int]]
    """Per partition: how many records did not decode, and the first one's offset."""


def _physical(schema: Any) -> Any:
    """``schema`` with every logical type but ``decimal`` read as its physical Avro type
    (module docstring, step 1)."""
    if isinstance(schema, dict):
        if "logicalType" in schema and schema["logicalType"] != "decimal":
            return {k: _physical(v) for k, v in schema.items() if k != "logicalType"}
        return {k: _physical(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_physical(item) for item in schema]
    return schema


@lru_cache(maxsize=256)
def _reader_schema(decode_json: str) -> Any:
    """The parsed schema fastavro decodes with, once per writer schema. Each is parsed
    with names of its own: two tables' ``Row`` records may share a full name."""
    return parse_schema(_physical(json.loads(decode_json)), named_schemas={})


def _body(value: bytes, key: bytes) -> bytes | None:
    """The Avro body of ``value`` when its header names writer key ``key``; None for
    another writer or a value with neither framing (apply.lake.decode, the two framings)."""
    if len(value) >= HEADER_SIZE and value[: len(MARKER)] == MARKER:
        return value[HEADER_SIZE:] if value[len(MARKER) : HEADER_SIZE] == key else None
    magic = registry_framing.MAGIC
    if len(value) >= registry_framing.HEADER_SIZE and value[: len(magic)] == magic:
        registry_key = _REGISTRY_KEY_PAD + value[len(magic) : registry_framing.HEADER_SIZE]
        return value[registry_framing.HEADER_SIZE :] if registry_key == key else None
    return None


def _decode(
    record: CollectedRecord, key: bytes, parsed: Any, names: Sequence[str | None]
) -> DecodedChange | None:
    """One record decoded and projected onto ``names`` (None: a column the writer schema
    lacks); None when it does not decode, or its header names another writer.

    The compiled decoder (:func:`_compiled_decoder`) gives the same for every record:
    tests/unit/apply/test_driver_plan_native.py holds the two equal."""
    body = _body(record.value, key)
    if body is None:
        return None
    try:
        # A Change record decodes to a dict (its schema says so; fastavro's type is wider).
        value: dict[str, Any] = schemaless_reader(io.BytesIO(body), parsed, None)  # type: ignore[assignment]
        image = value["after"] if value["after"] is not None else value["before"]
        return DecodedChange(
            partition=record.partition,
            offset=record.offset,
            op=str(value["op"]),
            position=Position(Lsn(int(value["commit_lsn"])), int(value["ordinal"])),
            commit_ts=int(value["commit_ts"]),
            unchanged=tuple(value["unchanged_columns"] or ()),
            row=tuple(None if name is None or image is None else image.get(name) for name in names),
        )
    except Exception:  # any failure to decode is this record's: the caller names its offset
        return None


@lru_cache(maxsize=256)
def _compiled_decoder(
    decode_json: str, key: bytes, names: tuple[str | None, ...]
) -> ChangeDecoder | None:
    """The compiled decoder of a writer schema and projection, once per both; None
    without the extension or for a schema it does not read (fastavro decodes those).

    It gives what :func:`_decode` gives for every record:
    tests/unit/apply/test_driver_plan_native.py holds the two equal."""
    if _COMPILED is None:
        return None
    try:
        return _COMPILED(decode_json, key, list(names))
    except ValueError as exc:
        log.info("driver decode of a writer schema by fastavro: %s", exc)
        return None


def _change(record: CollectedRecord, fields: DecodedFields | None) -> DecodedChange | None:
    if fields is None:
        return None
    return DecodedChange(
        partition=record.partition,
        offset=record.offset,
        op=fields.op,
        position=Position(Lsn(fields.commit_lsn), fields.ordinal),
        commit_ts=fields.commit_ts,
        unchanged=fields.unchanged,
        row=fields.row,
    )


def decode_records(
    records: Iterable[CollectedRecord], schema: ValueSchema, columns: Sequence[ColumnSpec]
) -> DecodedRecords:
    """The records of one writer schema, decoded and projected onto ``columns`` (a
    column the writer schema lacks is None). A record that does not decode, or whose
    header names another writer, counts as malformed."""
    # Parsed even for the compiled decoder: a schema fastavro refuses fails the batch
    # as it always did.
    parsed = _reader_schema(schema.decode_json)
    key = fingerprint_bytes(schema.fingerprint)
    present = {column.name for column in schema.columns}
    names = [column.name if column.name in present else None for column in columns]
    compiled = _compiled_decoder(schema.decode_json, key, tuple(names))
    decoded: Iterable[tuple[CollectedRecord, DecodedChange | None]]
    if compiled is None:
        decoded = ((record, _decode(record, key, parsed, names)) for record in records)
    else:
        held = list(records)
        fields = compiled.decode([record.value for record in held])
        decoded = (
            (record, _change(record, item)) for record, item in zip(held, fields, strict=True)
        )
    changes = []
    malformed: dict[int, tuple[int, int]] = {}
    for record, change in decoded:
        if change is None:
            count, first = malformed.get(record.partition, (0, record.offset))
            malformed[record.partition] = (count + 1, min(first, record.offset))
        else:
            changes.append(change)
    return DecodedRecords(changes=tuple(changes), malformed=malformed)


def _applied_positions(previous: AppliedState | None, topic: str) -> dict[int, Position]:
    if previous is None:
        return {}
    return {
        partition: progress.position
        for (state_topic, partition), progress in previous.partitions.items()
        if state_topic == topic and progress.position is not None
    }


def measure_changes(
    decoded: DecodedRecords, previous: AppliedState | None, topic: str
) -> BatchMeasure:
    """:func:`apply.lake.spark_merge.measure` over decoded records, in the driver."""
    applied = _applied_positions(previous, topic)
    newest: dict[int, DecodedChange] = {}
    replays: dict[int, int] = {}
    truncates: dict[int, int] = {}
    truncate: dict[int, Position] = {}
    unchanged: set[str] = set()
    for change in decoded.changes:
        partition = change.partition
        best = newest.get(partition)
        if best is None or change.position > best.position:
            newest[partition] = change
        before = applied.get(partition)
        if before is not None and change.position <= before:
            replays[partition] = replays.get(partition, 0) + 1
            continue
        unchanged.update(change.unchanged)
        if change.op == _TRUNCATE:
            truncates[partition] = truncates.get(partition, 0) + 1
            if partition not in truncate or change.position > truncate[partition]:
                truncate[partition] = change.position
    partitions = {}
    for partition in sorted(set(newest) | set(decoded.malformed)):
        best = newest.get(partition)
        bad, first_bad = decoded.malformed.get(partition, (0, None))
        partitions[partition] = PartitionMeasure(
            position=None if best is None else best.position,
            commit_ts=None if best is None else best.commit_ts,
            replays=replays.get(partition, 0),
            truncates=truncates.get(partition, 0),
            truncate=truncate.get(partition),
            malformed=bad,
            first_malformed=first_bad,
        )
    return BatchMeasure(partitions=partitions, unchanged_columns=frozenset(unchanged))


def _hashable(value: Any) -> Any:
    return tuple(_hashable(item) for item in value) if isinstance(value, list) else value


def latest_changes(
    decoded: DecodedRecords,
    previous: AppliedState | None,
    topic: str,
    *,
    key_indexes: Sequence[int],
    erased_before: Position | None,
    columns: Sequence[str] = (),
    unchanged_columns: frozenset[str] = frozenset(),
) -> list[DecodedChange]:
    """The newest change of every key, leaving out replays, TRUNCATEs and changes
    positioned at or before ``erased_before``, in position order: the rows of
    :func:`apply.lake.spark_merge.merge_source`.

    A column an UPDATE left unchanged (TOAST; ``unchanged_columns`` names the batch's,
    ``columns`` the row's order) takes its value from the newest change of the key in the
    batch that carried it; where none did, it stays in the change's ``unchanged``, and
    the MERGE keeps the table's value (:func:`apply.lake.driver_merge.merge_rows`)."""
    applied = _applied_positions(previous, topic)
    keys = {columns[index] for index in key_indexes} if columns else set()
    folded = [
        (index, name)
        for index, name in enumerate(columns)
        if name in unchanged_columns and name not in keys
    ]
    latest: dict[tuple[Any, ...], DecodedChange] = {}
    carried: dict[tuple[Any, ...], dict[int, tuple[Position, Any]]] = {}
    for change in decoded.changes:
        if change.op == _TRUNCATE:
            continue
        before = applied.get(change.partition)
        if before is not None and change.position <= before:
            continue
        if erased_before is not None and change.position <= erased_before:
            continue
        key = tuple(_hashable(change.row[index]) for index in key_indexes)
        known = latest.get(key)
        if known is None or change.position > known.position:
            latest[key] = change
        if folded and change.op != _DELETE:
            values = carried.setdefault(key, {})
            for index, name in folded:
                if name in change.unchanged:
                    continue
                held = values.get(index)
                if held is None or change.position > held[0]:
                    values[index] = (change.position, change.row[index])
    if not folded:
        return sorted(latest.values(), key=lambda change: change.position)
    resolved = []
    for key, change in latest.items():
        values = carried.get(key, {})
        row = list(change.row)
        still: list[str] = []
        for index, name in folded:
            held = values.get(index)
            row[index] = None if held is None else held[1]
            if row[index] is None and name in change.unchanged:
                still.append(name)
        resolved.append(replace(change, row=tuple(row), unchanged=tuple(still)))
    return sorted(resolved, key=lambda change: change.position)


class DriverWriteUnavailableError(Exception):
    """The driver cannot write these changes exactly as Spark would; the batch takes
    Spark's path."""


def _arrow_types(data_type: DataType) -> tuple[Any, Any]:
    """The Arrow type a decoded value is built in, and the one the table's column has."""
    simple: list[tuple[type[DataType], Any, Any]] = [
        (BooleanType, pa.bool_(), pa.bool_()),
        (IntegerType, pa.int32(), pa.int32()),
        (LongType, pa.int64(), pa.int64()),
        (FloatType, pa.float32(), pa.float32()),
        (DoubleType, pa.float64(), pa.float64()),
        (BinaryType, pa.binary(), pa.binary()),
        (StringType, pa.string(), pa.string()),
        (DateType, pa.int32(), pa.date32()),
        (TimestampType, pa.int64(), pa.timestamp("us", tz="UTC")),
        (TimestampNTZType, pa.int64(), pa.timestamp("us")),
    ]
    for spark_kind, built, final in simple:
        if isinstance(data_type, spark_kind):
            return built, final
    if isinstance(data_type, DecimalType):
        decimal = pa.decimal128(data_type.precision, data_type.scale)
        return decimal, decimal
    if isinstance(data_type, ArrayType):
        built, final = _arrow_types(data_type.elementType)
        return pa.list_(built), pa.list_(final)
    raise DriverWriteUnavailableError(f"no Arrow mapping for {data_type.simpleString()}")


# delta-rs computes each file's min/max statistics as calendar values, and a date or
# timestamp far outside the years 1 to 9999 overflows there (PostgreSQL's infinities,
# which the contract carries as the integer extremes); such batches take the JVM path.
_DATE_DAYS = 3_000_000
_TIMESTAMP_MICROS = _DATE_DAYS * 86_400_000_000


def _in_calendar(values: list[Any], data_type: DataType) -> bool:
    if isinstance(data_type, ArrayType):
        return all(v is None or _in_calendar(v, data_type.elementType) for v in values)
    if isinstance(data_type, DateType):
        bound = _DATE_DAYS
    elif isinstance(data_type, (TimestampType, TimestampNTZType)):
        bound = _TIMESTAMP_MICROS
    else:
        return True
    return all(v is None or -bound <= v <= bound for v in values)


def _column(values: list[Any], data_type: DataType) -> Any:
    if not _in_calendar(values, data_type):
        raise DriverWriteUnavailableError(
            f"a {data_type.simpleString()} value is outside the calendar delta-rs computes "
            "file statistics in (PostgreSQL's infinity)"
        )
    built, final = _arrow_types(data_type)
    array = pa.array(values, type=built)
    return array if built == final else array.cast(final)


def change_arrays(
    changes: Sequence[DecodedChange], columns: Sequence[ColumnSpec]
) -> dict[str, Any]:
    """``changes`` as Arrow arrays, one per column of the table: the data columns in the
    table's types, then the position and the commit time, as Delta holds them."""
    arrays: dict[str, Any] = {
        column.name: _column([change.row[index] for change in changes], column.data_type)
        for index, column in enumerate(columns)
    }
    arrays[COMMIT_LSN_COLUMN] = pa.array(
        [int(change.position.commit_lsn) for change in changes], type=pa.int64()
    )
    arrays[ORDINAL_COLUMN] = pa.array([change.position.ordinal for change in changes], pa.int64())
    arrays[COMMIT_TS_COLUMN] = _column([change.commit_ts for change in changes], TimestampType())
    return arrays


def table_arrow_types(columns: Sequence[ColumnSpec]) -> dict[str, Any]:
    """The Arrow type of each column of a table with ``columns``, as :func:`change_arrays`
    builds them: the data columns, then the position and the commit time."""
    types = {column.name: _arrow_types(column.data_type)[1] for column in columns}
    types[COMMIT_LSN_COLUMN] = pa.int64()
    types[ORDINAL_COLUMN] = pa.int64()
    types[COMMIT_TS_COLUMN] = _arrow_types(TimestampType())[1]
    return types


__all__ = [
    "CollectedRecord",
    "DecodedChange",
    "DecodedRecords",
    "DriverWriteUnavailableError",
    "change_arrays",
    "decode_records",
    "latest_changes",
    "measure_changes",
    "table_arrow_types",
]
