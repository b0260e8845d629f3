"""Transactions in progress: stream blocks spooled, a Stream Commit replayed as the
unstreamed transaction, aborted (sub)transactions gone, and what the loop may confirm."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from capture.errors import ProtocolError
from capture.pgoutput import Begin, Commit, Relation, StreamOrderError, decode
from capture.records import OutgoingRecord
from capture.rows.typemap import ColumnMapping, TextKind
from capture.stream.change_stream import ChangeStream, Output
from capture.stream.in_progress import InProgressTransactions
from schemas.lsn import Lsn
from tests.plugins.change_stream import describe_relation

XID = 7001
SUBXID = 7002
OTHER = 7100
OID = 16384
COMMIT_LSN = 0x5000
END_LSN = 0x5038
COMMIT_TIME = 777


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack("!I", xid)


def relation(xid: int | None) -> bytes:
    """``public.orders (id int8 key, note text)``, as pgoutput writes it."""
    columns = (
        b"\x01id\x00" + struct.pack("!Ii", 20, -1) + b"\x00note\x00" + struct.pack("!Ii", 25, -1)
    )
    return (
        b"R" + _xid(xid) + struct.pack("!I", OID) + b"public\x00orders\x00d"
        + struct.pack("!H", 2) + columns
    )  # fmt: skip


def insert(xid: int | None, key: int) -> bytes:
    values = [str(key).encode(), f"row {key}".encode()]
    row = struct.pack("!H", 2) + b"".join(b"t" + struct.pack("!I", len(v)) + v for v in values)
    return b"I" + _xid(xid) + struct.pack("!I", OID) + b"N" + row


def begin(xid: int) -> bytes:
    return b"B" + struct.pack("!QqI", COMMIT_LSN, COMMIT_TIME, xid)


def commit() -> bytes:
    return b"C" + struct.pack("!BQQq", 0, COMMIT_LSN, END_LSN, COMMIT_TIME)


def stream_start(xid: int, first_segment: bool) -> bytes:
    return b"S" + struct.pack("!IB", xid, first_segment)


STREAM_STOP = b"E"


def stream_commit(xid: int) -> bytes:
    return b"c" + struct.pack("!IBQQq", xid, 0, COMMIT_LSN, END_LSN, COMMIT_TIME)


def stream_abort(xid: int, subxid: int) -> bytes:
    return b"A" + struct.pack("!II", xid, subxid)


@pytest.fixture
def streams(tmp_path: Path) -> Iterator[InProgressTransactions]:
    transactions = InProgressTransactions(1 << 20, tmp_path)
    yield transactions
    transactions.close()


def feed(
    streams: InProgressTransactions, frames: list[tuple[bytes, int]]
) -> list[tuple[bytes, Lsn]]:
    """Hand ``(payload, wal_start)`` frames in, as the loop does: those it takes; the
    replay of the last Stream Commit, drained."""
    replayed: list[tuple[bytes, Lsn]] = []
    for payload, wal_start in frames:
        assert streams.takes(payload), payload
        replay = streams.handle(payload, Lsn(wal_start))
        if replay is not None:
            replayed = list(replay)
    return replayed


def records(frames: list[tuple[bytes, Lsn]]) -> list[Output]:
    """What a fresh change stream makes of ``frames``, as the loop hands them over."""
    stream = ChangeStream(describe_relation, "cdc", compiled_rows=False)
    out: list[Output] = []
    for payload, change_lsn in frames:
        out += stream.handle_frame(payload, change_lsn)
    return out


def test_a_streamed_transaction_replays_as_the_same_transaction_unstreamed(streams):
    replayed = feed(
        streams,
        [
            (stream_start(XID, first_segment=True), 0),
            (relation(XID), 0),
            (insert(XID, 1), 0x100),
            (insert(XID, 2), 0x140),
            (STREAM_STOP, 0),
            (stream_start(XID, first_segment=False), 0),
            (insert(XID, 3), 0x180),
            (STREAM_STOP, 0),
            (stream_commit(XID), END_LSN),
        ],
    )
    unstreamed = [
        (begin(XID), Lsn(COMMIT_LSN)),
        (relation(None), Lsn(0)),
        (insert(None, 1), Lsn(0x100)),
        (insert(None, 2), Lsn(0x140)),
        (insert(None, 3), Lsn(0x180)),
        (commit(), Lsn(END_LSN)),
    ]
    assert replayed == unstreamed
    assert decode(replayed[0][0]) == Begin(Lsn(COMMIT_LSN), COMMIT_TIME, XID)
    assert decode(replayed[-1][0]) == Commit(Lsn(COMMIT_LSN), Lsn(END_LSN), COMMIT_TIME)
    # And so the records, their ordinals and positions: byte for byte.
    made = records(replayed)
    assert made == records(unstreamed)
    assert sum(isinstance(out, OutgoingRecord) for out in made) == 3


def test_only_stream_messages_are_taken_between_blocks(streams):
    for ordinary in (begin(OTHER), relation(None), insert(None, 1), commit(), b""):
        assert not streams.takes(ordinary)
    for own in (stream_start(XID, True), STREAM_STOP, stream_commit(XID), stream_abort(XID, XID)):
        assert streams.takes(own)
    streams.handle(stream_start(XID, first_segment=True), Lsn(0))
    # Inside a block every message is, even one the protocol forbids there.
    assert streams.takes(insert(XID, 1))
    assert streams.takes(begin(OTHER))


def test_a_rolled_back_subtransaction_is_not_replayed(streams):
    replayed = feed(
        streams,
        [
            (stream_start(XID, first_segment=True), 0),
            (relation(XID), 0),
            (insert(XID, 1), 0x100),
            # SAVEPOINT: its Relation and rows carry the subtransaction's xid.
            (relation(SUBXID), 0),
            (insert(SUBXID, 2), 0x140),
            (STREAM_STOP, 0),
            (stream_abort(XID, SUBXID), 0),
            (stream_start(XID, first_segment=False), 0),
            (relation(XID), 0),
            (insert(XID, 3), 0x180),
            (STREAM_STOP, 0),
            (stream_commit(XID), END_LSN),
        ],
    )
    assert [payload for payload, _ in replayed[1:-1]] == [
        relation(None),
        insert(None, 1),
        relation(None),
        insert(None, 3),
    ]


def test_an_aborted_transaction_leaves_nothing_and_no_replay(streams):
    feed(
        streams,
        [
            (stream_start(XID, first_segment=True), 0),
            (relation(XID), 0),
            (insert(XID, 1), 0x100),
            (STREAM_STOP, 0),
        ],
    )
    assert streams.open
    assert streams.spooled_bytes > 0
    assert streams.handle(stream_abort(XID, XID), Lsn(0)) is None
    assert not streams.open
    assert streams.spooled_bytes == 0
    # A Stream Commit of it now would be a protocol error, not an empty transaction.
    with pytest.raises(ProtocolError):
        streams.handle(stream_commit(XID), Lsn(END_LSN))


def test_a_streamed_transaction_is_open_from_its_first_block_to_its_end(streams):
    assert not streams.open
    streams.handle(stream_start(XID, first_segment=True), Lsn(0))
    assert streams.open
    streams.handle(STREAM_STOP, Lsn(0))
    assert streams.open, "between blocks too: a keepalive then is not confirmable"
    replay = streams.handle(stream_commit(XID), Lsn(END_LSN))
    assert replay is not None
    assert not streams.open
    assert [decode(payload) for payload, _ in replay] == [
        Begin(Lsn(COMMIT_LSN), COMMIT_TIME, XID),
        Commit(Lsn(COMMIT_LSN), Lsn(END_LSN), COMMIT_TIME),
    ]
    assert streams.streamed == 1


def test_the_spools_peak_is_kept(streams):
    feed(
        streams,
        [
            (stream_start(XID, first_segment=True), 0),
            (relation(XID), 0),
            (insert(XID, 1), 0x100),
            (STREAM_STOP, 0),
        ],
    )
    held = streams.spooled_bytes
    streams.handle(stream_abort(XID, XID), Lsn(0))
    assert streams.peak_bytes == held > 0


def test_a_stream_out_of_order_is_refused(streams):
    with pytest.raises(StreamOrderError):
        streams.handle(STREAM_STOP, Lsn(0))
    streams.handle(stream_start(XID, first_segment=True), Lsn(0))
    with pytest.raises(StreamOrderError):
        streams.handle(begin(OTHER), Lsn(0))
    with pytest.raises(StreamOrderError):
        streams.handle(stream_start(OTHER, first_segment=True), Lsn(0))


def test_a_continued_block_of_a_transaction_never_started_is_refused(streams):
    with pytest.raises(ProtocolError, match="never received"):
        streams.handle(stream_start(XID, first_segment=False), Lsn(0))


def _spool_files(directory: Path) -> int:
    """Files of this process open in ``directory`` (spools are unnamed: only their
    descriptors show them)."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        count += target.startswith(str(directory))
    return count


