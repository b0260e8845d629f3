"""Streamed transactions, spooled to disk until their commit: pure bookkeeping, no socket.

With ``streaming`` on, PostgreSQL sends a large transaction in blocks while it runs and
ends it with Stream Commit or Stream Abort (docs/streaming.md). A record needs its
transaction's commit LSN and time, and consumers must see whole committed transactions
in commit order, so nothing is published before the commit: each top-level transaction's
changes go to a spool file of their own, and come back in stream order at the commit.

Invariants:

- A spooled change is a pgoutput message in its protocol-version-1 form (the block's xid
  taken off, :func:`capture.pgoutput.stream_block.split_stream_xid`), or a row already
  encoded (:mod:`capture.stream.encoded_change`), with its change LSN (the XLogData
  ``wal_start``) and the subxid it carried; this module stores the bytes it is given and
  reads neither. Replayed at the commit between a Begin and a Commit, it yields the
  records the unstreamed transaction would.
- **Subtransaction aborts.** A session runs one subtransaction at a time and the server
  streams changes in the order they were made, so every change streamed after the first
  change of the subtransaction ``S`` that Stream Abort names was made by the rolled-back
  subtransaction or by one begun inside it. :meth:`StreamedTransactions.abort` therefore
  voids ``S`` and every subxid first seen after ``S``; void changes never come back. When
  they are the end of the file, the file is cut back, so the space returns at once.
  A change of a void subxid is a :class:`ProtocolError`.
- **Live ranges.** The spool also keeps its *runs*: the byte ranges of consecutive
  changes of one subxid, one per switch from a subxid to another (the server switches
  when a subtransaction begins or ends). At the commit the runs of subxids not void,
  merged where they touch, are the file's live ranges (:attr:`CommittedSpool.ranges`),
  so a reader of the file (the compiled stream's, ``native/src/spool_replay.rs``) skips
  the void bytes unread. Past :data:`_MAX_RUNS` switches the spool stops keeping runs
  and its one live range is the whole file. Either way the reader still skips an entry
  by its subxid (:attr:`CommittedSpool.void`), as the Python replay does: the subxid
  decides, the ranges only save reading.
- **Bounded memory**: per transaction, the file's size, per subxid where its changes
  start and end, and at most :data:`_MAX_RUNS` runs; reading back goes one change at a
  time through a buffered file.
- **Bounded disk**: all open spools together hold at most ``max_bytes``; the change that
  would pass it raises :class:`StreamedTransactionTooLargeError`.
- **Nothing survives the process**: files are unnamed temporary files. A new connection
  must :meth:`~StreamedTransactions.discard` every spool, because the server streams
  each open transaction again from its first change (Stream Start with first-segment
  set), which also discards that transaction's spool.

Used by :mod:`capture.stream.in_progress` when ``CAPTURE_STREAMING`` is on.
Formats: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from capture.errors import ConfigError, ProtocolError, TransientError
from schemas.lsn import Lsn

# subxid, change LSN, length of the message that follows.
_ENTRY = struct.Struct(">IQI")
_MAX_RUNS = 4096
"""Runs a spool keeps (see the module's text): a transaction switching subtransactions
more often (a loop with an exception block per row) is read whole, void entries skipped
one by one."""


@dataclass(frozen=True, slots=True)
class StreamedChange:
    """One spooled change, as it comes back at the commit."""

    change_lsn: Lsn
    message: bytes
    """The pgoutput message in its protocol-version-1 form (no xid)."""


class StreamedTransactionTooLargeError(ConfigError):
    """The spools of open streamed transactions would outgrow their byte limit.

    A retry that streams would not help: the server streams the same transaction again.
    The service goes on without streaming instead (:mod:`capture.service`).
    """

    def __init__(self, xid: int, held: int, total: int, max_bytes: int) -> None:
        super().__init__(
            f"streamed transaction {xid} needs more spool space: it holds {held} bytes, "
            f"all open streamed transactions {total} bytes, and the limit is {max_bytes} "
            "bytes; raise the limit, CAPTURE_STREAMING_SPOOL_MAX_BYTES (and make room for "
            "it in CAPTURE_SPOOL_DIR), or set CAPTURE_STREAMING=false to let the server "
            "spill such transactions itself, or split the transaction"
        )
        self.xid = xid
        self.held = held
        self.total = total
        self.max_bytes = max_bytes


@dataclass(frozen=True, slots=True)
class SpoolEnd:
    """An open spool's end, for another writer of its file
    (:meth:`StreamedTransactions.writable`)."""

    fd: int
    """The file's descriptor: the writer duplicates it, and writes at positions."""
    at: int
    """The byte the next entry starts at."""
    room: int
    """The bytes all open spools may still take under the limit."""
    void: frozenset[int]
    """The subxids rolled back: their changes are refused."""


@dataclass(slots=True)
class _Subxact:
    """Where one subxid's changes sit in its transaction's file."""

    first_at: int
    end_at: int


@dataclass(slots=True)
class _Run:
    """Consecutive changes of one subxid: bytes ``start`` to ``end`` of the file."""

    subxid: int
    start: int
    end: int


class _Spool:
    """One top-level transaction's changes; the file is made at the first change."""

    __slots__ = ("file", "moved", "ranged", "runs", "size", "subxacts", "void")

    def __init__(self) -> None:
        self.file: IO[bytes] | None = None
        self.size = 0
        self.moved = False
        """Whether another writer appended to :attr:`file` since this object last wrote
        to it (:meth:`StreamedTransactions.written`): its position is then not the
        end."""
        # In order of first appearance (dicts keep insertion order).
        self.subxacts: dict[int, _Subxact] = {}
        self.void: set[int] = set()
        self.runs: list[_Run] = []
        self.ranged = True
        """Whether :attr:`runs` covers the file (until :data:`_MAX_RUNS`)."""

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class StreamedTransactions:
    """The spools of the streamed transactions not committed or aborted yet, by xid."""

    __slots__ = ("_directory", "_max_bytes", "_spools", "_total")

    def __init__(self, max_bytes: int, directory: Path | None = None) -> None:
        if max_bytes <= 0:
            raise ConfigError(
                f"the streamed-transaction spool limit must be positive, not {max_bytes}"
            )
        self._max_bytes = max_bytes
        self._directory = directory
        self._spools: dict[int, _Spool] = {}
        self._total = 0

    def __len__(self) -> int:
        """Open streamed transactions."""
        return len(self._spools)

    def __contains__(self, xid: object) -> bool:
        return xid in self._spools

    @property
    def size(self) -> int:
        """Bytes held by all open spools."""
        return self._total

    def start(self, xid: int, *, first_segment: bool) -> None:
        """A Stream Start: the first segment begins the transaction (again, after a
        reconnect: whatever an earlier connection streamed of it is discarded)."""
        if first_segment:
            self._drop(xid)
            self._spools[xid] = _Spool()
        elif xid not in self._spools:
            raise ProtocolError(
                f"a stream block continues transaction {xid}, whose first block this "
                "connection never received; the stream is not read further"
            )

    def append(self, xid: int, subxid: int, change_lsn: Lsn, message: bytes) -> None:
        """Spool one change of the block of ``xid``, made by ``subxid``."""
        spool = self._open(xid, "a change")
        if subxid in spool.void:
            raise ProtocolError(
                f"transaction {xid} streamed a change of subtransaction {subxid} after "
                "its abort; the stream is not read further"
            )
        entry = _ENTRY.size + len(message)
        if self._total + entry > self._max_bytes:
            raise StreamedTransactionTooLargeError(xid, spool.size, self._total, self._max_bytes)
        file = spool.file
        if file is None:
            file = spool.file = self._new_file()
        try:
            if spool.moved:
                file.seek(spool.size)
                spool.moved = False
            # One write per change: a failure leaves no header without its message
            # behind (and ends the attempt, whose retry discards every spool).
            file.write(_ENTRY.pack(subxid, change_lsn, len(message)) + message)
        except OSError as exc:
            raise TransientError(
                f"cannot write the spool of streamed transaction {xid}: {exc}"
            ) from exc
        subxact = spool.subxacts.get(subxid)
        if subxact is None:
            spool.subxacts[subxid] = _Subxact(spool.size, spool.size + entry)
        else:
            subxact.end_at = spool.size + entry
        if spool.ranged:
            _extend_runs(spool, subxid, spool.size + entry)
        spool.size += entry
        self._total += entry

    def writable(self, xid: int) -> SpoolEnd:
        """Where another writer appends the next changes of ``xid``'s open spool (the
        compiled stream's, ``native/src/spool_writer.rs``): its file, written out and
        made if it was not yet; the byte the next entry starts at; the bytes the limit
        leaves; the subxids rolled back. It must hand back what it wrote, before this
        object writes again, through :meth:`written`."""
        spool = self._open(xid, "a stream block")
        file = spool.file
        if file is None:
            file = spool.file = self._new_file()
        try:
            file.flush()
        except OSError as exc:
            raise TransientError(
                f"cannot write the spool of streamed transaction {xid}: {exc}"
            ) from exc
        return SpoolEnd(
            file.fileno(), spool.size, self._max_bytes - self._total, frozenset(spool.void)
        )

    def written(self, xid: int, runs: Iterable[tuple[int, int, int]]) -> None:
        """Another writer appended entries to ``xid``'s spool at :meth:`writable`'s
        end: ``runs`` of ``(subxid, start, end)``, the byte ranges of consecutive
        entries of one subxid, in order, each starting where the spool ended. Taken as
        :meth:`append` takes its own entries."""
        spool = self._open(xid, "a spooled change")
        for subxid, start, end in runs:
            if start != spool.size or end <= start:
                raise RuntimeError(
                    f"the spool of transaction {xid} ends at byte {spool.size}, and a "
                    f"writer appended bytes {start} to {end}: the writer and the spool "
                    "are out of step"
                )
            if subxid in spool.void:
                raise RuntimeError(
                    f"a writer spooled a change of subtransaction {subxid} of transaction "
                    f"{xid} after its abort: the writer and the spool are out of step"
                )
            subxact = spool.subxacts.get(subxid)
            if subxact is None:
                spool.subxacts[subxid] = _Subxact(start, end)
            else:
                subxact.end_at = end
            if spool.ranged:
                _extend_runs(spool, subxid, end)
            spool.size = end
            self._total += end - start
            spool.moved = True

    def abort(self, xid: int, subxid: int) -> None:
        """A Stream Abort: the whole transaction when ``subxid == xid``, else the
        subtransaction and those begun inside it. Aborting what holds no change (it was
        never streamed, or only changes of unpublished tables were) changes nothing."""
        if subxid == xid:
            self._drop(xid)
            return
        spool = self._spools.get(xid)
        if spool is None or subxid not in spool.subxacts:
            if spool is not None:
                spool.void.add(subxid)
            return
        order = list(spool.subxacts)
        voided = order[order.index(subxid) :]
        cut = spool.subxacts[subxid].first_at
        for gone in voided:
            del spool.subxacts[gone]
        spool.void.update(voided)
        if all(kept.end_at <= cut for kept in spool.subxacts.values()):
            self._cut(xid, spool, cut)

    def commit(self, xid: int) -> Generator[StreamedChange, None, None]:
        """A Stream Commit: the transaction's changes in stream order, void ones left
        out. The transaction is no longer open from this call on; its file is closed
        when the iterator ends or is closed."""
        return self.committed(xid).changes()

    def committed(self, xid: int) -> CommittedSpool:
        """A Stream Commit: the transaction's spool, for its replay. The transaction is
        no longer open from this call on; the spool's file is closed with it."""
        spool = self._spools.pop(xid, None)
        if spool is None:
            raise ProtocolError(
                f"Stream Commit of transaction {xid}, which this connection did not "
                "see streamed; the stream is not read further"
            )
        self._total -= spool.size
        return CommittedSpool(xid, spool)

    def discard(self) -> None:
        """Drop every open spool: a new connection streams them again from the start."""
        for xid in list(self._spools):
            self._drop(xid)

    def close(self) -> None:
        """Release every file (:meth:`discard`)."""
        self.discard()

    def _open(self, xid: int, what: str) -> _Spool:
        spool = self._spools.get(xid)
        if spool is None:
            raise ProtocolError(
                f"{what} of transaction {xid} arrived outside any stream of it this "
                "connection received; the stream is not read further"
            )
        return spool

    def _new_file(self) -> IO[bytes]:
        directory = self._directory
        try:
            if directory is not None:
                directory.mkdir(parents=True, exist_ok=True)
            return tempfile.TemporaryFile(prefix="streamed-transaction-", dir=directory)
        except OSError as exc:
            where = "the system temporary directory" if directory is None else str(directory)
            raise ConfigError(
                f"cannot create a spool file for a streamed transaction in {where}: {exc}; "
                "set CAPTURE_SPOOL_DIR to a writable directory"
            ) from exc

    def _cut(self, xid: int, spool: _Spool, cut: int) -> None:
        file = spool.file
        if file is not None:
            try:
                file.flush()
                file.truncate(cut)
                file.seek(cut)
            except OSError as exc:
                raise TransientError(
                    f"cannot cut back the spool of streamed transaction {xid}: {exc}"
                ) from exc
        self._total -= spool.size - cut
        spool.size = cut
        runs = spool.runs
        while runs and runs[-1].start >= cut:
            runs.pop()
        if runs and runs[-1].end > cut:
            runs[-1].end = cut
        if not spool.ranged and cut == 0:
            spool.ranged = True

    def _drop(self, xid: int) -> None:
        spool = self._spools.pop(xid, None)
        if spool is not None:
            self._total -= spool.size
            spool.close()


class CommittedSpool:
    """A committed transaction's spool, as its replay reads it: in Python one change at a
    time (:meth:`changes`), or by another reader of :attr:`file` over :attr:`ranges`.
    Closing it (or the end of :meth:`changes`) closes the file."""

    __slots__ = ("_spool", "ranges", "void", "xid")

    def __init__(self, xid: int, spool: _Spool) -> None:
        self.xid = xid
        self._spool = spool
        self.void: frozenset[int] = frozenset(spool.void)
        """The subxids rolled back: their entries are left out wherever they are."""
        ranges: list[tuple[int, int]] = []
        runs = spool.runs if spool.ranged else [_Run(xid, 0, spool.size)]
        for run in runs:
            if run.subxid in spool.void:
                continue
            if ranges and ranges[-1][1] == run.start:
                ranges[-1] = (ranges[-1][0], run.end)
            else:
                ranges.append((run.start, run.end))
        self.ranges: tuple[tuple[int, int], ...] = tuple(ranges)
        """The byte ranges of the file that may hold changes the replay keeps, in file
        order; the bytes between them are changes of rolled-back subtransactions."""

    @property
    def file(self) -> IO[bytes] | None:
        """The spool's file, all written out (None when no change was spooled, or once
        closed); its own position is not the reader's to rely on."""
        file = self._spool.file
        if file is not None:
            try:
                file.flush()
            except OSError as exc:
                raise TransientError(
                    f"cannot write the spool of streamed transaction {self.xid}: {exc}"
                ) from exc
        return file

    def changes(self) -> Generator[StreamedChange, None, None]:
        """The changes in stream order, void ones left out, read one at a time; the file
        is closed when the iterator ends or is closed."""
        xid, spool = self.xid, self._spool
        file, void, size = spool.file, spool.void, spool.size
        try:
            if file is None:
                return
            file.flush()
            file.seek(0)
            at = 0
            while at < size:
                subxid, change_lsn, length = _ENTRY.unpack(_read(file, _ENTRY.size, xid))
                message = _read(file, length, xid)
                at += _ENTRY.size + length
                if subxid not in void:
                    yield StreamedChange(Lsn(change_lsn), message)
        except OSError as exc:
            raise TransientError(
                f"cannot read the spool of streamed transaction {xid}: {exc}"
            ) from exc
        finally:
            spool.close()

    def close(self) -> None:
        """Release the file."""
        self._spool.close()


def _extend_runs(spool: _Spool, subxid: int, end: int) -> None:
    """The spool's runs after a change of ``subxid`` ending at byte ``end``; none past
    :data:`_MAX_RUNS`."""
    runs = spool.runs
    if runs and runs[-1].subxid == subxid:
        runs[-1].end = end
    elif len(runs) < _MAX_RUNS:
        runs.append(_Run(subxid, spool.size, end))
    else:
        spool.ranged = False
        runs.clear()


def _read(file: IO[bytes], size: int, xid: int) -> bytes:
    data = file.read(size)
    if len(data) != size:
        raise OSError(
            f"the spool of streamed transaction {xid} is short by {size - len(data)} bytes"
        )
    return data
