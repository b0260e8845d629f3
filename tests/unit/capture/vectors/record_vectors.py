"""Record the golden pgoutput vectors in this directory from a real PostgreSQL server.

Run by hand when the vectors need re-recording; pytest never runs it::

    .venv/bin/python tests/unit/capture/vectors/record_vectors.py \\
        "host=127.0.0.1 port=55432 user=postgres dbname=postgres"

The server must be PostgreSQL 15 or later with ``wal_level = logical``,
``max_replication_slots >= 2``, ``max_wal_senders >= 2``,
``max_prepared_transactions > 0`` and ``track_commit_timestamp = on``, and the user a
superuser (replication origins need one). The script sets
``logical_decoding_work_mem = 64kB`` on its own replication sessions so that a few
hundred rows are enough to force streaming. Use a throwaway cluster: the script creates
and drops its own objects, all named ``vec_*``, and its slots are temporary.

Each scenario runs some SQL, then emits a non-transactional logical message with the
prefix ``vec_sync`` and keeps every frame the slot sends before that marker, so frames
are attributed to scenarios without decoding them.

What a vector means comes from the server, never from the decoder under test: catalog
OIDs and names, xids from ``pg_current_xact_id()``, commit timestamps from
``pg_xact_commit_timestamp()``, prepare times from ``pg_prepared_xacts`` and column
values as their types' output functions render them. LSNs inside payloads cannot be
asked for in SQL; each vector keeps its XLogData header (``wal_start``/``wal_end``),
read here with ``struct`` alone, and the tests check payload LSNs against those.
"""

from __future__ import annotations

import argparse
import json
import select
import struct
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.adapt import Loader

OUT_DIR = Path(__file__).resolve().parent

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
XLOG_HEADER = struct.Struct("!cQQq")
STATUS_UPDATE = struct.Struct("!cQQQqB")
SYNC_PREFIX = b"vec_sync"

# Streamed transactions produce thousands of Insert messages; the first few show the
# format, the rest would only bloat the vectors.
MAX_DATA_MESSAGES_PER_SCENARIO = 3

MESSAGE_NAMES = {
    "B": "Begin",
    "C": "Commit",
    "O": "Origin",
    "R": "Relation",
    "Y": "Type",
    "I": "Insert",
    "U": "Update",
    "D": "Delete",
    "T": "Truncate",
    "M": "LogicalMessage",
    "S": "StreamStart",
    "E": "StreamStop",
    "c": "StreamCommit",
    "A": "StreamAbort",
    "b": "BeginPrepare",
    "P": "Prepare",
    "K": "CommitPrepared",
    "r": "RollbackPrepared",
    "p": "StreamPrepare",
}
DATA_MESSAGES = {"I", "U", "D"}

SCHEMA = [
    "CREATE TYPE vec_mood AS ENUM ('sad', 'ok', 'happy')",
    """CREATE TABLE vec_orders (
        region text NOT NULL,
        order_id bigint NOT NULL,
        qty integer,
        price numeric(10, 2),
        note varchar(20),
        placed_at timestamptz,
        paid boolean,
        mood vec_mood,
        payload bytea,
        PRIMARY KEY (region, order_id)
    )""",
    "CREATE TABLE vec_full (id integer PRIMARY KEY, label text)",
    "ALTER TABLE vec_full REPLICA IDENTITY FULL",
    "CREATE TABLE vec_toast (id integer PRIMARY KEY, counter integer, doc text)",
    "CREATE TABLE vec_trunc_a (id serial PRIMARY KEY, v text)",
    "CREATE TABLE vec_trunc_b (id serial PRIMARY KEY, v text)",
    "CREATE TABLE vec_stream (id integer PRIMARY KEY, filler text)",
    # Random hex compresses poorly, so 100 kB stays far above the TOAST threshold and
    # is stored out of line: an UPDATE that leaves it alone sends it as 'u'.
    """INSERT INTO vec_toast
       SELECT 1, 0, string_agg(md5(random()::text), '') FROM generate_series(1, 3200)""",
    "INSERT INTO vec_trunc_a (v) VALUES ('a1'), ('a2')",
    "INSERT INTO vec_trunc_b (v) VALUES ('b1')",
    """CREATE PUBLICATION vec_pub FOR TABLE
       vec_orders, vec_full, vec_toast, vec_trunc_a, vec_trunc_b, vec_stream""",
    "SELECT pg_replication_origin_create('vec_origin')",
]

