"""Capture draining ONE transaction of a million row changes: memory stays bounded.

Usage: ``.venv/bin/python -m bench.capture_large_transaction [--rows N] [--bound B]``

On the local stack, in a fresh schema: a table shaped like pgbench's ``accounts``
(``aid int`` primary key, ``bid int``, ``abalance int``, ``filler char(84)``), a
publication and a pgoutput slot; then, with nothing reading the slot, a single
``INSERT ... SELECT generate_series(1, N)`` transaction. PostgreSQL sends a transaction
only once it has committed (capture asks for protocol version 1, without streaming), so
all N changes arrive between one Begin and one Commit; the walsender spills them to
disk, not capture.

The capture service drains the slot in a child process (``stop_at`` = the end of the
transaction, ``max_in_flight_records`` = B, ``acks=all``, no initial snapshot) while
this process stands in for the apply job, as in :mod:`bench.capture_drain`: every second
it writes, on the control topic, each change-topic partition as applied up to its high
watermark. Capture releases in-flight records as they are applied, before the
transaction's Commit arrives; were it to release only whole transactions, reading would
pause for good at B records and the run would time out.

Reported: wall time, rows/s, CPU, peak RSS (``VmHWM`` of the child, sampled every 0.1 s),
and the records in the topic, which must be exactly N. Everything created is dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import psycopg
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from bench.capture_drain import (
    PARTITIONS,
    WORKLOAD_APP,
    AppliedFeeder,
    Names,
    Usage,
    WalSenderCpu,
    _delete_topics,
    _drop_postgres_objects,
    _records_in,
    _run_measured,
    _workload_dsn,
)
from capture.settings import CaptureSettings
from deploy.local import stack
from schemas.lsn import Lsn, format_lsn, parse_lsn

TABLE = "accounts"
TARGET_RSS_MB = 250.0


def _prepare(admin: psycopg.Connection[tuple[object, ...]], dsn: str, names: Names) -> None:
    """Schema, table, publication and slot, before the transaction is written."""
    schema = sql.Identifier(names.schema)
    with psycopg.connect(_workload_dsn(dsn, names)) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.{} (aid int PRIMARY KEY, bid int, abalance int, filler char(84))"
            ).format(schema, sql.Identifier(TABLE))
        )
    admin.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(names.publication), sql.Identifier(names.schema, TABLE)
        )
    )
    admin.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.capture_slot])


def _write_transaction(dsn: str, names: Names, rows: int) -> Lsn:
    """One transaction inserting ``rows`` rows; returns the end of its commit record."""
    with psycopg.connect(_workload_dsn(dsn, names), autocommit=True) as conn:
        with conn.transaction():
            inserted = conn.execute(
                sql.SQL(
                    "INSERT INTO {} SELECT a, (a - 1) / 100000 + 1, a %% 5000, '' "
                    "FROM generate_series(1, %s) a"
                ).format(sql.Identifier(TABLE)),
                [rows],
            ).rowcount
        if inserted != rows:
            raise RuntimeError(f"inserted {inserted} rows, wanted {rows}")
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        # One more record past the end, so the server's decoding position can pass it.
        conn.execute("SELECT pg_logical_emit_message(false, %s, '')", [WORKLOAD_APP])
    return parse_lsn(str(row[0]))


def _settings(dsn: str, bootstrap: str, names: Names, bound: int) -> CaptureSettings:
    return names.capture_settings(
        dsn,
        bootstrap,
        [TABLE],
        partitions=PARTITIONS,
        snapshot_mode="never",
        max_in_flight_records=bound,
    )


def _drain(dsn: str, bootstrap: str, names: Names, end: Lsn, bound: int) -> tuple[Usage, float]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [NewTopic(names.control_topic, 1, 1, config={"cleanup.policy": "compact"})]
    )[names.control_topic].result(30)
    settings = _settings(dsn, bootstrap, names, bound)
    feeder = AppliedFeeder(bootstrap, names, (TABLE,))
    walsender = WalSenderCpu(dsn, names.capture_slot)
    feeder.start()
    walsender.start()
    try:
        usage = _run_measured(
            "capture",
            [
                sys.executable,
                "-m",
                "bench.capture_drain",
                f"--capture-settings={settings.model_dump_json()}",
                f"--stop-at={format_lsn(end)}",
            ],
        )
    finally:
        feeder.close()
    return usage, walsender.finish() or 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the transaction")
    parser.add_argument(
        "--bound", type=int, default=100_000, help="max_in_flight_records of the capture run"
    )
    args = parser.parse_args()
    state = stack.up()
    dsn, bootstrap = state.postgres.dsn, state.kafka.bootstrap_servers
    names = Names.unique()
    print(f"schema {names.schema}: one transaction of {args.rows} inserts...")
    with (
        psycopg.connect(dsn, autocommit=True) as admin,
        contextlib.ExitStack() as cleanup,
    ):
        cleanup.callback(_delete_topics, bootstrap, names)
        cleanup.callback(_drop_postgres_objects, admin, names)
        _prepare(admin, dsn, names)
        end = _write_transaction(dsn, names, args.rows)
        print(f"draining it with capture (max_in_flight_records={args.bound})...")
        usage, walsender = _drain(dsn, bootstrap, names, end, args.bound)
        records = _records_in(bootstrap, names, (TABLE,))
    rate = args.rows / usage.wall_s
    rss_mb = usage.max_rss_bytes / 1e6
    print(
        f"\nwall {usage.wall_s:.1f} s, {rate:.0f} rows/s, CPU {usage.cpu_s:.1f} s "
        f"({usage.cpu_s / args.rows * 1e6:.1f} us per change), peak RSS {rss_mb:.1f} MB, "
        f"walsender CPU {walsender:.1f} s"
    )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"records in the change topic: {records} "
        f"({'one per row change' if records == args.rows else f'EXPECTED {args.rows}'})"
    )
    print(
        f"target capture peak RSS <= {TARGET_RSS_MB:.0f} MB: "
        f"{'met' if rss_mb <= TARGET_RSS_MB else 'NOT met'} ({rss_mb:.0f} MB)"
    )
    if usage.returncode != 0 or records != args.rows:
        print(f"FAILED: exit code {usage.returncode}, {records} records")
        sys.exit(1)


if __name__ == "__main__":
    main()
