"""CopyData framing of the streaming replication protocol; no I/O.

After ``START_REPLICATION`` the connection is in COPY BOTH mode. Each CopyData the
server sends is an XLogData ('w') carrying one pgoutput message, or a Primary
keepalive ('k'). The client answers with Standby status updates ('r'). Formats:
https://www.postgresql.org/docs/current/protocol-replication.html.

Invariants:

- :func:`parse_copy_data` consumes the whole frame or raises
  :class:`~capture.pgoutput.MalformedMessageError`; the XLogData payload is a slice of the
  frame, not a copy, so it stays valid only as long as the frame's buffer does.
- The three positions of a status update are the LSN *after* the last byte the
  client has written, flushed (made durable downstream) and applied. The server may
  discard WAL and advance the slot's ``confirmed_flush_lsn`` up to ``flushed``, so it
  must never run ahead of what is durable downstream; deciding that is the caller's
  job.
- Timestamps are int64 microseconds since 2000-01-01 00:00:00 UTC.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from capture.pgoutput.messages import frozen_constructor, unix_micros_to_pg_micros
from capture.pgoutput.reader import MalformedMessageError, Reader
from schemas.lsn import MAX_LSN, Lsn

# Server to client.
XLOG_DATA = ord("w")
PRIMARY_KEEPALIVE = ord("k")

# Client to server.
STANDBY_STATUS_UPDATE = ord("r")

_STATUS_UPDATE = struct.Struct("!BQQQqB")
_XLOG_DATA_HEADER = struct.Struct("!BQQq")


@dataclass(frozen=True, slots=True)
class XLogData:
    """One pgoutput message and its WAL position.

    In physical replication ``wal_start`` and ``wal_end`` bracket the data. A logical
    walsender sets both to one LSN it associates with the message (for Commit, the
    transaction's end LSN) or to 0 (Relation, Type): use the LSNs inside the pgoutput
    message, not these, to decide what to confirm.
    """

    wal_start: Lsn
    wal_end: Lsn
    send_time: int
    payload: memoryview


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    """The server is alive; ``reply_requested`` asks for a status update right away.

    Not answering a requested reply within ``wal_sender_timeout`` makes the server
    drop the connection.
    """

    wal_end: Lsn
    send_time: int
    reply_requested: bool


_new_xlog_data = frozen_constructor(XLogData)


def parse_copy_data(buf: bytes | memoryview) -> XLogData | PrimaryKeepalive:
    """Parse one CopyData payload sent by the server during streaming replication."""
    # Nearly every frame is an XLogData: its fixed header is read in one go, from the
    # buffer as it is (bytes, or psycopg's memoryview of them; indexing either gives the
    # byte as an int). A short or unusual buffer takes the Reader path below, which says
    # what is wrong with it.
    if len(buf) >= _XLOG_DATA_HEADER.size and buf[0] == XLOG_DATA:
        _, wal_start, wal_end, send_time = _XLOG_DATA_HEADER.unpack_from(buf)
        return _new_xlog_data(
            wal_start, wal_end, send_time, memoryview(buf)[_XLOG_DATA_HEADER.size :]
        )
    reader = Reader(buf)
    if not reader.remaining():
        raise MalformedMessageError(0, "replication message tag 'w' or 'k'", "empty message")
    tag = reader.u8()
    if tag == XLOG_DATA:
        return XLogData(
            wal_start=Lsn(reader.u64()),
            wal_end=Lsn(reader.u64()),
            send_time=reader.i64(),
            payload=reader.rest(),
        )
    if tag == PRIMARY_KEEPALIVE:
        wal_end = Lsn(reader.u64())
        send_time = reader.i64()
        offset = reader.offset
        reply = reader.u8()
        if reply > 1:
            raise MalformedMessageError(offset, "reply-requested flag 0 or 1", f"0x{reply:02x}")
        reader.finish()
        return PrimaryKeepalive(wal_end=wal_end, send_time=send_time, reply_requested=bool(reply))
    raise MalformedMessageError(0, "replication message tag 'w' or 'k'", f"0x{tag:02x}")


def encode_xlog_data(wal_start: Lsn, payload: bytes) -> bytes:
    """An XLogData frame holding ``payload`` at ``wal_start`` (also its ``wal_end``, as a
    logical walsender sends it; send time 0): the frame the compiled stream hands back
    for a replayed message only the Python path takes (``xlog_data`` in
    ``native/src/compiled_stream.rs`` builds the same bytes)."""
    return _XLOG_DATA_HEADER.pack(XLOG_DATA, wal_start, wal_start, 0) + payload


def encode_status_update(
    written: Lsn,
    flushed: Lsn,
    applied: Lsn,
    now_micros: int,
    reply_requested: bool = False,
) -> bytes:
    """Encode a Standby status update ('r') to send as CopyData.

    ``now_micros`` is the client's clock in microseconds since 2000-01-01 UTC, see
    :func:`pg_now_micros`. ``reply_requested`` asks the server to answer with a
    keepalive at once.
    """
    for name, lsn in (("written", written), ("flushed", flushed), ("applied", applied)):
        if not 0 <= lsn <= MAX_LSN:
            raise ValueError(f"{name} LSN {lsn} is outside the unsigned 64-bit range")
    return _STATUS_UPDATE.pack(
        STANDBY_STATUS_UPDATE, written, flushed, applied, now_micros, reply_requested
    )


def pg_now_micros() -> int:
    """The current time as a replication protocol timestamp."""
    return unix_micros_to_pg_micros(time.time_ns() // 1000)