TEARDOWN = [
    "DROP PUBLICATION IF EXISTS vec_pub",
    "DROP TABLE IF EXISTS vec_orders, vec_full, vec_toast, vec_trunc_a, vec_trunc_b, vec_stream",
    "DROP TYPE IF EXISTS vec_mood",
    """SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin
       WHERE roname = 'vec_origin'""",
]

BIG_INSERT = """INSERT INTO vec_stream
    SELECT g, repeat(md5(g::text), 8) FROM generate_series(%s::int, %s::int) AS g"""


def pg_micros(ts: datetime) -> int:
    return (ts - PG_EPOCH) // timedelta(microseconds=1)


def format_lsn(lsn: int) -> str:
    # Not schemas.lsn: the vectors must not depend on the code they are meant to test.
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


class OutputText(Loader):
    def load(self, data: Buffer) -> str:
        return bytes(data).decode()


class Database:
    """The ordinary SQL session that makes changes and answers questions about them."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.statements: list[str] = []

    def run(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        self.statements.append(" ".join(query.split()))
        cur = self.conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    def ask(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        """One value; not logged as part of the scenario."""
        row = self.conn.execute(query, params).fetchone()
        assert row is not None
        return row[0]

    def xid(self) -> int:
        return int(self.ask("SELECT pg_current_xact_id()::text")) & 0xFFFFFFFF

    def commit_time(self, xid: int) -> int:
        return pg_micros(self.ask("SELECT pg_xact_commit_timestamp(%s::text::xid)", (xid,)))

    def relation(self, table: str) -> dict[str, Any]:
        row = self.conn.execute(
            """SELECT c.oid, n.nspname, c.relname, c.relreplident::text
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE c.oid = %s::regclass""",
            (table,),
        ).fetchone()
        assert row is not None
        columns = self.conn.execute(
            """SELECT a.attname, a.atttypid, a.atttypmod,
                      c.relreplident = 'f' OR coalesce(a.attnum = ANY(i.indkey), false)
               FROM pg_attribute a
               JOIN pg_class c ON c.oid = a.attrelid
               LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
               WHERE a.attrelid = %s::regclass AND a.attnum > 0
                 AND NOT a.attisdropped AND a.attgenerated = ''
               ORDER BY a.attnum""",
            (table,),
        ).fetchall()
        return {
            "oid": row[0],
            "namespace": row[1],
            "name": row[2],
            "replica_identity": row[3],
            "columns": [
                {"name": name, "type_oid": oid, "type_modifier": typmod, "is_key": key}
                for name, oid, typmod, key in columns
            ],
        }

    def type_(self, name: str) -> dict[str, Any]:
        row = self.conn.execute(
            """SELECT t.oid, n.nspname, t.typname
               FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
               WHERE t.oid = %s::regtype""",
            (name,),
        ).fetchone()
        assert row is not None
        return {"oid": row[0], "namespace": row[1], "name": row[2]}

    def row_text(self, table: str, where: str, params: tuple[Any, ...]) -> list[str | None]:
        """The row's columns as their type output functions render them.

        Not ``col::text``: some casts differ from the output function pgoutput uses
        (``true::text`` is ``'true'``, boolean output is ``'t'``). Text-format results
        are the output function's bytes, so every column type gets a pass-through loader.
        """
        columns = self.relation(table)["columns"]
        query = sql.SQL("SELECT {} FROM {} WHERE {}").format(
            sql.SQL(", ").join(sql.Identifier(c["name"]) for c in columns),
            sql.Identifier(table),
            sql.SQL(where),
        )
        cur = self.conn.cursor()
        for column in columns:
            cur.adapters.register_loader(column["type_oid"], OutputText)
        row = cur.execute(query, params).fetchone()
        assert row is not None
        return list(row)


def as_tuple(values: list[str | None]) -> list[list[str | None]]:
    return [["n", None] if v is None else ["t", v] for v in values]


def key_tuple(values: list[str | None], relation: dict[str, Any]) -> list[list[str | None]]:
    """An old-key tuple ('K'): replica identity columns, every other column NULL."""
    return [
        ["t", v] if col["is_key"] and v is not None else ["n", None]
        for v, col in zip(values, relation["columns"], strict=True)
    ]


class Stream:
    """The replication session; reads CopyData frames up to each sync marker."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.pgconn = conn.pgconn
        self.in_stream = False
        self.keepalive_sample: bytes | None = None
        self.xlog_data_sample: bytes | None = None

    def _next_frame(self, deadline: float) -> bytes:
        while True:
            nbytes, data = self.pgconn.get_copy_data(1)
            if nbytes > 0:
                return bytes(data)
            if nbytes < 0:
                raise RuntimeError(f"replication stream ended: {self.pgconn.error_message!r}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no sync marker from the replication stream within 60 s")
            select.select([self.pgconn.socket], [], [], left)
            self.pgconn.consume_input()

    def _reply(self) -> None:
        now = pg_micros(datetime.now(UTC))
        self.pgconn.put_copy_data(STATUS_UPDATE.pack(b"r", 0, 0, 0, now, 0))
        self.pgconn.flush()

    def sync(self, db: Database) -> list[dict[str, Any]]:
        """Emit a marker and return every pgoutput message the slot sent before it."""
        db.ask("SELECT pg_logical_emit_message(false, %s, %s)", (SYNC_PREFIX.decode(), "s"))
        marker = b"M\x00"
        deadline = time.monotonic() + 60
        messages: list[dict[str, Any]] = []
        data_messages = 0
        while True:
            frame = self._next_frame(deadline)
            if frame[:1] == b"k":
                self.keepalive_sample = self.keepalive_sample or frame
                if frame[17]:
                    self._reply()
                continue
            _, wal_start, wal_end, _ = XLOG_HEADER.unpack_from(frame)
            payload = frame[XLOG_HEADER.size :]
            if payload[:2] == marker and payload[10:].startswith(SYNC_PREFIX + b"\x00"):
                return messages
            self.xlog_data_sample = self.xlog_data_sample or frame
            tag = chr(payload[0])
            in_stream = self.in_stream
            if tag == "S":
                self.in_stream = True
            elif tag == "E":
                self.in_stream = False
            if tag in DATA_MESSAGES:
                data_messages += 1
                if data_messages > MAX_DATA_MESSAGES_PER_SCENARIO:
                    continue
            messages.append(
                {
                    "message": MESSAGE_NAMES.get(tag, f"unknown {tag!r}"),
                    "in_stream": in_stream,
                    "wal_start": format_lsn(wal_start),
                    "wal_end": format_lsn(wal_end),
                    "hex": payload.hex(),
                }
            )


