"""What ``python -m pipeline verify`` costs per side on a big table.

Usage: ``.venv/bin/python -m bench.verify_cost [--rows N] [--dsn DSN]``
(DSN default: ``CDC_POSTGRES_DSN``, else the local stack started by ``make up``).

On the local PostgreSQL, in a fresh schema: a table of N rows (``id bigint`` primary
key, ``note text``, ``amount numeric(12,2)``, ``at timestamptz``, ``score float8``);
in a temporary directory, a Delta table holding the same rows with apply's metadata
columns, written by Spark from the same formulas. Then verify's bucket pass runs on
each side alone, as verify runs it (same number of buckets, ~1,000 rows each):

- **source**: every row's canonical text, md5, bucket and 60-bit sum, aggregated in
  PostgreSQL, in a REPEATABLE READ transaction with capture's session settings;
- **lake**: the same in Spark over the Delta table's newest version.

Each side is timed against reading the table once (``count(*)``) on the same side, the
floor under any full comparison. The buckets of the two sides must be equal (the run
fails otherwise). Everything created is dropped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid

import psycopg
from psycopg import sql

from apply.engine.spark_session import build_session
from apply.lake.delta_schema import KEY_COLUMNS_PROPERTY, TABLE_PROPERTY
from apply.lake.tables import TableId, table_path
from apply.settings import SparkSettings
from capture.source.setup import TableRef
from deploy.local import jars, stack
from pipeline.verify import lake as lake_side
from pipeline.verify import source as source_side
from pipeline.verify.compare import bucket_count, differing_buckets


def _dsn(given: str | None) -> str:
    if given:
        return given
    if os.environ.get("CDC_POSTGRES_DSN"):
        return os.environ["CDC_POSTGRES_DSN"]
    state = stack.load()
    if state is None:
        raise SystemExit("no PostgreSQL: pass --dsn, set CDC_POSTGRES_DSN, or run make up")
    return state.postgres.dsn


def _load_source(dsn: str, schema: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.t (id bigint PRIMARY KEY, note text, amount numeric(12,2), "
                "at timestamptz, score float8)"
            ).format(sql.Identifier(schema))
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.t SELECT g, 'note ' || g, mod(g, 100000) / 100.0, "
                "timestamptz '2020-01-01 00:00:00+00' + g * interval '1 second', "
                "g::float8 * 0.37::float8 FROM generate_series(1, %s) g"
            ).format(sql.Identifier(schema)),
            [rows],
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}.t").format(sql.Identifier(schema)))


def _load_lake(spark: object, path: str, table: TableId, rows: int) -> None:
    frame = spark.range(1, rows + 1).selectExpr(  # type: ignore[attr-defined]
        "id",
        "concat('note ', id) AS note",
        "cast((id % 100000) / 100.0 AS decimal(12,2)) AS amount",
        "timestamp_micros(unix_micros(timestamp'2020-01-01 00:00:00') + id * 1000000) AS at",
        "cast(id AS double) * cast(0.37 AS double) AS score",
        "cast(1 AS bigint) AS _cdc_commit_lsn",
        "id AS _cdc_ordinal",
        "current_timestamp() AS _cdc_commit_ts",
    )
    frame.write.format("delta").save(path)
    spark.sql(  # type: ignore[attr-defined]
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{TABLE_PROPERTY}' = '{table}', "
        f"'{KEY_COLUMNS_PROPERTY}' = '[\"id\"]')"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.verify_cost")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    dsn = _dsn(args.dsn)
    schema = f"bench_verify_{uuid.uuid4().hex[:8]}"
    ref = TableRef(schema, "t")
    lake_root = tempfile.mkdtemp(prefix="verify-cost-")
    jars.resolve("spark")
    spark = build_session(
        SparkSettings(master="local[2]", conf={"spark.driver.memory": "2g"}), jars.spark_jars()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        started = time.monotonic()
        _load_source(dsn, schema, args.rows)
        table = TableId(schema, "t")
        _load_lake(spark, table_path(lake_root, table), table, args.rows)
        print(f"loaded {args.rows} rows on each side in {time.monotonic() - started:.1f} s")
        buckets = bucket_count(args.rows)

        with source_side.connect(dsn, None) as conn:
            shape = source_side.describe_table(conn, ref, None)
            conn.rollback()
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            began = time.monotonic()
            conn.execute(sql.SQL("SELECT count(*) FROM {}").format(ref.identifier)).fetchone()
            source_floor = time.monotonic() - began
            began = time.monotonic()
            source_stats = source_side.bucket_stats(conn, shape, buckets)
            source_s = time.monotonic() - began
            conn.rollback()

        lake = lake_side.open_table(spark, lake_root, table)
        assert lake is not None
        began = time.monotonic()
        lake.frame.selectExpr("count(*)").collect()
        lake_floor = time.monotonic() - began
        frame = lake_side.hashed(lake, shape, [])
        began = time.monotonic()
        lake_stats = lake_side.bucket_stats(frame, buckets, str(ref))
        lake_s = time.monotonic() - began

        differing = differing_buckets(source_stats, lake_stats)
        if differing:
            raise SystemExit(f"{len(differing)} of {buckets} buckets differ: the sides disagree")
        rows = args.rows
        print(f"{buckets} buckets, all equal")
        print(
            f"source (PostgreSQL): {source_s:.2f} s, {rows / source_s:,.0f} rows/s "
            f"(count(*): {source_floor:.2f} s)"
        )
        print(
            f"lake (Spark local[2]): {lake_s:.2f} s, {rows / lake_s:,.0f} rows/s "
            f"(count(*): {lake_floor:.2f} s)"
        )
    finally:
        spark.stop()
        shutil.rmtree(lake_root, ignore_errors=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