def test_closing_a_replay_midway_releases_the_spool(streams, tmp_path):
    feed(
        streams,
        [
            (stream_start(XID, first_segment=True), 0),
            (relation(XID), 0),
            (insert(XID, 1), 0x100),
            (insert(XID, 2), 0x140),
            (STREAM_STOP, 0),
        ],
    )
    assert _spool_files(tmp_path) == 1
    replay = streams.handle(stream_commit(XID), Lsn(END_LSN))
    assert replay is not None
    assert next(replay)[0] == begin(XID)
    assert next(replay)[0] == relation(None)
    replay.close()
    assert _spool_files(tmp_path) == 0


def wide_relation(xid: int | None) -> bytes:
    """``public.orders`` after ``ADD COLUMN extra text``."""
    columns = (
        b"\x01id\x00" + struct.pack("!Ii", 20, -1) + b"\x00note\x00" + struct.pack("!Ii", 25, -1)
        + b"\x00extra\x00" + struct.pack("!Ii", 25, -1)
    )  # fmt: skip
    return (
        b"R" + _xid(xid) + struct.pack("!I", OID) + b"public\x00orders\x00d"
        + struct.pack("!H", 3) + columns
    )  # fmt: skip


def wide_insert(xid: int | None, key: int) -> bytes:
    values = [str(key).encode(), f"row {key}".encode(), b"more"]
    row = struct.pack("!H", 3) + b"".join(b"t" + struct.pack("!I", len(v)) + v for v in values)
    return b"I" + _xid(xid) + struct.pack("!I", OID) + b"N" + row


