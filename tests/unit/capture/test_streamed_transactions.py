"""Streamed transactions spool to disk and come back, at the commit, without what aborted."""

from __future__ import annotations

import os
import struct
import tracemalloc
from pathlib import Path

import pytest

from capture.errors import ConfigError, ProtocolError
from capture.pgoutput import Insert, StreamAbort, StreamCommit, StreamStart, decode
from capture.pgoutput.stream_block import StreamBlocks, split_stream_xid
from capture.stream import streamed_transactions
from capture.stream.streamed_transactions import (
    CommittedSpool,
    StreamedChange,
    StreamedTransactions,
    StreamedTransactionTooLargeError,
)
from schemas.lsn import Lsn

XID = 900
OTHER = 950
LIMIT = 1 << 20
# Each entry spools its subxid, change LSN and length before the message.
OVERHEAD = 16


def change(n: int) -> bytes:
    """A protocol-1 Insert of row ``n`` (its content only matters for identity)."""
    text = str(n).encode()
    return b"I" + struct.pack("!I", 16384) + b"N" + struct.pack("!HcI", 1, b"t", len(text)) + text


def spooled(
    spool: StreamedTransactions, xid: int, changes: list[tuple[int, int]]
) -> list[StreamedChange]:
    """Append ``(subxid, n)`` changes at LSN ``n``; return what each should come back as."""
    out = []
    for subxid, n in changes:
        spool.append(xid, subxid, Lsn(n), change(n))
        out.append(StreamedChange(Lsn(n), change(n)))
    return out


@pytest.fixture
def spool(tmp_path: Path):
    transactions = StreamedTransactions(LIMIT, tmp_path)
    yield transactions
    transactions.close()


def test_a_committed_transaction_comes_back_in_stream_order(spool):
    spool.start(XID, first_segment=True)
    sent = spooled(spool, XID, [(XID, 1), (XID + 1, 2), (XID, 3)])
    spool.start(XID, first_segment=False)
    sent += spooled(spool, XID, [(XID, 4)])
    assert XID in spool
    assert spool.size == sum(OVERHEAD + len(c.message) for c in sent)
    assert list(spool.commit(XID)) == sent
    assert XID not in spool
    assert len(spool) == 0
    assert spool.size == 0


def test_transactions_streamed_in_turn_stay_apart(spool):
    spool.start(XID, first_segment=True)
    mine = spooled(spool, XID, [(XID, 1)])
    spool.start(OTHER, first_segment=True)
    theirs = spooled(spool, OTHER, [(OTHER, 2), (OTHER, 3)])
    spool.start(XID, first_segment=False)
    mine += spooled(spool, XID, [(XID, 4)])
    assert len(spool) == 2
    assert list(spool.commit(OTHER)) == theirs
    assert list(spool.commit(XID)) == mine


def test_a_transaction_without_changes_commits_nothing(spool):
    spool.start(XID, first_segment=True)
    assert list(spool.commit(XID)) == []


def test_an_aborted_subtransaction_is_cut_off_the_end(spool):
    spool.start(XID, first_segment=True)
    kept = spooled(spool, XID, [(XID, 1), (XID, 2)])
    size = spool.size
    spooled(spool, XID, [(XID + 1, 3), (XID + 1, 4)])
    spool.abort(XID, XID + 1)
    # The rollback came right after the subtransaction's changes: the space is back.
    assert spool.size == size
    kept += spooled(spool, XID, [(XID, 5)])
    assert list(spool.commit(XID)) == kept


def test_a_subtransaction_begun_inside_an_aborted_one_is_void_too(spool):
    """SAVEPOINT a; INSERT; SAVEPOINT b; INSERT; ROLLBACK TO a: the server may name only
    a; b began inside it."""
    spool.start(XID, first_segment=True)
    kept = spooled(spool, XID, [(XID, 1)])
    spooled(spool, XID, [(XID + 1, 2), (XID + 2, 3), (XID + 1, 4)])
    spool.abort(XID, XID + 1)
    kept += spooled(spool, XID, [(XID, 5)])
    assert list(spool.commit(XID)) == kept
    # b's changes are gone with a's: one arriving now would be out of order.
    spool2 = StreamedTransactions(LIMIT)
    spool2.start(XID, first_segment=True)
    spooled(spool2, XID, [(XID + 1, 1), (XID + 2, 2)])
    spool2.abort(XID, XID + 1)
    with pytest.raises(ProtocolError, match="subtransaction 902 after its abort"):
        spool2.append(XID, XID + 2, Lsn(3), change(3))
    spool2.close()


