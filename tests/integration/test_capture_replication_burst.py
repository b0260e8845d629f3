"""Frames read in a burst (``ReplicationStream.read_buffered`` after ``read``) are the
stream's frames, in order, none lost or repeated, on the real server."""

from __future__ import annotations

import time

import psycopg

from capture.pgoutput import Begin, Commit, Insert, decode
from capture.rows.typemap import SESSION_SETTINGS
from capture.stream.copy_data import PrimaryKeepalive, XLogData
from capture.stream.replication import ReplicationStream
from schemas.lsn import Lsn
from tests.plugins.services import Services

ROWS = 2000


def test_a_burst_reads_every_frame_of_a_transaction_once_and_in_order(
    services: Services, pg: psycopg.Connection[tuple[object, ...]], pgoutput_slot: str
) -> None:
    pg.execute(
        f"INSERT INTO {pgoutput_slot} SELECT i, repeat('x', i %% 50) FROM generate_series(1, %s) i",
        [ROWS],
    )
    stream = ReplicationStream.start(
        services.postgres_dsn,
        password=None,
        slot=pgoutput_slot,
        publication=pgoutput_slot,
        start_lsn=Lsn(0),
        settings=SESSION_SETTINGS,
        silence_timeout_s=60.0,
    )
    messages: list[object] = []
    buffered = 0
    try:
        deadline = time.monotonic() + 60
        while not any(isinstance(m, Commit) for m in messages):
            assert time.monotonic() < deadline, f"{len(messages)} messages after 60 s"
            frame = stream.read(0.5)
            while frame is not None:
                if isinstance(frame, XLogData):
                    messages.append(decode(frame.payload))
                else:
                    assert isinstance(frame, PrimaryKeepalive)
                frame = stream.read_buffered()
                buffered += frame is not None
        # Everything is consumed: nothing is left in the buffer to return.
        assert stream.read_buffered() is None
    finally:
        stream.close()
    relation_messages = [m for m in messages if not isinstance(m, Begin | Commit | Insert)]
    rows = [m for m in messages if isinstance(m, Insert)]
    assert isinstance(messages[0], Begin)
    assert isinstance(messages[-1], Commit)
    assert len(relation_messages) == 1, "one Relation before the first row"
    assert [row.new.values[0] for row in rows] == [str(i).encode() for i in range(1, ROWS + 1)]
    # The frames after the first of each read came from the buffer, without waiting:
    # a transaction of this size arrives in far fewer network reads than frames.
    assert buffered > ROWS // 2