def describe_text(relation: Relation) -> list[ColumnMapping]:
    """:func:`describe_relation` with the compiled encoder's text kinds."""
    kinds: dict[str, TextKind] = {"int8": "long", "text": "string"}
    return [
        dataclasses.replace(mapping, text_kind=kinds[mapping.pg_type_name])
        for mapping in describe_relation(relation)
    ]


def test_changes_encoded_as_they_arrive_make_the_unstreamed_records(tmp_path):
    """With the change stream at hand, rows are spooled encoded, each by the table version
    of the transaction's Relation before it (a column added mid-transaction, and one
    added in a rolled-back savepoint), and the replay makes the records a change stream
    makes of the same transaction unstreamed, byte for byte."""
    pytest.importorskip("capture_native")
    from capture.stream.encoded_change import ENCODED_CHANGE  # noqa: PLC0415

    # The stream knows the table as it was before the transaction.
    stream = ChangeStream(describe_text, "cdc")
    reference = ChangeStream(describe_text, "cdc")
    for known in (stream, reference):
        list(known.handle_frame(begin(OTHER), Lsn(0x10)))
        list(known.handle_frame(relation(None), Lsn(0x10)))
        list(known.handle_frame(commit(), Lsn(0x20)))
    transactions = InProgressTransactions(1 << 20, tmp_path, stream)
    frames = [
        (stream_start(XID, first_segment=True), 0),
        (relation(XID), 0),
        (insert(XID, 1), 0x100),
        (relation(SUBXID), 0),
        (wide_relation(SUBXID), 0),
        (wide_insert(SUBXID, 2), 0x140),
        (STREAM_STOP, 0),
        (stream_abort(XID, SUBXID), 0),
        (stream_start(XID, first_segment=False), 0),
        (relation(XID), 0),
        (insert(XID, 3), 0x180),
        (wide_relation(XID), 0),
        (wide_insert(XID, 4), 0x1C0),
        (STREAM_STOP, 0),
    ]
    for payload, wal_start in frames:
        assert transactions.handle(payload, Lsn(wal_start)) is None
    replay = transactions.handle(stream_commit(XID), Lsn(END_LSN))
    assert replay is not None
    made: list[Output] = []
    spooled: list[bytes] = []
    for payload, change_lsn in replay:
        spooled.append(payload)
        made += stream.handle_frame(payload, change_lsn)
    transactions.close()
    assert sum(payload[0] == ENCODED_CHANGE for payload in spooled) == 3
    # The versions that encoded them, kept for the replay until the loop ends it.
    assert len(stream.replayed_codecs) == 2
    unstreamed = [
        (begin(XID), Lsn(COMMIT_LSN)),
        (relation(None), Lsn(0)),
        (insert(None, 1), Lsn(0x100)),
        (relation(None), Lsn(0)),
        (insert(None, 3), Lsn(0x180)),
        (wide_relation(None), Lsn(0)),
        (wide_insert(None, 4), Lsn(0x1C0)),
        (commit(), Lsn(END_LSN)),
    ]
    expected: list[Output] = []
    for payload, change_lsn in unstreamed:
        expected += reference.handle_frame(payload, change_lsn)
    assert made == expected
    assert sum(isinstance(out, OutgoingRecord) for out in made) == 3
    # The change stream took the version the rows were encoded with: the compiled
    # stream, which compares encoders, produces them as they are.
    assert stream.codecs[OID].relation.columns[-1].name == "extra"