class Session:
    def __init__(self, db: Database, stream: Stream) -> None:
        self.db = db
        self.stream = stream
        self.scenarios: list[dict[str, Any]] = []

    def record(self, name: str, description: str, facts: dict[str, Any]) -> None:
        messages = self.stream.sync(self.db)
        self.scenarios.append(
            {
                "name": name,
                "description": description,
                "sql": self.db.statements,
                "facts": facts,
                "messages": messages,
            }
        )
        self.db.statements = []


def record_v2(s: Session) -> None:
    db = s.db
    orders = db.relation("vec_orders")

    db.run("BEGIN")
    xid = db.xid()
    db.run(
        """INSERT INTO vec_orders VALUES
           ('eu', 1, 3, 9.99, 'first', '2024-01-02 03:04:05.123456+00', true, 'happy',
            '\\x00ff'),
           ('us', 7, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"""
    )
    rows = [
        as_tuple(db.row_text("vec_orders", "region = %s AND order_id = %s", key))
        for key in (("eu", 1), ("us", 7))
    ]
    db.run("COMMIT")
    s.record(
        "insert",
        "Begin, Type (user enum column), Relation (composite primary key), two Inserts "
        "(one with NULLs), Commit",
        {
            "xid": xid,
            "commit_time": db.commit_time(xid),
            "relation": orders,
            "type": db.type_("vec_mood"),
            "rows": rows,
        },
    )

    db.run("BEGIN")
    xid = db.xid()
    db.run("UPDATE vec_orders SET qty = 4 WHERE region = 'eu' AND order_id = 1")
    new = as_tuple(db.row_text("vec_orders", "region = 'eu' AND order_id = 1", ()))
    db.run("COMMIT")
    s.record(
        "update_default",
        "REPLICA IDENTITY DEFAULT, key unchanged: no old tuple",
        {"xid": xid, "commit_time": db.commit_time(xid), "relation_oid": orders["oid"], "new": new},
    )

    db.run("BEGIN")
    xid = db.xid()
    old = db.row_text("vec_orders", "region = 'eu' AND order_id = 1", ())
    db.run("UPDATE vec_orders SET order_id = 2 WHERE region = 'eu' AND order_id = 1")
    new = as_tuple(db.row_text("vec_orders", "region = 'eu' AND order_id = 2", ()))
    db.run("COMMIT")
    s.record(
        "update_key",
        "REPLICA IDENTITY DEFAULT, a key column changed: old key ('K') then new tuple",
        {
            "xid": xid,
            "commit_time": db.commit_time(xid),
            "relation_oid": orders["oid"],
            "key": key_tuple(old, orders),
            "new": new,
        },
    )

    full = db.relation("vec_full")
    db.run("BEGIN")
    xid = db.xid()
    db.run("INSERT INTO vec_full VALUES (1, 'before')")
    inserted = as_tuple(db.row_text("vec_full", "id = 1", ()))
    db.run("UPDATE vec_full SET label = 'after' WHERE id = 1")
    updated = as_tuple(db.row_text("vec_full", "id = 1", ()))
    db.run("COMMIT")
    s.record(
        "update_full",
        "REPLICA IDENTITY FULL: Relation with every column flagged as key, Insert, then "
        "Update with the whole old row ('O')",
        {
            "xid": xid,
            "commit_time": db.commit_time(xid),
            "relation": full,
            "inserted": inserted,
            "old": inserted,
            "new": updated,
        },
    )

    toast = db.relation("vec_toast")
    db.run("BEGIN")
    xid = db.xid()
    db.run("UPDATE vec_toast SET counter = counter + 1 WHERE id = 1")
    new = as_tuple(db.row_text("vec_toast", "id = 1", ()))
    new[2] = ["u", None]
    db.run("COMMIT")
    s.record(
        "update_unchanged_toast",
        "UPDATE leaves a 100 kB out-of-line text column alone: it is sent as 'u'",
        {"xid": xid, "commit_time": db.commit_time(xid), "relation": toast, "new": new},
    )

    db.run("BEGIN")
    xid = db.xid()
    old = db.row_text("vec_orders", "region = 'eu' AND order_id = 2", ())
    db.run("DELETE FROM vec_orders WHERE region = 'eu' AND order_id = 2")
    db.run("COMMIT")
    s.record(
        "delete_key",
        "DELETE under REPLICA IDENTITY DEFAULT: old key ('K')",
        {
            "xid": xid,
            "commit_time": db.commit_time(xid),
            "relation_oid": orders["oid"],
            "key": key_tuple(old, orders),
        },
    )

    db.run("BEGIN")
    xid = db.xid()
    old_full = as_tuple(db.row_text("vec_full", "id = 1", ()))
    db.run("DELETE FROM vec_full WHERE id = 1")
    db.run("COMMIT")
    s.record(
        "delete_full",
        "DELETE under REPLICA IDENTITY FULL: whole old row ('O')",
        {
            "xid": xid,
            "commit_time": db.commit_time(xid),
            "relation_oid": full["oid"],
            "old": old_full,
        },
    )

    db.run("BEGIN")
    xid = db.xid()
    db.run("TRUNCATE vec_trunc_a, vec_trunc_b RESTART IDENTITY CASCADE")
    db.run("COMMIT")
    s.record(
        "truncate",
        "TRUNCATE of two tables with RESTART IDENTITY and CASCADE",
        {
            "xid": xid,
            "commit_time": db.commit_time(xid),
            "relations": [db.relation("vec_trunc_a"), db.relation("vec_trunc_b")],
            "options": ["CASCADE", "RESTART_IDENTITY"],
        },
    )

    db.run("BEGIN")
    xid = db.xid()
    content = "héllo\x00wörld".encode()
    db.run("SELECT pg_logical_emit_message(true, 'vec_prefix', %s::bytea)", (content,))
    db.run("COMMIT")
    s.record(
        "message_transactional",
        "pg_logical_emit_message(true, ...) inside Begin/Commit",
        {
            "xid": xid,
            "commit_time": db.commit_time(xid),
            "prefix": "vec_prefix",
            "content": content.hex(),
            "transactional": True,
        },
    )

    content = bytes(range(256))
    lsn = db.run("SELECT pg_logical_emit_message(false, 'vec_präfix', %s::bytea)", (content,))
    s.record(
        "message_non_transactional",
        "pg_logical_emit_message(false, ...): sent at once, outside any transaction",
        {
            "prefix": "vec_präfix",
            "content": content.hex(),
            "transactional": False,
            "emit_result_lsn": str(lsn[0][0]),
        },
    )

    db.run("SELECT pg_replication_origin_session_setup('vec_origin')")
    db.run("BEGIN")
    xid = db.xid()
    db.run("SELECT pg_replication_origin_xact_setup('1/2345678', '2024-05-06 07:08:09+00')")
    db.run("INSERT INTO vec_full VALUES (2, 'replayed')")
    db.run("COMMIT")
    db.run("SELECT pg_replication_origin_session_reset()")
    s.record(
        "origin",
        "a transaction replayed under replication origin 'vec_origin': Begin, Origin, "
        "Insert, Commit",
        {
            "xid": xid,
            "commit_time": db.commit_time(xid),
            "origin_name": "vec_origin",
            "origin_lsn": "1/2345678",
            "relation_oid": full["oid"],
            "new": as_tuple(db.row_text("vec_full", "id = 2", ())),
        },
    )

    stream_rel = db.relation("vec_stream")
    db.run("BEGIN")
    xid = db.xid()
    db.run(BIG_INSERT, (1, 600))
    first_rows = [as_tuple(db.row_text("vec_stream", "id = %s", (i,))) for i in (1, 2, 3)]
    db.run("COMMIT")
    s.record(
        "stream_commit",
        "a transaction larger than logical_decoding_work_mem, streamed in segments "
        "before it commits: StreamStart, Relation and Inserts carrying the xid, "
        "StreamStop, ..., StreamCommit",
        {
            "xid": xid,
            "commit_time": db.commit_time(xid),
            "relation": stream_rel,
            "first_rows": first_rows,
        },
    )

    db.run("BEGIN")
    xid = db.xid()
    db.run(BIG_INSERT, (10001, 10600))
    db.run("ROLLBACK")
    s.record(
        "stream_abort",
        "a streamed transaction rolled back: StreamAbort with subxid equal to xid",
        {"xid": xid, "subxid": xid},
    )

    db.run("BEGIN")
    xid = db.xid()
    db.run("INSERT INTO vec_stream VALUES (20000, 'kept')")
    db.run("SAVEPOINT big")
    db.run(BIG_INSERT, (20001, 20600))
    subxid = int(db.ask("SELECT xmin::text FROM vec_stream WHERE id = 20001")) & 0xFFFFFFFF
    db.run("ROLLBACK TO SAVEPOINT big")
    db.run("COMMIT")
    s.record(
        "stream_subxact_abort",
        "a streamed subtransaction rolled back, its parent committed: StreamAbort with "
        "the subtransaction's xid, then StreamCommit",
        {"xid": xid, "subxid": subxid, "commit_time": db.commit_time(xid)},
    )


