"""A real server streams a transaction in progress; spooled and replayed, it is the
transaction the server sends unstreamed, byte for byte, without its rolled-back savepoint.

The same slot is peeked twice over the same WAL (``pg_logical_slot_peek_binary_changes``
leaves the slot where it is): once with ``proto_version '2'`` and ``streaming 'on'``,
read with :class:`~capture.pgoutput.stream_block.StreamBlocks` and spooled with
:class:`~capture.stream.streamed_transactions.StreamedTransactions`, and once with
protocol version 1, as capture reads today. ``logical_decoding_work_mem`` is set to its
minimum, 64 kB, in the peeking session (decoding runs in that backend), so a few
thousand rows are streamed in several blocks (docs/streaming.md).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from psycopg import sql

from capture.pgoutput import (
    Begin,
    Commit,
    Insert,
    Message,
    Relation,
    StreamAbort,
    StreamBlocks,
    StreamCommit,
    StreamStart,
    decode,
    split_stream_xid,
)
from capture.pgoutput.messages import INSERT
from capture.pgoutput.stream_block import STREAMED_XID_TAGS
from capture.stream.streamed_transactions import StreamedTransactions
from schemas.lsn import Lsn, parse_lsn
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

PEEK = sql.SQL(
    "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
    "%s, NULL, NULL, 'proto_version', %s, 'publication_names', %s{})"
)
STREAMING_ON = sql.SQL(", 'streaming', 'on'")
KEPT = [*range(1, 1501), *range(3001, 4501)]
BETWEEN = 100_000


def _write(dsn: str, pg: psycopg.Connection[tuple[object, ...]], table: str) -> None:
    """One big transaction with a rolled-back savepoint, and a small one committing
    while it runs."""
    insert = sql.SQL(
        "INSERT INTO {} SELECT g, repeat('x', 200) FROM generate_series(%s::int, %s::int) g"
    ).format(sql.Identifier(table))
    with psycopg.connect(dsn) as writer:
        writer.execute(insert, [1, 1500])
        writer.execute("SAVEPOINT s")
        writer.execute(insert, [1501, 3000])
        writer.execute("ROLLBACK TO SAVEPOINT s")
        # Back in the top-level transaction: its later rows carry its own xid.
        writer.execute("RELEASE SAVEPOINT s")
        pg.execute(insert, [BETWEEN, BETWEEN])
        writer.execute(insert, [3001, 4500])
        writer.commit()
    # Decoding stops at the WAL flushed so far, and the test server commits without
    # waiting for the flush (synchronous_commit off): wait for it to pass the commit.
    row = pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    written = parse_lsn(str(row[0]))
    wait_for(lambda: _flushed(pg) >= written, "the transaction's WAL to be flushed", 10)


def _flushed(pg: psycopg.Connection[tuple[object, ...]]) -> Lsn:
    row = pg.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))


def _peek(
    pg: psycopg.Connection[tuple[object, ...]], slot: str, version: str, streaming: bool
) -> list[tuple[Lsn, bytes]]:
    query = PEEK.format(STREAMING_ON if streaming else sql.SQL(""))
    out = []
    for lsn, data in pg.execute(query, [slot, version, slot]).fetchall():
        assert isinstance(data, bytes)
        out.append((parse_lsn(str(lsn)), data))
    return out


def _key(message: Message) -> int:
    assert isinstance(message, Insert)
    value = message.new.values[0]
    assert value is not None
    return int(value)


def test_a_streamed_transaction_replays_as_the_unstreamed_one(
    services: Services,
    pg: psycopg.Connection[tuple[object, ...]],
    pgoutput_slot: str,
    tmp_path: Path,
) -> None:
    _write(services.postgres_dsn, pg, pgoutput_slot)
    pg.execute("SET logical_decoding_work_mem = '64kB'")

    # Streamed: blocks decoded in order, spooled per transaction, replayed at the commit.
    # Other tests' transactions may be decoded in the same window (as empty blocks, or
    # transactions without a change of this table), so the test's own is picked out.
    blocks = StreamBlocks()
    spool = StreamedTransactions(64 << 20, tmp_path)
    seen: list[Message] = []
    replayed: dict[int, list[tuple[Lsn, bytes]]] = {}
    for lsn, payload in _peek(pg, pgoutput_slot, "2", streaming=True):
        message = blocks.decode(payload)
        seen.append(message)
        block = blocks.block_xid
        if isinstance(message, StreamStart):
            spool.start(message.xid, first_segment=message.first_segment)
        elif isinstance(message, StreamAbort):
            spool.abort(message.xid, message.subxid)
        elif isinstance(message, StreamCommit):
            replayed[message.xid] = [(c.change_lsn, c.message) for c in spool.commit(message.xid)]
        elif block is not None and payload[0] in STREAMED_XID_TAGS:
            subxid, unstreamed = split_stream_xid(payload)
            spool.append(block, subxid, lsn, unstreamed)
    spool.close()

    (commit,) = [m for m in seen if isinstance(m, StreamCommit) and replayed[m.xid]]
    xid = commit.xid
    ours = replayed[xid]
    starts = [m for m in seen if isinstance(m, StreamStart) and m.xid == xid]
    (abort,) = [m for m in seen if isinstance(m, StreamAbort) and m.xid == xid]
    # It really was streamed, in several blocks, and the savepoint's changes with it.
    assert len(starts) >= 3
    assert [m.first_segment for m in starts] == [True] + [False] * (len(starts) - 1)
    assert abort.subxid != xid
    inserts_seen = [m for m in seen if isinstance(m, Insert)]
    assert {m.xid for m in inserts_seen} == {xid, abort.subxid, None}
    # The small transaction came whole between two blocks, its Insert without an xid.
    (small,) = [m for m in inserts_seen if m.xid is None]
    assert _key(small) == BETWEEN
    assert blocks.block_xid is None
    opened = [i for i, m in enumerate(seen) if isinstance(m, StreamStart) and m.xid == xid]
    small_at = next(i for i, m in enumerate(seen) if m is small)
    assert opened[0] < small_at < opened[-1]

    # Unstreamed, as capture reads today: the same transaction between Begin and Commit.
    plain = _peek(pg, pgoutput_slot, "1", streaming=False)
    messages = [decode(payload) for _, payload in plain]
    start = next(i for i, m in enumerate(messages) if isinstance(m, Begin) and m.xid == xid)
    begin = messages[start]
    assert isinstance(begin, Begin)
    end = next(i for i in range(start, len(messages)) if isinstance(messages[i], Commit))
    final = messages[end]
    assert isinstance(final, Commit)
    assert (commit.commit_lsn, commit.end_lsn, commit.commit_time) == (
        final.commit_lsn,
        final.end_lsn,
        final.commit_time,
    )
    assert begin.final_lsn == commit.commit_lsn
    inserts = [(lsn, p) for lsn, p in plain[start:end] if p[0] == INSERT]

    # Byte for byte, at the same change LSNs, and nothing of the savepoint.
    assert [(lsn, p) for lsn, p in ours if p[0] == INSERT] == inserts
    assert [_key(decode(p)) for _, p in inserts] == KEPT
    # A Relation precedes the table's first change in the replay, as in the original.
    relations = [decode(p) for _, p in ours if p[0] != INSERT]
    assert relations
    assert all(isinstance(r, Relation) and r.name == pgoutput_slot for r in relations)
    assert ours[0][1][0] != INSERT