@pytest.mark.parametrize("same_schema", [True, False], ids=["twin", "other-schema"])
def test_an_encoded_row_meets_another_version_of_its_table_at_the_commit(tmp_path, same_schema):
    """The change stream may hold another codec of the same relation at the commit than
    the one that encoded the rows: with the same schema the records are the unstreamed
    ones (the bytes are the same), with another the table is errored, never published
    with bytes of another schema."""
    pytest.importorskip("capture_native")
    stream = ChangeStream(describe_text, "cdc")
    reference = ChangeStream(describe_text, "cdc")
    transactions = InProgressTransactions(1 << 20, tmp_path, stream)
    for payload, wal_start in [
        (stream_start(XID, first_segment=True), 0),
        (relation(XID), 0),
        (insert(XID, 1), 0x100),
        (STREAM_STOP, 0),
    ]:
        transactions.handle(payload, Lsn(wal_start))
    replay = transactions.handle(stream_commit(XID), Lsn(END_LSN))
    assert replay is not None
    # Another transaction's Relation of the same table reached the stream first.
    describe = describe_text if same_schema else describe_wider
    twin = ChangeStream(describe, "cdc")
    list(twin.handle_frame(begin(OTHER), Lsn(0x10)))
    list(twin.handle_frame(relation(None), Lsn(0x10)))
    stream.codecs[OID] = twin.codecs[OID]
    made: list[Output] = []
    for payload, change_lsn in replay:
        made += stream.handle_frame(payload, change_lsn)
    transactions.close()
    if not same_schema:
        assert not any(isinstance(out, OutgoingRecord) for out in made)
        assert "public.orders" in stream.errored
        return
    expected: list[Output] = []
    for payload, change_lsn in [
        (begin(XID), Lsn(COMMIT_LSN)),
        (relation(None), Lsn(0)),
        (insert(None, 1), Lsn(0x100)),
        (commit(), Lsn(END_LSN)),
    ]:
        expected += reference.handle_frame(payload, change_lsn)
    assert made == expected


def describe_wider(relation: Relation) -> list[ColumnMapping]:
    """:func:`describe_text` with ``note`` published as ``int8``: another schema for the
    same relation."""
    mappings = describe_text(relation)
    return [mappings[0], dataclasses.replace(mappings[0], pg_type_name="int8"), *mappings[2:]]


def test_rows_of_a_table_keyed_from_the_catalog_are_decoded_at_the_commit(tmp_path):
    """REPLICA IDENTITY FULL: capture reads the key from the catalog, which does not show
    what the open transaction changed, so its rows are spooled as they came."""
    pytest.importorskip("capture_native")
    stream = ChangeStream(describe_text, "cdc")
    transactions = InProgressTransactions(1 << 20, tmp_path, stream)
    full = relation(XID).replace(b"orders\x00d", b"orders\x00f")
    decoded = decode(full[:1] + full[5:])
    assert isinstance(decoded, Relation)
    assert decoded.replica_identity.value == "f"
    for payload, wal_start in [
        (stream_start(XID, first_segment=True), 0),
        (full, 0),
        (insert(XID, 1), 0x100),
        (STREAM_STOP, 0),
    ]:
        transactions.handle(payload, Lsn(wal_start))
    replay = transactions.handle(stream_commit(XID), Lsn(END_LSN))
    assert replay is not None
    assert [payload for payload, _ in replay][2] == insert(None, 1)
    transactions.close()


