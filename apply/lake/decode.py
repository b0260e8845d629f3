"""Decode a micro-batch of Kafka records on the JVM.

Input: the DataFrame ``foreachBatch`` receives from Spark's Kafka source (``topic``,
``partition``, ``offset``, ``key``, ``value`` ...). Every non-null value is framed in one
of two ways (docs/wire-contract.md), decided per record by its first byte, so a topic
may hold both after a deployment switched its encoding:

- Avro single-object encoding: ``C3 01``, the writer fingerprint in bytes 2..9, then the
  Avro body (a 10-byte header);
- Schema Registry wire format: ``00``, the registered schema's id in bytes 1..4
  (big-endian), then the same Avro body (a 5-byte header).

Records are grouped by their *writer key* (:mod:`schemas.registry_framing`): the
fingerprint, or four zero bytes and the registry id. The caller resolves writer keys to
schema JSON: fingerprints from the schema topic, registry ids through the registry
(``apply.control.feedback.SchemaCatalog``).

Two steps, both on the JVM, no Python UDF:

1. :func:`survey` -- one small aggregation over the batch: per topic-partition the
   record count, the next offset, tombstones (null values, skipped: the DELETE before
   them says everything), records with neither header, and the writer keys present.
2. :func:`decode_topic` -- per writer key, the records are selected by comparing the
   key's binary slice (``substring(value, 3, 8)``, or four zero bytes and
   ``substring(value, 2, 4)``) with the key's bytes and decoded with
   ``from_avro(<value after its header>, <writer schema JSON>)``. Each group is
   projected onto the table's columns (a column its schema lacks is null), so records of
   several writer schemas of one table -- a column added mid-batch -- combine into one
   DataFrame.

``from_avro`` runs in ``PERMISSIVE`` mode: a body that does not decode comes back
without an ``op`` and is flagged ``malformed`` instead of failing the whole batch with
an opaque Spark error, so the caller can name the table and the offset. Java Avro's
decoder is lenient in two ways this cannot see: bytes after the end of the body are
ignored, and a body cut inside a trailing number reads the missing bytes as zeros.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf
from pyspark.sql.avro.functions import from_avro

from apply.lake.delta_schema import ColumnSpec, ValueSchema
from schemas import registry_framing
from schemas.single_object import (
    FINGERPRINT_SIZE,
    HEADER_SIZE,
    MARKER,
    Fingerprint,
    fingerprint_bytes,
    format_fingerprint,
)

RECORD_COLUMNS = ("topic", "partition", "offset", "value")
"""The columns of Spark's Kafka source that surveying and decoding read."""

_TOMBSTONE = "tombstone"
_NO_HEADER = "no-header"

# Columns of a decoded DataFrame (besides "partition" and "offset").
MALFORMED = "malformed"
OP = "op"
COMMIT_LSN = "commit_lsn"
ORDINAL = "ordinal"
COMMIT_TS = "commit_ts"
UNCHANGED = "unchanged"
ROW = "row"


@dataclass(frozen=True, slots=True)
class PartitionSurvey:
    records: int
    next_offset: int
    """Highest offset of the partition in the batch, plus one."""
    tombstones: int
    first_without_header: int | None
    """Offset of the first record whose value has neither a single-object nor a registry
    header."""


@dataclass(frozen=True, slots=True)
class TopicSurvey:
    topic: str
    partitions: Mapping[int, PartitionSurvey]
    fingerprints: frozenset[Fingerprint]
    """Writer keys of the topic's non-null values in the batch: fingerprints, and
    :func:`~schemas.registry_framing.writer_key` of each registry id."""

    @property
    def records(self) -> int:
        return sum(partition.records for partition in self.partitions.values())

    @property
    def tombstones(self) -> int:
        return sum(partition.tombstones for partition in self.partitions.values())


@dataclass(slots=True)
class _Tally:
    records: int = 0
    next_offset: int = 0
    tombstones: int = 0
    first_without_header: int | None = None


@contextmanager
def persisted(frame: DataFrame | None) -> Iterator[None]:
    """``frame`` cached while the block runs (memory, spilling to disk), so the actions
    inside compute it once; released afterwards, whatever happens."""
    if frame is None:
        yield
        return
    frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        yield
    finally:
        frame.unpersist()


_REGISTRY_KEY_PAD = bytes(FINGERPRINT_SIZE - registry_framing.ID_SIZE)


def _single_object(value: Column) -> Column:
    return (sf.length(value) >= HEADER_SIZE) & (
        sf.substring(value, 1, len(MARKER)) == sf.lit(MARKER)
    )


def _registry(value: Column) -> Column:
    return (sf.length(value) >= registry_framing.HEADER_SIZE) & (
        sf.substring(value, 1, len(registry_framing.MAGIC)) == sf.lit(registry_framing.MAGIC)
    )