def test_a_released_savepoint_rolled_back_with_its_parent(spool):
    """SAVEPOINT a; INSERT 1; SAVEPOINT b; INSERT 2; RELEASE b; INSERT 3; ROLLBACK TO a:
    aborts of b then a. At b's abort a's change 3 follows b's, so the file is not cut and
    b's change is skipped instead; a's abort then cuts everything back."""
    spool.start(XID, first_segment=True)
    kept = spooled(spool, XID, [(XID, 0)])
    size = spool.size
    spooled(spool, XID, [(XID + 1, 1), (XID + 2, 2), (XID + 1, 3)])
    spool.abort(XID, XID + 2)
    assert spool.size > size
    spool.abort(XID, XID + 1)
    assert spool.size == size
    assert list(spool.commit(XID)) == kept


def test_an_earlier_subtransactions_later_change_waits_for_its_own_abort(spool):
    """Abort of b after a change of a, first seen before b: only b (and what began after
    it) is void. a's change stays until a's own Stream Abort, which the server sends
    when it rolls a back (here it never comes)."""
    spool.start(XID, first_segment=True)
    kept = spooled(spool, XID, [(XID + 1, 1)])
    spooled(spool, XID, [(XID + 2, 2)])
    kept += spooled(spool, XID, [(XID + 1, 3)])
    spool.abort(XID, XID + 2)
    assert list(spool.commit(XID)) == kept


def test_aborting_a_subtransaction_that_streamed_nothing_changes_nothing(spool):
    spool.start(XID, first_segment=True)
    kept = spooled(spool, XID, [(XID, 1)])
    size = spool.size
    spool.abort(XID, XID + 7)
    spool.abort(OTHER, OTHER + 1)  # a transaction without a spool: nothing held
    assert spool.size == size
    with pytest.raises(ProtocolError):
        spool.append(XID, XID + 7, Lsn(2), change(2))
    assert list(spool.commit(XID)) == kept


def test_an_aborted_transaction_leaves_nothing(spool):
    spool.start(XID, first_segment=True)
    spooled(spool, XID, [(XID, 1), (XID + 1, 2)])
    spool.abort(XID, XID)
    assert XID not in spool
    assert spool.size == 0
    with pytest.raises(ProtocolError, match="Stream Commit of transaction 900"):
        spool.commit(XID)
    with pytest.raises(ProtocolError, match="never received"):
        spool.start(XID, first_segment=False)
    with pytest.raises(ProtocolError, match="a change of transaction 900"):
        spool.append(XID, XID, Lsn(3), change(3))


def test_a_first_segment_again_starts_the_transaction_over(spool):
    """After a reconnect the server streams an open transaction from its start."""
    spool.start(XID, first_segment=True)
    spooled(spool, XID, [(XID, 1), (XID, 2)])
    spool.start(XID, first_segment=True)
    again = spooled(spool, XID, [(XID, 1)])
    assert spool.size == OVERHEAD + len(change(1))
    assert list(spool.commit(XID)) == again


def test_discard_drops_every_open_transaction(spool):
    for xid in (XID, OTHER):
        spool.start(xid, first_segment=True)
        spooled(spool, xid, [(xid, 1)])
    spool.discard()
    assert len(spool) == 0
    assert spool.size == 0


def test_the_byte_limit_covers_all_open_transactions(tmp_path):
    entry = OVERHEAD + len(change(1))
    spool = StreamedTransactions(3 * entry, tmp_path)
    spool.start(XID, first_segment=True)
    spool.start(OTHER, first_segment=True)
    spooled(spool, XID, [(XID, 1), (XID, 1)])
    spooled(spool, OTHER, [(OTHER, 1)])
    with pytest.raises(StreamedTransactionTooLargeError) as info:
        spool.append(XID, XID, Lsn(1), change(1))
    error = info.value
    assert isinstance(error, ConfigError)
    assert (error.xid, error.held, error.total, error.max_bytes) == (
        XID,
        2 * entry,
        3 * entry,
        3 * entry,
    )
    assert "raise the limit" in str(error)
    # The refused change was not spooled, and a commit frees its transaction's share.
    assert len(list(spool.commit(OTHER))) == 1
    spooled(spool, XID, [(XID, 1)])
    assert len(list(spool.commit(XID))) == 3
    spool.close()


def test_a_limit_must_be_positive():
    with pytest.raises(ConfigError, match="must be positive"):
        StreamedTransactions(0)


def test_a_missing_spool_directory_is_created(tmp_path):
    directory = tmp_path / "not" / "yet"
    spool = StreamedTransactions(LIMIT, directory)
    spool.start(XID, first_segment=True)
    spooled(spool, XID, [(XID, 1)])
    assert directory.is_dir()
    spool.close()


