"""The Spark side of verify: the Delta table at one version, hashed like the source.

Each lake table is read at a fixed version (its newest once the pipeline's slot passed
the verify point), so the bucket pass and the key fetches of a round see the same rows.
Row texts and md5s are Spark SQL expressions (:mod:`pipeline.verify.canonical`); only
aggregates and the keys of differing buckets reach the driver.

Columns: the source's published columns are compared with the lake's data columns of
the same names. A source column the lake lacks (or holds with another type) prints
:data:`~pipeline.verify.canonical.ABSENT_TEXT` on the lake side, so every row differs
and the table's notes say why; lake columns the source no longer has (dropped there,
kept by apply with nulls) are not compared. Spark and Delta errors are translated to
:mod:`apply.errors` classes at this boundary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from delta.tables import DeltaTable
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import DataType, DecimalType, StringType, StructField, StructType

from apply.errors import ConfigError, TableError
from apply.lake.dead_letter import errored_tables
from apply.lake.delta_schema import (
    COMMIT_LSN_COLUMN,
    KEY_COLUMNS_PROPERTY,
    METADATA_FIELDS,
    spark_type,
)
from apply.lake.tables import TableId, table_path
from pipeline.verify.canonical import (
    CanonColumn,
    lake_bucket,
    lake_md5,
    lake_row,
    lake_value60,
)
from pipeline.verify.compare import BucketStats, LakeRow
from pipeline.verify.source import TableShape

_UTC = {"UTC", "Etc/UTC", "+00:00", "Z"}


def check_session(spark: SparkSession) -> None:
    """The canonical forms need the session time zone UTC (timestamp without time zone
    is read as UTC microseconds)."""
    zone = spark.conf.get("spark.sql.session.timeZone")
    if zone not in _UTC:
        raise ConfigError(
            f"the Spark session time zone is {zone}: verify needs "
            "spark.sql.session.timeZone=UTC (apply's session sets it)"
        )


@dataclass(frozen=True, slots=True)
class LakeTable:
    path: str
    version: int
    frame: DataFrame
    """The table at :attr:`version`."""
    key_columns: tuple[str, ...]
    """Apply's record of the key (table property ``pgdelta.keyColumns``)."""
    column_types: dict[str, DataType]
    """Data columns (metadata columns left out)."""


@contextmanager
def _spark_errors(table: str) -> Iterator[None]:
    try:
        yield
    except (PySparkException, Py4JError) as exc:
        raise TableError(table, f"reading its Delta table failed: {exc}") from exc


def open_table(spark: SparkSession, lake_root: str, table: TableId) -> LakeTable | None:
    """The table's newest Delta version, or None when it has no Delta table."""
    path = table_path(lake_root, table)
    with _spark_errors(str(table)):
        if not DeltaTable.isDeltaTable(spark, path):
            return None
        delta = DeltaTable.forPath(spark, path)
        newest = delta.history(1).select("version").head()
        if newest is None:
            return None
        version = int(newest[0])
        detail = delta.detail().select("properties").head()
        properties: dict[str, str] = (detail[0] if detail is not None else None) or {}
        frame = spark.read.format("delta").option("versionAsOf", version).load(path)
        key_columns = tuple(json.loads(properties.get(KEY_COLUMNS_PROPERTY, "[]")))
        metadata = {field.name for field in METADATA_FIELDS}
        return LakeTable(
            path=path,
            version=version,
            frame=frame,
            key_columns=key_columns,
            column_types={
                field.name: field.dataType
                for field in frame.schema.fields
                if field.name not in metadata
            },
        )


def has_table(spark: SparkSession, lake_root: str, table: TableId) -> bool:
    with _spark_errors(str(table)):
        return bool(DeltaTable.isDeltaTable(spark, table_path(lake_root, table)))


def errored(spark: SparkSession, dead_letter: str) -> dict[str, str]:
    """Errored tables (apply's dead-letter table) and the error that parked each."""
    with _spark_errors("dead-letter"):
        return {name: found.error for name, found in errored_tables(spark, dead_letter).items()}


def absent_columns(lake: LakeTable, columns: Sequence[CanonColumn]) -> dict[str, str]:
    """Source columns the lake cannot be compared on, each with the reason."""
    absent: dict[str, str] = {}
    for column in columns:
        found = lake.column_types.get(column.name)
        expected = spark_type(column.column_type.avro())
        if found is None:
            absent[column.name] = (
                f"column {column.name} is not in the lake table: every row differs; apply "
                "adds a column with the first change that carries it"
            )
        elif found != expected:
            absent[column.name] = (
                f"column {column.name} is {found.simpleString()} in the lake but the source "
                f"publishes {expected.simpleString()}: every row differs; resync the table"
            )
    return absent


def hashed(lake: LakeTable, shape: TableShape, absent: Sequence[str]) -> DataFrame:
    """``k`` (key text), ``h`` (row md5), ``p`` (commit LSN) per lake row."""
    return lake.frame.select(
        sf.expr(lake_row(shape.key_columns)).alias("k"),
        sf.expr(lake_md5(lake_row(shape.columns, frozenset(absent)))).alias("h"),
        sf.col(COMMIT_LSN_COLUMN).alias("p"),
    )


def row_count(lake: LakeTable, table: str) -> int:
    with _spark_errors(table):
        return int(lake.frame.count())


def bucket_stats(frame: DataFrame, buckets: int, table: str) -> dict[int, BucketStats]:
    with _spark_errors(table):
        rows = (
            frame.select(
                sf.expr(lake_bucket(lake_md5("k"), buckets)).alias("b"),
                sf.expr(lake_value60("h")).cast(DecimalType(38, 0)).alias("v"),
            )
            .groupBy("b")
            .agg(sf.count(sf.lit(1)).alias("n"), sf.sum("v").alias("s"))
            .collect()
        )
    return {int(row["b"]): BucketStats(int(row["n"]), int(row["s"])) for row in rows}


def _key_rows(frame: DataFrame, table: str) -> dict[str, LakeRow]:
    with _spark_errors(table):
        rows = (
            frame.groupBy("k", "h")
            .agg(sf.count(sf.lit(1)).alias("n"), sf.max("p").alias("p"))
            .collect()
        )
    found: dict[str, LakeRow] = {}
    for row in rows:
        key = str(row["k"])
        if key in found:  # one key, two different rows: a duplicate key in the lake
            previous = found[key]
            found[key] = LakeRow("<duplicate key>", max(previous.commit_lsn, row["p"] or 0), 2)
            continue
        found[key] = LakeRow(str(row["h"]), int(row["p"] or 0), int(row["n"]))
    return found


def rows_in_buckets(
    frame: DataFrame, buckets: int, chosen: Sequence[int], table: str
) -> dict[str, LakeRow]:
    in_buckets = frame.where(
        sf.expr(lake_bucket(lake_md5("k"), buckets)).isin([int(b) for b in chosen])
    )
    return _key_rows(in_buckets, table)


def rows_of_keys(
    spark: SparkSession, frame: DataFrame, keys: Sequence[str], table: str
) -> dict[str, LakeRow]:
    with _spark_errors(table):
        wanted = spark.createDataFrame(
            [(key,) for key in keys], StructType([StructField("k", StringType(), False)])
        )
    return _key_rows(frame.join(sf.broadcast(wanted), "k", "left_semi"), table)
