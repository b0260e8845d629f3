"""Transactions in progress, streamed by the server: blocks into spools, Stream Commit
into a replay. No socket: the loop hands frames in and drains what comes out.

With ``CAPTURE_STREAMING`` the server sends a transaction that outgrows its
``logical_decoding_work_mem`` while it runs, in stream blocks, and ends it with Stream
Commit or Stream Abort (docs/streaming.md). :class:`InProgressTransactions` takes the
frames that belong to that protocol (:meth:`~InProgressTransactions.takes`) and:

- **Encodes and spools a block's changes** (:mod:`capture.stream.streamed_transactions`):
  each message that carries an xid has it taken off
  (:func:`~capture.pgoutput.stream_block.split_stream_xid`, which reads only the tag and
  the xid, bounds-checked). A row message the compiled encoder takes whole is stored
  encoded (:mod:`capture.stream.encoded_change`: the key fields and the value's images)
  by the table version of the transaction's own latest Relation of the table, that is
  the relation as it was when the change was made (but for a table with ``REPLICA
  IDENTITY FULL``, whose key capture reads from the catalog, which does not show what
  the open transaction changed); a Relation is decoded for that, and
  stored as it came, like every other message (in its protocol-version-1 form), to be
  decoded at the replay where an unstreamed transaction's are. Origin messages (no xid)
  carry nothing capture publishes and are not spooled.
- **Drops what aborts**: Stream Abort of a subtransaction voids it and the ones begun
  inside it, of the whole transaction its spool.
- **Replays at Stream Commit**: a Begin with the commit's LSN, time and xid, the spooled
  messages with their change LSNs, and a Commit with the end LSN, each as the bytes an
  unstreamed transaction's messages are, but the encoded changes, whose records need
  only the commit's fields, the ordinal and the headers written around them. For the
  replay the change stream knows the transaction's table versions
  (:attr:`~capture.stream.change_stream.ChangeStream.replayed_codecs`, set at the
  commit, cleared by the loop when the replay's last frame is handled) and takes them
  at the replayed Relations, so the encoded bytes match the version it encodes with.
  The replay (:class:`StreamedReplay`) is either iterated, one spooled change read per
  item, and its frames handed to
  :meth:`~capture.stream.change_stream.ChangeStream.handle_frame` as an unstreamed
  transaction's are; or, with the compiled stream, read by it from the spool's file
  itself (:meth:`~capture.stream.compiled_stream.CompiledStream.take_spool`: the same
  Begin, changes and Commit, over the spool's live ranges), which hands back the
  messages only the Python path takes. Either way the records, their ordinals and
  their positions are those of the same transaction sent unstreamed. The loop drains
  the replay under the in-flight bound and does not read the socket until it is done,
  which keeps the transactions after it in commit order.

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
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from capture.pgoutput import (
    Relation,
    ReplicaIdentity,
    StreamAbort,
    StreamBlocks,
    StreamCommit,
    StreamStart,
    decode,
    split_stream_xid,
)
from capture.pgoutput.messages import (
    BEGIN,
    COMMIT,
    RELATION,
    STREAM_ABORT,
    STREAM_COMMIT,
    STREAM_START,
    STREAM_STOP,
)
from capture.pgoutput.stream_block import STREAMED_XID_TAGS
from capture.rows.codec import TableCodec
from capture.stream import encoded_change
from capture.stream.change_stream import ChangeStream
from capture.stream.streamed_transactions import (
    CommittedSpool,
    SpoolEnd,
    StreamedChange,
    StreamedTransactions,
)
from schemas.lsn import Lsn, format_lsn

if TYPE_CHECKING:
    from capture.rows.native import RowEncoder

log = logging.getLogger(__name__)

STREAM_TAGS = frozenset({STREAM_START, STREAM_STOP, STREAM_COMMIT, STREAM_ABORT})
"""Tags of the stream protocol's own messages, which come between blocks (Stream Stop
closes one)."""

# Begin and Commit of protocol version 1, as pgoutput writes them.
_BEGIN = struct.Struct("!BQqI")
_COMMIT = struct.Struct("!BBQQq")

_FULL = ReplicaIdentity.FULL

ReplayFrame = tuple[bytes, Lsn]
"""A pgoutput message of a replayed transaction (protocol version 1) and the change LSN
an unstreamed frame of it carries (its XLogData ``wal_start``)."""


class _TableVersions:
    """The table versions one open streamed transaction encodes its changes with."""

    __slots__ = ("by_encoder", "current")

    def __init__(self) -> None:
        self.current: dict[int, TableCodec] = {}
        """By oid, the version of the transaction's latest Relation of the table."""
        self.by_encoder: dict[int, TableCodec] = {}
        """Every version that encoded a change, by its compiled encoder's ``id``: held
        so that the identity names one encoder until the replay ends."""