def _writer_key(value: Column) -> Column:
    """The 8 bytes naming the record's writer schema (module docstring); null for a
    value with neither header."""
    return sf.when(
        _single_object(value), sf.substring(value, len(MARKER) + 1, FINGERPRINT_SIZE)
    ).when(
        _registry(value),
        sf.concat(
            sf.lit(_REGISTRY_KEY_PAD),
            sf.substring(value, len(registry_framing.MAGIC) + 1, registry_framing.ID_SIZE),
        ),
    )


def _body(value: Column) -> Column:
    """The Avro body: the value after its header, whichever it is."""
    size = sf.when(_registry(value), sf.lit(registry_framing.HEADER_SIZE)).otherwise(
        sf.lit(HEADER_SIZE)
    )
    return value.substr(size + sf.lit(1), sf.length(value) - size)


def survey(batch: DataFrame) -> dict[str, TopicSurvey]:
    """Per topic, what the batch holds (step 1 of the module docstring); one Spark job."""
    value = sf.col("value")
    key = _writer_key(value)
    kind = (
        sf.when(value.isNull(), sf.lit(_TOMBSTONE))
        .when(key.isNull(), sf.lit(_NO_HEADER))
        .otherwise(sf.lower(sf.hex(key)))
    )
    rows = (
        batch.groupBy("topic", "partition", kind.alias("kind"))
        .agg(
            sf.count(sf.lit(1)).alias("records"),
            sf.min("offset").alias("first_offset"),
            sf.max("offset").alias("last_offset"),
        )
        .collect()
    )
    tallies: dict[str, dict[int, _Tally]] = {}
    fingerprints: dict[str, set[Fingerprint]] = {}
    for row in rows:
        topic, kind_value = row["topic"], row["kind"]
        tally = tallies.setdefault(topic, {}).setdefault(row["partition"], _Tally())
        tally.records += row["records"]
        tally.next_offset = max(tally.next_offset, row["last_offset"] + 1)
        found = fingerprints.setdefault(topic, set())
        if kind_value == _TOMBSTONE:
            tally.tombstones = row["records"]
        elif kind_value == _NO_HEADER:
            tally.first_without_header = row["first_offset"]
        else:
            found.add(Fingerprint(int.from_bytes(bytes.fromhex(kind_value), "little")))
    return _surveys(tallies, fingerprints)


def writer_key(value: bytes) -> bytes | None:
    """:func:`_writer_key` over a value the driver holds: the 8 bytes naming its writer
    schema, None for a value with neither header."""
    if len(value) >= HEADER_SIZE and value[: len(MARKER)] == MARKER:
        return value[len(MARKER) : len(MARKER) + FINGERPRINT_SIZE]
    magic = registry_framing.MAGIC
    if len(value) >= registry_framing.HEADER_SIZE and value[: len(magic)] == magic:
        return _REGISTRY_KEY_PAD + value[len(magic) : registry_framing.HEADER_SIZE]
    return None


def survey_held(records: Iterable[tuple[str, int, int, bytes | None]]) -> dict[str, TopicSurvey]:
    """:func:`survey` of a batch the driver holds, as ``(topic, partition, offset,
    value)``: the same surveys, with no Spark job."""
    tallies: dict[str, dict[int, _Tally]] = {}
    fingerprints: dict[str, set[Fingerprint]] = {}
    for topic, partition, offset, value in records:
        tally = tallies.setdefault(topic, {}).setdefault(partition, _Tally())
        tally.records += 1
        tally.next_offset = max(tally.next_offset, offset + 1)
        found = fingerprints.setdefault(topic, set())
        if value is None:
            tally.tombstones += 1
            continue
        key = writer_key(value)
        if key is None:
            first = tally.first_without_header
            tally.first_without_header = offset if first is None else min(first, offset)
        else:
            found.add(Fingerprint(int.from_bytes(key, "little")))
    return _surveys(tallies, fingerprints)


def _surveys(
    tallies: Mapping[str, Mapping[int, _Tally]], fingerprints: Mapping[str, set[Fingerprint]]
) -> dict[str, TopicSurvey]:
    return {
        topic: TopicSurvey(
            topic=topic,
            partitions={
                partition: PartitionSurvey(
                    records=tally.records,
                    next_offset=tally.next_offset,
                    tombstones=tally.tombstones,
                    first_without_header=tally.first_without_header,
                )
                for partition, tally in partitions.items()
            },
            fingerprints=frozenset(fingerprints[topic]),
        )
        for topic, partitions in tallies.items()
    }


