"""Transactions in progress, streamed by the server: blocks into spools, Stream Commit
into a replay. No socket: the loop hands frames in and drains what comes out.

With ``CAPTURE_STREAMING`` the server sends a transaction that outgrows its
``logical_decoding_work_mem`` while it runs, in stream blocks, and ends it with Stream
Commit or Stream Abort (docs/streaming.md). :class:`InProgressTransactions` takes the
frames that belong to that protocol (:meth:`~InProgressTransactions.takes`) and:

- **Spools a block's changes** (:mod:`capture.stream.streamed_transactions`): each message
  that carries an xid is stored in its protocol-version-1 form, the xid taken off
  (:func:`~capture.pgoutput.stream_block.split_stream_xid`, which reads only the tag and
  the xid, bounds-checked). The rest is decoded at the replay, where an unstreamed
  transaction's messages are decoded too: decoding it twice would cost a good part of
  what handling a change does, and a malformed message ends the attempt either way.
  Origin messages (no xid) carry nothing capture publishes and are not spooled.
- **Drops what aborts**: Stream Abort of a subtransaction voids it and the ones begun
  inside it, of the whole transaction its spool.
- **Replays at Stream Commit**: a Begin with the commit's LSN, time and xid, the spooled
  messages with their change LSNs, and a Commit with the end LSN, each as the bytes an
  unstreamed transaction's messages are. The loop hands them to the compiled stream
  (:meth:`~capture.stream.compiled_stream.CompiledStream.take_frames`) or to
  :meth:`~capture.stream.change_stream.ChangeStream.handle_frame`, as it does an
  unstreamed transaction's frames, so the records, their ordinals and their positions
  are those of the same transaction sent unstreamed. The
  replay is lazy (one spooled change read per item): the loop drains it under the
  in-flight bound and does not read the socket until it is done, which keeps the
  transactions after it in commit order.

Invariants:

- Between blocks only Stream Start, Stream Stop (an error there), Stream Commit and
  Stream Abort are taken; the ordinary transactions between blocks go the usual way.
  Inside a block every frame is taken (:class:`~capture.pgoutput.stream_block.StreamBlocks`
  refuses a transaction boundary there).
- :attr:`~InProgressTransactions.open` is true while any streamed transaction has a
  spool: the loop must not confirm a keepalive's ``wal_end`` then.
- One object per replication attempt: a new connection streams every open transaction
  again from its first change, so nothing spooled by an earlier attempt is kept
  (:meth:`~InProgressTransactions.close` releases the files).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Generator
from pathlib import Path

from capture.pgoutput import StreamAbort, StreamBlocks, StreamCommit, StreamStart, split_stream_xid
from capture.pgoutput.messages import (
    BEGIN,
    COMMIT,
    STREAM_ABORT,
    STREAM_COMMIT,
    STREAM_START,
    STREAM_STOP,
)
from capture.pgoutput.stream_block import STREAMED_XID_TAGS
from capture.stream.streamed_transactions import StreamedChange, StreamedTransactions
from schemas.lsn import Lsn, format_lsn

log = logging.getLogger(__name__)

STREAM_TAGS = frozenset({STREAM_START, STREAM_STOP, STREAM_COMMIT, STREAM_ABORT})
"""Tags of the stream protocol's own messages, which come between blocks (Stream Stop
closes one)."""

# Begin and Commit of protocol version 1, as pgoutput writes them.
_BEGIN = struct.Struct("!BQqI")
_COMMIT = struct.Struct("!BBQQq")

ReplayFrame = tuple[bytes, Lsn]
"""A pgoutput message of a replayed transaction (protocol version 1) and the change LSN
an unstreamed frame of it carries (its XLogData ``wal_start``)."""


class InProgressTransactions:
    """The streamed transactions of one replication attempt (see the module's text)."""

    __slots__ = ("_blocks", "_spools", "peak_bytes", "streamed")

    def __init__(self, max_bytes: int, directory: Path | None) -> None:
        self._blocks = StreamBlocks()
        self._spools = StreamedTransactions(max_bytes, directory)
        self.peak_bytes = 0
        """The most bytes the spools held at once (benchmarks and the log)."""
        self.streamed = 0
        """Transactions whose first block arrived in this attempt."""

    @property
    def open(self) -> bool:
        """Whether a streamed transaction is neither committed nor aborted yet."""
        return len(self._spools) > 0

    @property
    def spooled_bytes(self) -> int:
        """Bytes the spools hold now."""
        return self._spools.size

    def takes(self, payload: bytes | memoryview) -> bool:
        """Whether the XLogData ``payload`` belongs here rather than to the usual path:
        inside a block every message does, between blocks the stream messages."""
        return self._blocks.block_xid is not None or (
            len(payload) > 0 and payload[0] in STREAM_TAGS
        )

    def handle(
        self, payload: bytes | memoryview, wal_start: Lsn
    ) -> Generator[ReplayFrame, None, None] | None:
        """One message :meth:`takes`; at a Stream Commit, the transaction's replay."""
        block = self._blocks.block_xid
        if block is not None and len(payload) > 0 and payload[0] in STREAMED_XID_TAGS:
            subxid, unstreamed = split_stream_xid(payload)
            spools = self._spools
            spools.append(block, subxid, wal_start, unstreamed)
            self.peak_bytes = max(self.peak_bytes, spools.size)
            return None
        message = self._blocks.decode(payload)
        if isinstance(message, StreamStart):
            if message.first_segment:
                self.streamed += 1
                log.info(
                    "transaction %d is streamed in progress: spooled until it ends", message.xid
                )
            self._spools.start(message.xid, first_segment=message.first_segment)
        elif isinstance(message, StreamAbort):
            self._spools.abort(message.xid, message.subxid)
            if message.subxid == message.xid:
                log.info("streamed transaction %d aborted: nothing of it is published", message.xid)
        elif isinstance(message, StreamCommit):
            held = self._spools.size
            changes = self._spools.commit(message.xid)
            log.info(
                "streamed transaction %d committed at %s: replaying its spool (%d bytes)",
                message.xid,
                format_lsn(message.end_lsn),
                held - self._spools.size,
            )
            return _replay(message, changes)
        # Stream Stop, and the Origin a replayed transaction's first block may carry:
        # nothing to keep.
        return None

    def close(self) -> None:
        """Release every spool (the end of the attempt)."""
        self._spools.close()
        self._blocks.reset()


def _replay(
    commit: StreamCommit, changes: Generator[StreamedChange, None, None]
) -> Generator[ReplayFrame, None, None]:
    """``commit``'s transaction as an unstreamed one: Begin, the changes, Commit. Closing
    the replay early closes the spool's file."""
    try:
        yield (
            _BEGIN.pack(BEGIN, commit.commit_lsn, commit.commit_time, commit.xid),
            commit.commit_lsn,
        )
        for change in changes:
            yield change.message, change.change_lsn
        yield (
            _COMMIT.pack(COMMIT, 0, commit.commit_lsn, commit.end_lsn, commit.commit_time),
            commit.end_lsn,
        )
    finally:
        changes.close()