def test_the_compiled_stream_spools_a_block_byte_for_byte_as_the_python_path(tmp_path):
    """The compiled stream's writer (``native/src/spool_writer.rs``), driven as the loop
    drives it (each frame it hands back handled by the Python path, then re-armed), leaves
    the spool the Python path alone leaves: the same replay, encoded rows and their
    encoder's identity included. The block holds rows it takes, a Relation changing the
    table mid-block (the Python path's, then the writer re-armed with the new version),
    rows of a rolled-back subtransaction cut off at its abort, and a row of a table with no
    version armed (the Python path's)."""
    pytest.importorskip("capture_native")
    from capture_native import KafkaProducer  # noqa: PLC0415

    from capture.in_flight import ProgressBook  # noqa: PLC0415
    from capture.publish import native_producer  # noqa: PLC0415
    from capture.stream import compiled_stream  # noqa: PLC0415
    from capture.stream.copy_data import encode_xlog_data  # noqa: PLC0415
    from capture.stream.table_states import TableStates  # noqa: PLC0415

    library = native_producer.library()
    if library is None or compiled_stream.libpq() is None:
        pytest.skip("the compiled stream cannot run here")
    # One change stream for both: the versions it makes, and so the encoders' identities
    # in the spooled rows, are the same objects.
    stream = ChangeStream(describe_text, "cdc")
    list(stream.handle_frame(begin(OTHER), Lsn(0x10)))
    list(stream.handle_frame(relation(None), Lsn(0x10)))
    list(stream.handle_frame(commit(), Lsn(0x20)))
    unarmed = b"I" + struct.pack("!II", XID, OID + 1) + insert(None, 9)[5:]
    frames = [
        (stream_start(XID, first_segment=True), 0),
        (relation(XID), 0),
        *[(insert(XID, key), 0x100 + key) for key in range(1, 6)],
        *[(insert(SUBXID, key), 0x100 + key) for key in range(6, 9)],
        (unarmed, 0x109),
        (STREAM_STOP, 0),
        (stream_abort(XID, SUBXID), 0),
        (stream_start(XID, first_segment=False), 0),
        (wide_relation(XID), 0),
        *[(wide_insert(XID, key), 0x100 + key) for key in range(10, 14)],
        (STREAM_STOP, 0),
    ]

    python_only = InProgressTransactions(1 << 20, tmp_path / "python", stream)
    for payload, wal_start in frames:
        assert python_only.handle(payload, Lsn(wal_start)) is None

    compiled = InProgressTransactions(1 << 20, tmp_path / "compiled", stream)
    producer = KafkaProducer(library, [("bootstrap.servers", "127.0.0.1:9"), ("log_level", "0")])
    driver = compiled_stream.CompiledStream(
        producer,
        0,  # never read: the frames are handed in
        ProgressBook(Lsn(0)),
        stream,
        TableStates("slot", {}, snapshot_new=False, clock=lambda: 0),
        lambda _topic: None,
        None,
        compiled,
    )
    xlog = [encode_xlog_data(Lsn(wal_start), payload) for payload, wal_start in frames]
    start = handed_back = 0
    while start < len(xlog):
        read = driver.take_frames(xlog, start)
        start += read.taken
        if read.stopped == compiled_stream.Stop.FRAME:
            payload, wal_start = frames[start]
            driver.to_python()
            assert compiled.handle(payload, Lsn(wal_start)) is None
            driver.from_python()
            start += 1
            handed_back += 1
    # Stream Start and Stop twice, the two Relations, the unarmed row and the abort
    # between the blocks went to the Python path: the twelve other rows were the
    # compiled stream's.
    assert handed_back == len(frames) - 12
    assert compiled.written_bytes > 0

    spooled = []
    for transactions in (python_only, compiled):
        replay = transactions.handle(stream_commit(XID), Lsn(END_LSN))
        assert replay is not None
        spooled.append(list(replay))
        replay.close()
        transactions.close()
    assert spooled[0] == spooled[1]
    assert len(spooled[1]) == 2 + 2 + 5 + 1 + 4  # Begin, Relations, rows, unarmed row, Commit