def test_an_unwritable_spool_directory_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    spool = StreamedTransactions(LIMIT, blocker / "spool")
    spool.start(XID, first_segment=True)
    with pytest.raises(ConfigError, match="CAPTURE_SPOOL_DIR"):
        spool.append(XID, XID, Lsn(1), change(1))


def test_memory_does_not_grow_with_the_transaction(tmp_path):
    spool = StreamedTransactions(64 << 20, tmp_path)
    spool.start(XID, first_segment=True)
    row = b"I" + b"x" * 1000
    spool.append(XID, XID, Lsn(0), row)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(1, 5000):
            spool.append(XID, XID + n % 3, Lsn(n), row)
        grown = tracemalloc.get_traced_memory()[0] - before
        replayed = 0
        peak_before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for item in spool.commit(XID):
            replayed += len(item.message)
        peak = tracemalloc.get_traced_memory()[1] - peak_before
    finally:
        tracemalloc.stop()
    assert replayed == 5000 * len(row)
    # 5 MB went to the file; memory holds a few objects per subxid, and the replay one
    # change at a time (plus the file's read buffer).
    assert grown < 64 << 10
    assert peak < 256 << 10


def test_a_stream_with_a_rolled_back_savepoint_replays_as_the_unstreamed_transaction(spool):
    """From the wire to the replay: blocks decoded in order, changes spooled without
    their xid, the savepoint's abort, the commit; what comes back decodes to the
    unstreamed transaction's messages, without the rolled-back rows."""

    def insert(xid: int, n: int) -> bytes:
        return b"I" + struct.pack("!I", xid) + change(n)[1:]

    wire = [
        (0x100, b"S" + struct.pack("!IB", XID, 1)),
        (0x110, insert(XID, 1)),
        (0x120, insert(XID + 1, 2)),
        (0x130, b"E"),
        (0x140, b"S" + struct.pack("!IB", XID, 0)),
        (0x150, insert(XID + 1, 3)),
        (0x160, b"E"),
        (0x170, b"A" + struct.pack("!II", XID, XID + 1)),
        (0x180, b"S" + struct.pack("!IB", XID, 0)),
        (0x190, insert(XID, 4)),
        (0x1A0, b"E"),
        (0x1B0, b"c" + struct.pack("!IBQQq", XID, 0, 0x1C0, 0x1D0, 42)),
    ]
    blocks = StreamBlocks()
    replayed: list[tuple[Lsn, bytes]] = []
    for wal_start, payload in wire:
        message = blocks.decode(payload)
        block = blocks.block_xid
        if isinstance(message, StreamStart):
            spool.start(message.xid, first_segment=message.first_segment)
        elif isinstance(message, StreamAbort):
            spool.abort(message.xid, message.subxid)
        elif isinstance(message, StreamCommit):
            replayed = [(c.change_lsn, c.message) for c in spool.commit(message.xid)]
        elif block is not None and isinstance(message, Insert):
            subxid, unstreamed = split_stream_xid(payload)
            assert subxid == message.xid
            spool.append(block, subxid, Lsn(wal_start), unstreamed)
    assert [lsn for lsn, _ in replayed] == [0x110, 0x190]
    assert [decode(m) for _, m in replayed] == [decode(change(n)) for n in (1, 4)]


def _read_ranges(committed: CommittedSpool) -> list[StreamedChange]:
    """What a reader of the committed spool's file over its live ranges finds, entries
    of void subxids skipped, as the compiled stream's reader reads it."""
    file = committed.file
    assert file is not None
    out = []
    for start, end in committed.ranges:
        file.seek(start)
        data = file.read(end - start)
        at = 0
        while at < len(data):
            subxid, change_lsn, length = struct.unpack_from(">IQI", data, at)
            message = data[at + OVERHEAD : at + OVERHEAD + length]
            at += OVERHEAD + length
            if subxid not in committed.void:
                out.append(StreamedChange(Lsn(change_lsn), message))
        assert at == len(data)  # a range ends where an entry does
    return out


def test_the_live_ranges_leave_out_a_rolled_back_subtransaction_in_the_middle(spool):
    """a, b, then a again; b rolled back: its bytes are a gap between two ranges."""
    spool.start(XID, first_segment=True)
    kept = spooled(spool, XID, [(XID, 0), (XID + 1, 1)])
    gap_start = spool.size
    spooled(spool, XID, [(XID + 2, 2), (XID + 3, 3)])  # d began inside b
    gap_end = spool.size
    kept += spooled(spool, XID, [(XID + 1, 4), (XID, 5)])
    spool.abort(XID, XID + 2)
    committed = spool.committed(XID)
    assert committed.ranges == ((0, gap_start), (gap_end, gap_end + gap_start))
    assert committed.void == {XID + 2, XID + 3}
    assert _read_ranges(committed) == kept
    assert list(committed.changes()) == kept
    assert committed.file is None  # the replay closed it