def decode_topic(
    batch: DataFrame,
    topic: str,
    schemas: Sequence[ValueSchema],
    columns: Sequence[ColumnSpec],
    superseded: frozenset[Fingerprint] = frozenset(),
) -> DataFrame:
    """The topic's non-null values decoded (step 2 of the module docstring).

    Columns: ``partition``, ``offset``, ``malformed`` (the body did not decode),
    ``op``, ``commit_lsn``, ``ordinal``, ``commit_ts`` (timestamp), ``unchanged`` (the
    Avro names of unchanged TOAST columns) and ``row``: a struct of ``columns`` taken
    from ``after``, or from ``before`` when there is no ``after`` (a DELETE's key).
    Records of a ``superseded`` writer schema (every one of them positioned before a
    TRUNCATE, :mod:`apply.batch.superseded`) keep their envelope and get a row of nulls: their
    positions still count, their columns need not fit ``columns``.
    """
    if not schemas:
        raise ValueError("decode_topic needs at least one writer schema")
    value = sf.col("value")
    records = batch.where((sf.col("topic") == sf.lit(topic)) & value.isNotNull())
    body = _body(value)
    groups = []
    for schema in schemas:
        present = (
            set()
            if schema.fingerprint in superseded
            else {column.name for column in schema.columns}
        )
        decoded = records.where(
            _writer_key(value) == sf.lit(fingerprint_bytes(schema.fingerprint))
        ).select(
            "partition",
            "offset",
            from_avro(body, schema.decode_json, {"mode": "PERMISSIVE"}).alias("v"),
        )
        image = sf.coalesce(sf.col("v.after"), sf.col("v.before"))
        row = sf.struct(
            *[
                (image[column.name] if column.name in present else sf.lit(None))
                .cast(column.data_type)
                .alias(column.name)
                for column in columns
            ]
        )
        groups.append(
            decoded.select(
                "partition",
                "offset",
                # PERMISSIVE yields a struct of nulls (older Spark: a null struct) for a
                # body that does not decode; a decoded record always has its op.
                sf.col("v.op").isNull().alias(MALFORMED),
                sf.col("v.op").alias(OP),
                sf.col("v.commit_lsn").alias(COMMIT_LSN),
                sf.col("v.ordinal").alias(ORDINAL),
                sf.col("v.commit_ts").alias(COMMIT_TS),
                sf.col("v.unchanged_columns").alias(UNCHANGED),
                row.alias(ROW),
            )
        )
    combined = groups[0]
    for group in groups[1:]:
        combined = combined.unionByName(group)
    return combined


def decode_positions(records: DataFrame, schemas: Sequence[ValueSchema]) -> DataFrame:
    """``records`` (rows of Spark's Kafka source) with ``fingerprint`` (the writer key in
    hex, null without a header of either framing), ``commit_lsn`` and
    ``ordinal`` added: the position, null for a record that does not decode with one of
    ``schemas``. Only the envelope is kept, so a row the table cannot take still gets
    its position."""
    value = sf.col("value")
    key = _writer_key(value)
    has_header = value.isNotNull() & key.isNotNull()
    body = _body(value)
    position = sf.lit(None).cast("struct<commit_lsn:bigint,ordinal:bigint>")
    for schema in schemas:
        decoded = from_avro(body, schema.decode_json, {"mode": "PERMISSIVE"})
        position = sf.when(
            has_header & (key == sf.lit(fingerprint_bytes(schema.fingerprint))),
            sf.struct(
                decoded["commit_lsn"].cast("bigint").alias(COMMIT_LSN),
                decoded["ordinal"].cast("bigint").alias(ORDINAL),
            ),
        ).otherwise(position)
    return records.select(
        "*",
        sf.when(has_header, sf.lower(sf.hex(key))).alias("fingerprint"),
        position[COMMIT_LSN].alias(COMMIT_LSN),
        position[ORDINAL].alias(ORDINAL),
    )


def decode_envelopes(batch: DataFrame, topic: str, schemas: Sequence[ValueSchema]) -> DataFrame:
    """The topic's non-null values as their envelope only: ``partition``, ``fingerprint``
    (the writer key, 16 hex digits), ``op``, ``commit_lsn`` and ``ordinal``; null
    fields for a body that does not decode. No row is decoded, so records of writer
    schemas the table cannot take still get their positions."""
    if not schemas:
        raise ValueError("decode_envelopes needs at least one writer schema")
    value = sf.col("value")
    records = batch.where((sf.col("topic") == sf.lit(topic)) & value.isNotNull())
    body = _body(value)
    groups = []
    for schema in schemas:
        decoded = records.where(
            _writer_key(value) == sf.lit(fingerprint_bytes(schema.fingerprint))
        ).select(
            "partition",
            from_avro(body, schema.decode_json, {"mode": "PERMISSIVE"}).alias("v"),
        )
        groups.append(
            decoded.select(
                "partition",
                sf.lit(format_fingerprint(schema.fingerprint)).alias("fingerprint"),
                sf.col("v.op").alias(OP),
                sf.col("v.commit_lsn").cast("bigint").alias(COMMIT_LSN),
                sf.col("v.ordinal").cast("bigint").alias(ORDINAL),
            )
        )
    combined = groups[0]
    for group in groups[1:]:
        combined = combined.unionByName(group)
    return combined