@dataclass(frozen=True, slots=True)
class BlockSpool:
    """The open stream block's spool, for the compiled stream to append the block's row
    changes to (:meth:`InProgressTransactions.block_spool`)."""

    xid: int
    end: SpoolEnd
    """Where and how much it may write, and the subxids it must refuse."""
    encoders: tuple[tuple[int, RowEncoder], ...]
    """By relation oid, the compiled encoder of the transaction's current version of the
    table: exactly the changes the Python path would encode as they arrive."""
    tags: tuple[int, ...]
    """The pgoutput tags of the row messages encoded whole
    (:attr:`~capture.stream.change_stream.ChangeStream.encoded_operations`)."""


class InProgressTransactions:
    """The streamed transactions of one replication attempt (see the module's text)."""

    __slots__ = (
        "_blocks",
        "_changes",
        "_spools",
        "_versions",
        "peak_bytes",
        "streamed",
        "written_bytes",
    )

    def __init__(
        self, max_bytes: int, directory: Path | None, changes: ChangeStream | None = None
    ) -> None:
        """``changes``: the change stream the replays go to, whose table versions encode
        the changes as they arrive; without it the spools hold the messages as they
        came, decoded and encoded at the replay."""
        self._blocks = StreamBlocks()
        self._spools = StreamedTransactions(max_bytes, directory)
        self._changes = changes
        self._versions: dict[int, _TableVersions] = {}
        self.peak_bytes = 0
        """The most bytes the spools held at once (benchmarks and the log)."""
        self.streamed = 0
        """Transactions whose first block arrived in this attempt."""
        self.written_bytes = 0
        """Spooled bytes the writer of :meth:`block_spool` appended (the log)."""

    @property
    def open(self) -> bool:
        """Whether a streamed transaction is neither committed nor aborted yet."""
        return len(self._spools) > 0

    @property
    def open_transactions(self) -> int:
        """Streamed transactions neither committed nor aborted yet."""
        return len(self._spools)

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

    def handle(self, payload: bytes | memoryview, wal_start: Lsn) -> StreamedReplay | None:
        """One message :meth:`takes`; at a Stream Commit, the transaction's replay."""
        block = self._blocks.block_xid
        if block is not None and len(payload) > 0 and payload[0] in STREAMED_XID_TAGS:
            subxid, unstreamed = split_stream_xid(payload)
            if self._changes is not None:
                unstreamed = self._as_spooled(block, unstreamed, wal_start, self._changes)
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
            if message.first_segment:
                self._versions[message.xid] = _TableVersions()
        elif isinstance(message, StreamAbort):
            self._spools.abort(message.xid, message.subxid)
            if message.subxid == message.xid:
                self._versions.pop(message.xid, None)
                log.info("streamed transaction %d aborted: nothing of it is published", message.xid)
        elif isinstance(message, StreamCommit):
            held = self._spools.size
            spool = self._spools.committed(message.xid)
            versions = self._versions.pop(message.xid, None)
            log.info(
                "streamed transaction %d committed at %s: replaying its spool (%d bytes)",
                message.xid,
                format_lsn(message.end_lsn),
                held - self._spools.size,
            )
            if self._changes is not None:
                # Until the loop ends the replay (it clears them): the replayed frames
                # are handled after the spool is read, a batch at a time.
                self._changes.replayed_codecs = {} if versions is None else versions.by_encoder
            return StreamedReplay(message, spool)
        # Stream Stop, and the Origin a replayed transaction's first block may carry:
        # nothing to keep.
        return None

    def block_spool(self) -> BlockSpool | None:
        """The open stream block's spool, where another writer may append the block's
        row changes as :meth:`handle` would (the compiled stream's,
        ``native/src/spool_writer.rs``), and hand back what it wrote through
        :meth:`spooled` before this object handles another message; None outside a block,
        or when no table of the transaction can be encoded as its changes arrive."""
        xid = self._blocks.block_xid
        changes = self._changes
        if xid is None or changes is None or xid not in self._spools:
            return None
        versions = self._versions.get(xid)
        if versions is None:
            return None
        encoders = []
        for oid, codec in versions.current.items():
            if codec.compiled is not None:
                # Held until the replay ends, as for a change encoded here.
                versions.by_encoder[id(codec.compiled)] = codec
                encoders.append((oid, codec.compiled))
        if not encoders:
            return None
        return BlockSpool(
            xid,
            self._spools.writable(xid),
            tuple(encoders),
            tuple(changes.encoded_operations),
        )

    def spooled(self, xid: int, runs: Iterable[tuple[int, int, int]]) -> None:
        """What the writer of :meth:`block_spool` appended to ``xid``'s spool: ``runs``
        of ``(subxid, start, end)``."""
        spools = self._spools
        before = spools.size
        spools.written(xid, runs)
        self.written_bytes += spools.size - before
        self.peak_bytes = max(self.peak_bytes, spools.size)

    def close(self) -> None:
        """Release every spool (the end of the attempt)."""
        self._spools.close()
        self._versions.clear()
        self._blocks.reset()

    def _as_spooled(
        self, xid: int, message: bytes, change_lsn: Lsn, changes: ChangeStream
    ) -> bytes:
        """What the spool of ``xid`` holds for ``message`` (protocol version 1): a row
        message encoded by the transaction's current version of its table where the
        compiled encoder takes it whole, anything else as it is."""
        versions = self._versions.get(xid)
        if versions is None:
            return message  # the spool refuses the change: no block of xid is open
        tag = message[0]
        if tag == RELATION:
            relation = decode(message)
            if isinstance(relation, Relation) and relation.replica_identity is _FULL:
                # Keyed from the catalog (by its primary key, capture.source.setup), which
                # shows nothing the open transaction changed: decoded at the commit.
                versions.current.pop(relation.oid, None)
            elif isinstance(relation, Relation):
                known = (*versions.current.values(), *versions.by_encoder.values())
                codec = changes.codec_in_stream(relation, known)
                if codec is None:
                    versions.current.pop(relation.oid, None)
                else:
                    versions.current[relation.oid] = codec
            return message
        if tag in changes.encoded_operations:
            codec = versions.current.get(int.from_bytes(message[1:5]))
            if codec is not None and codec.compiled is not None:
                encoded = encoded_change.encode(codec.compiled, message, change_lsn)
                if encoded is not None:
                    versions.by_encoder[id(codec.compiled)] = codec
                    return encoded
        return message


class StreamedReplay:
    """A committed streamed transaction's replay: an iterator of the unstreamed
    transaction's frames (Begin, the spooled changes, Commit), reading the spool one
    change per item; or its :attr:`commit` and :attr:`spool`, for a reader of the spool's
    file that builds the same frames (the compiled stream's). Closing it, whichever way
    it was read, releases the spool."""

    __slots__ = ("_frames", "commit", "spool")

    def __init__(self, commit: StreamCommit, spool: CommittedSpool) -> None:
        self.commit = commit
        self.spool = spool
        self._frames: Generator[ReplayFrame, None, None] | None = None

    def __iter__(self) -> StreamedReplay:
        return self

    def __next__(self) -> ReplayFrame:
        frames = self._frames
        if frames is None:
            frames = self._frames = _replay(self.commit, self.spool.changes())
        return next(frames)

    def close(self) -> None:
        """Release the spool (at the replay's end, or midway with its attempt)."""
        if self._frames is not None:
            self._frames.close()
        self.spool.close()


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
