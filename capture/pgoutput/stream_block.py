"""Stream blocks: which pgoutput messages carry an xid, and the order blocks allow.

With protocol version 2 or later and ``streaming`` on, the server sends a transaction
larger than ``logical_decoding_work_mem`` before it commits, in *blocks*: Stream Start,
the changes streamed so far, Stream Stop. Inside a block, Relation, Type, Insert,
Update, Delete, Truncate and Message carry an Int32 xid right after their tag; outside
one they do not, and nothing in the message says which. :class:`StreamBlocks` keeps the
one bit of state this needs while it decodes messages in stream order.

Invariants:

- :meth:`StreamBlocks.decode` decodes with ``in_stream`` true exactly between a Stream
  Start and the next Stream Stop.
- Blocks do not nest; a Stream Stop closes an open block; Begin, Commit, Stream Commit,
  Stream Abort and the two-phase messages come only between blocks (pgoutput sends them
  outside). Anything else raises :class:`StreamOrderError` and leaves the state as it
  was: a stream out of order is not read on by guessing.
- The xid inside a block belongs to the (sub)transaction that made the change; Stream
  Start names the top-level transaction. A subxid cannot be told from any other xid, so
  it is not checked against the block's.
- :func:`split_stream_xid` turns a message read inside a block into its xid and its
  protocol-version-1 form (the same bytes without the xid), which is what an unstreamed
  transaction's message looks like.

Formats: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html;
design: docs/streaming.md.
"""

from __future__ import annotations

import struct

from capture.errors import ProtocolError
from capture.pgoutput.decode import decode
from capture.pgoutput.messages import (
    DELETE,
    INSERT,
    LOGICAL_MESSAGE,
    RELATION,
    TRUNCATE,
    TYPE,
    UPDATE,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Message,
    Prepare,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
)
from capture.pgoutput.reader import MalformedMessageError

STREAMED_XID_TAGS = frozenset({RELATION, TYPE, INSERT, UPDATE, DELETE, TRUNCATE, LOGICAL_MESSAGE})
"""Tags of the messages that carry an xid inside a stream block."""

_OUTSIDE_BLOCKS = (
    Begin,
    Commit,
    StreamCommit,
    StreamAbort,
    BeginPrepare,
    Prepare,
    CommitPrepared,
    RollbackPrepared,
    StreamPrepare,
)
_XID = struct.Struct("!I")


class StreamOrderError(ProtocolError):
    """A message arrived where the stream protocol does not allow it: a block inside a
    block, a Stream Stop without a block, or a transaction boundary inside a block."""

    def __init__(self, message: Message, block_xid: int | None) -> None:
        name = type(message).__name__
        where = (
            "between stream blocks"
            if block_xid is None
            else f"inside the stream block of transaction {block_xid}"
        )
        super().__init__(
            f"pgoutput {name} arrived {where}, which the protocol does not allow; the "
            "stream is not read further (nothing past the last good transaction is "
            "confirmed), and a restart reads it again"
        )
        self.message = message
        self.block_xid = block_xid


class StreamBlocks:
    """Decodes messages in stream order, knowing whether each is inside a block."""

    __slots__ = ("_xid",)

    def __init__(self) -> None:
        self._xid: int | None = None

    @property
    def block_xid(self) -> int | None:
        """The top-level xid of the open block, or None between blocks."""
        return self._xid

    def decode(self, buf: bytes | memoryview) -> Message:
        """The next message of the stream; opens and closes blocks as it goes."""
        xid = self._xid
        message = decode(buf, in_stream=xid is not None)
        if xid is None:
            if isinstance(message, StreamStart):
                self._xid = message.xid
            elif isinstance(message, StreamStop):
                raise StreamOrderError(message, None)
        elif isinstance(message, StreamStop):
            self._xid = None
        elif isinstance(message, (StreamStart, *_OUTSIDE_BLOCKS)):
            raise StreamOrderError(message, xid)
        return message

    def reset(self) -> None:
        """Forget any open block: a new connection starts between blocks."""
        self._xid = None


def split_stream_xid(buf: bytes | memoryview) -> tuple[int, bytes]:
    """The xid of a message read inside a stream block, and the message without it.

    Only the tag and the xid are read; the rest is returned as it is (it was already
    decoded, or will be, by :func:`~capture.pgoutput.decode`).
    """
    data = bytes(buf)
    if not data:
        raise MalformedMessageError(0, "pgoutput message tag", "empty message")
    if data[0] not in STREAMED_XID_TAGS:
        shown = chr(data[0]) if 0x20 < data[0] < 0x7F else "?"
        raise MalformedMessageError(
            0,
            "a message that carries an xid in a stream block ('R', 'Y', 'I', 'U', 'D', 'T' or 'M')",
            f"0x{data[0]:02x} ({shown!r})",
        )
    if len(data) < 1 + _XID.size:
        raise MalformedMessageError(1, "4 bytes", f"{len(data) - 1} bytes left in message")
    (xid,) = _XID.unpack_from(data, 1)
    return xid, data[:1] + data[1 + _XID.size :]