def record_v3(s: Session) -> None:
    db = s.db
    full = db.relation("vec_full")

    db.run("BEGIN")
    xid = db.xid()
    db.run("INSERT INTO vec_full VALUES (3, 'prepared')")
    new = as_tuple(db.row_text("vec_full", "id = 3", ()))
    db.run("PREPARE TRANSACTION 'vec_gid_commit'")
    prepare_time = pg_micros(
        db.ask("SELECT prepared FROM pg_prepared_xacts WHERE gid = 'vec_gid_commit'")
    )
    db.run("COMMIT PREPARED 'vec_gid_commit'")
    s.record(
        "prepare_commit",
        "two-phase: BeginPrepare, Relation, Insert, Prepare, then CommitPrepared",
        {
            "xid": xid,
            "gid": "vec_gid_commit",
            "prepare_time": prepare_time,
            "commit_time": db.commit_time(xid),
            "relation": full,
            "new": new,
        },
    )

    db.run("BEGIN")
    xid = db.xid()
    db.run("INSERT INTO vec_full VALUES (4, 'rolled back')")
    new = as_tuple(db.row_text("vec_full", "id = 4", ()))
    db.run("PREPARE TRANSACTION 'vec_gid_rollback'")
    prepare_time = pg_micros(
        db.ask("SELECT prepared FROM pg_prepared_xacts WHERE gid = 'vec_gid_rollback'")
    )
    db.run("ROLLBACK PREPARED 'vec_gid_rollback'")
    s.record(
        "prepare_rollback",
        "two-phase: BeginPrepare, Insert, Prepare, then RollbackPrepared",
        {
            "xid": xid,
            "gid": "vec_gid_rollback",
            "prepare_time": prepare_time,
            "relation_oid": full["oid"],
            "new": new,
        },
    )

    db.run("BEGIN")
    xid = db.xid()
    db.run(BIG_INSERT, (30001, 30600))
    db.run("PREPARE TRANSACTION 'vec_gid_stream'")
    prepare_time = pg_micros(
        db.ask("SELECT prepared FROM pg_prepared_xacts WHERE gid = 'vec_gid_stream'")
    )
    db.run("COMMIT PREPARED 'vec_gid_stream'")
    s.record(
        "stream_prepare",
        "two-phase with streaming: streamed segments, StreamPrepare, then CommitPrepared",
        {
            "xid": xid,
            "gid": "vec_gid_stream",
            "prepare_time": prepare_time,
            "commit_time": db.commit_time(xid),
        },
    )


