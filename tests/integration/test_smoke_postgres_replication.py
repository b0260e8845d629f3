"""Smoke: a real logical replication stream read from Python with psycopg 3.

Proves the pieces capture is built on: a publication and a pgoutput slot, START_REPLICATION
on a ``replication="database"`` connection returning a COPY_BOTH cursor, CopyData frames
read without blocking, and a standby status update that moves the slot's
``confirmed_flush_lsn`` (https://www.postgresql.org/docs/current/protocol-replication.html).
"""

from __future__ import annotations

import struct
import time

import psycopg
from psycopg import sql

from tests.plugins.replication_stream import read_payloads
from tests.plugins.services import Services

STATUS_UPDATE = ord("r")
BEGIN, COMMIT, INSERT, RELATION = (ord(c) for c in "BCIR")
_STATUS = struct.Struct("!cQQQqB")


def _read_frames(conn: psycopg.Connection[object], until: int, timeout_s: float) -> list[bytes]:
    """Collect pgoutput payloads until ``until`` of them arrived or time runs out."""
    return read_payloads(conn, lambda got: len(got) >= until, timeout_s)


def _confirmed_flush(pg: psycopg.Connection[tuple[object, ...]], slot: str) -> str:
    row = pg.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    assert row is not None
    return str(row[0])


def _lsn_int(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def test_pgoutput_stream_and_status_update_move_the_slot(
    services: Services, pg: psycopg.Connection[tuple[object, ...]], unique_name: str
) -> None:
    table = sql.Identifier(unique_name)
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(table))
    pg.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(table, table))
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [unique_name])
    start = _confirmed_flush(pg, unique_name)
    pg.execute(sql.SQL("INSERT INTO {} VALUES (1, 'one'), (2, 'two')").format(table))
    commit_lsn = _lsn_int(
        str(pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
    )

    repl = psycopg.connect(services.postgres_dsn, autocommit=True, replication="database")
    try:
        cur = repl.execute(
            sql.SQL(
                "START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version '1', publication_names {})"
            ).format(sql.Identifier(unique_name), sql.Literal(unique_name))
        )
        assert cur.pgresult is not None
        assert cur.pgresult.status == psycopg.pq.ExecStatus.COPY_BOTH

        payloads = _read_frames(repl, until=5, timeout_s=20)
        assert [p[0] for p in payloads] == [BEGIN, RELATION, INSERT, INSERT, COMMIT]
        assert unique_name.encode() in payloads[1]
        assert b"one" in payloads[2]
        assert b"two" in payloads[3]
        # Commit: tag, flags u8, commit lsn u64, end lsn u64, timestamp i64.
        _, end_lsn = struct.unpack_from("!QQ", payloads[4], 2)
        assert end_lsn <= commit_lsn + 1024

        now_us = int((time.time() - 946_684_800) * 1_000_000)
        repl.pgconn.put_copy_data(_STATUS.pack(b"r", end_lsn, end_lsn, end_lsn, now_us, 1))
        repl.pgconn.flush()

        deadline = time.monotonic() + 20
        while _lsn_int(_confirmed_flush(pg, unique_name)) < end_lsn:
            assert time.monotonic() < deadline, "confirmed_flush_lsn never moved"
            _read_frames(repl, until=1, timeout_s=0.5)
        assert _lsn_int(_confirmed_flush(pg, unique_name)) > _lsn_int(start)
    finally:
        repl.close()
        pg.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            [unique_name],
        )