def test_the_live_ranges_after_a_cut_and_without_an_abort(spool):
    spool.start(XID, first_segment=True)
    kept = spooled(spool, XID, [(XID, 0), (XID + 1, 1), (XID, 2)])
    size = spool.size
    spooled(spool, XID, [(XID + 2, 3)])
    spool.abort(XID, XID + 2)  # the tail: cut off
    kept += spooled(spool, XID, [(XID, 4)])
    committed = spool.committed(XID)
    assert committed.ranges == ((0, size + OVERHEAD + len(change(4))),)
    assert _read_ranges(committed) == kept
    committed.close()
    # A transaction that spooled nothing has no file and no range.
    spool.start(OTHER, first_segment=True)
    empty = spool.committed(OTHER)
    assert (empty.file, empty.ranges) == (None, ())


def test_past_the_runs_it_keeps_the_spool_is_one_range_read_by_subxid(spool, monkeypatch):
    monkeypatch.setattr(streamed_transactions, "_MAX_RUNS", 4)
    spool.start(XID, first_segment=True)
    kept = spooled(spool, XID, [(XID, 0), (XID + 1, 1), (XID, 2), (XID + 1, 3)])
    spooled(spool, XID, [(XID + 2, 4)])
    kept += spooled(spool, XID, [(XID + 1, 5), (XID, 6)])
    spool.abort(XID, XID + 2)
    committed = spool.committed(XID)
    assert committed.ranges == ((0, spool_size(kept) + OVERHEAD + len(change(4))),)
    assert _read_ranges(committed) == kept
    assert list(committed.changes()) == kept


def spool_size(changes: list[StreamedChange]) -> int:
    return sum(OVERHEAD + len(c.message) for c in changes)


def _write_at(spool: StreamedTransactions, xid: int, changes: list[tuple[int, int]]) -> None:
    """Append ``(subxid, n)`` changes as another writer of the file does (the compiled
    stream's): at the end :meth:`writable` gives, by descriptor, then hand back the runs."""
    end = spool.writable(xid)
    at = end.at
    runs: list[tuple[int, int, int]] = []
    for subxid, n in changes:
        entry = struct.pack(">IQI", subxid, n, len(change(n))) + change(n)
        assert len(entry) <= end.room
        written = os.pwrite(end.fd, entry, at)
        assert written == len(entry)
        if runs and runs[-1][0] == subxid:
            runs[-1] = (subxid, runs[-1][1], at + len(entry))
        else:
            runs.append((subxid, at, at + len(entry)))
        at += len(entry)
    spool.written(xid, runs)


def test_changes_another_writer_appends_come_back_between_this_ones(spool):
    """Entries written at positions by another writer and handed back as runs are kept
    as this object's own: in order with the ones it writes before and after (it seeks
    past them), counted against the limit, and cut with an aborted subtransaction."""
    spool.start(XID, first_segment=True)
    sent = spooled(spool, XID, [(XID, 1)])
    _write_at(spool, XID, [(XID, 2), (XID, 3), (XID + 1, 4)])
    sent += [StreamedChange(Lsn(n), change(n)) for n in (2, 3)]
    size = spool.size
    assert size == sum(OVERHEAD + len(change(n)) for n in (1, 2, 3, 4))
    assert spool.writable(XID).room == LIMIT - size
    # The subtransaction the other writer spooled rolls back: cut off the end.
    spool.abort(XID, XID + 1)
    assert spool.writable(XID).void == frozenset({XID + 1})
    sent += spooled(spool, XID, [(XID, 5)])
    _write_at(spool, XID, [(XID, 6)])
    sent += [StreamedChange(Lsn(6), change(6))]
    sent += spooled(spool, XID, [(XID, 7)])
    assert list(spool.commit(XID)) == sent


def test_runs_that_do_not_start_at_the_spools_end_are_refused(spool):
    """A writer out of step with the bookkeeping (a gap, an overlap, a subxid already
    rolled back) is a bug that would corrupt the replay: refused, not taken."""
    spool.start(XID, first_segment=True)
    spooled(spool, XID, [(XID, 1), (XID + 1, 2)])
    end = spool.size
    with pytest.raises(RuntimeError, match="out of step"):
        spool.written(XID, [(XID, end + 1, end + 40)])
    with pytest.raises(RuntimeError, match="out of step"):
        spool.written(XID, [(XID, end - 1, end + 40)])
    spool.abort(XID, XID + 1)
    cut = spool.size
    with pytest.raises(RuntimeError, match="after its abort"):
        spool.written(XID, [(XID + 1, cut, cut + 40)])
    assert spool.size == cut