def record(dsn: str, proto_version: int, db: Database) -> dict[str, Any]:
    slot = f"vec_slot_v{proto_version}"
    options = {
        "proto_version": str(proto_version),
        "publication_names": "vec_pub",
        "messages": "true",
        "streaming": "on",
    }
    slot_options = ""
    if proto_version >= 3:
        options["two_phase"] = "on"
        slot_options = " (TWO_PHASE)"
    # A 64 kB decoding budget makes a few thousand rows enough to force streaming.
    repl = psycopg.connect(
        dsn,
        autocommit=True,
        replication="database",
        options="-c logical_decoding_work_mem=64kB",
    )
    # Not a `with` block: leaving one would send COMMIT into the COPY BOTH stream.
    try:
        repl.execute(f"CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL pgoutput{slot_options}")
        option_list = ", ".join(f"{k} '{v}'" for k, v in options.items())
        repl.execute(f"START_REPLICATION SLOT {slot} LOGICAL 0/0 ({option_list})")
        stream = Stream(repl)
        session = Session(db, stream)
        (record_v3 if proto_version >= 3 else record_v2)(session)
    finally:
        repl.close()
    assert stream.keepalive_sample is not None
    assert stream.xlog_data_sample is not None
    return {
        "server_version": db.ask("SHOW server_version"),
        "start_replication": f"START_REPLICATION SLOT {slot} LOGICAL 0/0 ({option_list})",
        "copy_data_samples": {
            "primary_keepalive": stream.keepalive_sample.hex(),
            "xlog_data": stream.xlog_data_sample.hex(),
        },
        "scenarios": session.scenarios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn", help="libpq connection string of a throwaway PostgreSQL 15+")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="directory for the JSON files")
    args = parser.parse_args()

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        db = Database(conn)
        if int(db.ask("SHOW server_version_num")) < 150000:
            raise SystemExit("the vectors need PostgreSQL 15 or later (two-phase, protocol 3)")
        for statement in TEARDOWN + SCHEMA:
            conn.execute(statement)
        try:
            for proto_version in (2, 3):
                recorded = record(args.dsn, proto_version, db)
                path = args.out / f"pgoutput_v{proto_version}.json"
                path.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n")
                print(f"wrote {path}")
        finally:
            for statement in TEARDOWN:
                conn.execute(statement)


if __name__ == "__main__":
    main()
