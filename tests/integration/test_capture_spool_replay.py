"""On the real broker: the compiled stream's replay of a streamed transaction's spool
(``CompiledStream.take_spool``, native/src/spool_replay.rs) stopped by a full producer
queue and by messages only the Python path takes, and resumed each time, produces every
kept change once, in order, with the ordinals of one transaction, and hands each
Python-path message back once, at its place.

The spool is written by the real bookkeeping (capture.stream.streamed_transactions) with
a rolled-back subtransaction between kept changes, so its live ranges have a gap; the
rows are encoded as they are when they arrive (capture.stream.encoded_change). The
producer's queue holds a few records only, so the replay stops on it many times."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from capture.errors import ProtocolError
from capture.in_flight import ProgressBook
from capture.pgoutput import StreamCommit
from capture.publish import native_producer
from capture.rows.native import AVAILABLE
from capture.stream import compiled_stream, encoded_change
from capture.stream.change_stream import ChangeStream
from capture.stream.compiled_stream import CompiledStream
from capture.stream.copy_data import XLogData, parse_copy_data
from capture.stream.in_progress import StreamedReplay
from capture.stream.streamed_transactions import StreamedTransactions
from capture.stream.table_states import TableStates
from schemas.lsn import Lsn
from tests.plugins.change_stream import describe_relation
from tests.plugins.services import Services
from tests.plugins.topics import read_to_end

if TYPE_CHECKING:
    from capture_native import CompiledStream as NativeCompiledStream
    from capture_native import KafkaProducer, SpoolReplay, TextRowEncoder

pytestmark = pytest.mark.skipif(
    not AVAILABLE or native_producer.library() is None or compiled_stream.libpq() is None,
    reason="capture_native is not built here",
)

XID = 900
KEPT = 901
VOID = 902
OID = 16384
UNARMED = 16385
COMMIT_LSN = 0x9_0000
END_LSN = 0x9_0040
COMMIT_TIME = 123_456
PREFIX = b"\x04"
"""The value's bytes before ``commit_lsn`` the test arms (one Avro long)."""
QUEUE = 5
"""Records the producer's queue holds: far fewer than the transaction has."""


def insert(oid: int, key: int) -> bytes:
    """A protocol-version-1 Insert of ``(key int8, note text)``."""
    values = [str(key).encode(), f"row {key}".encode()]
    row = struct.pack("!H", 2) + b"".join(b"t" + struct.pack("!I", len(v)) + v for v in values)
    return b"I" + struct.pack("!I", oid) + b"N" + row


def read_long(data: bytes, at: int) -> tuple[int, int]:
    """The Avro long at ``at`` (a zig-zag varint) and where it ends."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), at


def _producer(bootstrap: str) -> KafkaProducer:
    from capture_native import KafkaProducer  # noqa: PLC0415

    path = native_producer.library()
    assert path is not None
    return KafkaProducer(
        path,
        [
            ("bootstrap.servers", bootstrap),
            ("queue.buffering.max.messages", str(QUEUE)),
            ("linger.ms", "0"),
            ("acks", "all"),
        ],
    )


def _stream(producer: KafkaProducer, encoder: TextRowEncoder, topic: str) -> NativeCompiledStream:
    from capture_native import CompiledStream as Native  # noqa: PLC0415

    libpq = compiled_stream.libpq()
    assert libpq is not None
    native = Native(producer, libpq, "commit_lsn", "change_lsn")
    native.arm(OID, encoder, topic, b"", 0, [(ord("I"), PREFIX, ("op", b"c"), ("fp", b"f"))])
    native.adopt(None, 1)
    return native


def _spool(tmp_path: Path, encoder: TextRowEncoder) -> tuple[StreamedTransactions, list[int]]:
    """A committed transaction's spool; the order of what the replay must give: a key for
    a row the compiled stream produces, minus the key for one it hands back."""
    spools = StreamedTransactions(1 << 24, tmp_path)
    spools.start(XID, first_segment=True)
    expected: list[int] = []
    lsn = 0x1000

    def add(subxid: int, message: bytes, kept: int | None) -> None:
        nonlocal lsn
        lsn += 0x10
        spools.append(XID, subxid, Lsn(lsn), message)
        if kept is not None:
            expected.append(kept)

    def row(subxid: int, key: int, kept: bool = True) -> None:
        spooled = encoded_change.encode(encoder, insert(OID, key), Lsn(lsn + 0x10))
        assert spooled is not None
        add(subxid, spooled, key if kept else None)

    for key in range(40):
        row(XID, key)
    add(XID, insert(UNARMED, 1000), -1000)  # for the Python path
    for key in range(40, 60):
        row(KEPT, key)
    for key in range(60, 90):
        row(VOID, key, kept=False)  # rolled back below
    for key in range(90, 120):
        row(KEPT, key)  # the outer subtransaction goes on after it
        if key == 100:
            add(KEPT, insert(UNARMED, 1001), -1001)
    spools.abort(XID, VOID)
    add(XID, insert(UNARMED, 1002), -1002)  # the very last message
    return spools, expected


def test_a_replay_stopped_by_a_full_queue_and_by_python_frames_resumes_exactly(
    services: Services, unique_name: str, tmp_path: Path
) -> None:
    from capture_native import TextRowEncoder  # noqa: PLC0415

    bootstrap = services.kafka_bootstrap_servers
    topic = unique_name
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    encoder = TextRowEncoder(["long", "string"], [0], [False])
    producer = _producer(bootstrap)
    native = _stream(producer, encoder, topic)
    spools, expected = _spool(tmp_path, encoder)
    commit = StreamCommit(XID, Lsn(COMMIT_LSN), Lsn(END_LSN), COMMIT_TIME)
    replay = StreamedReplay(commit, spools.committed(XID))
    assert len(replay.spool.ranges) == 2  # the rolled-back rows are a gap
    spool: SpoolReplay = CompiledStream.open_spool(replay)

    handed_back: list[int] = []
    stops: dict[compiled_stream.Stop, int] = {}
    produced = 0
    while True:
        read = native.take_spool(spool, 3)
        produced += read.taken
        stops[read.stopped] = stops.get(read.stopped, 0) + 1
        if read.stopped == compiled_stream.Stop.EMPTY:
            break
        if read.stopped == compiled_stream.Stop.FULL:
            producer.poll(100)
        elif read.stopped == compiled_stream.Stop.FRAME:
            assert read.frame is not None
            frame = parse_copy_data(read.frame)
            assert isinstance(frame, XLogData)
            # The Python path's frame: the spooled message at its change LSN.
            assert frame.payload[:5] == b"I" + struct.pack("!I", UNARMED)
            handed_back.append(int(bytes(frame.payload[-4:])))
        assert stops.get(compiled_stream.Stop.FRAME, 0) <= 3
    spool.close()
    replay.close()
    assert producer.flush(30_000) == 0
    assert spool.done
    # Stopped on everything it can stop on, and went on each time.
    assert stops[compiled_stream.Stop.FULL] >= 10
    assert stops[compiled_stream.Stop.FRAME] == 3
    assert stops[compiled_stream.Stop.LIMIT] >= 1
    assert handed_back == [1000, 1001, 1002]
    kept = [key for key in expected if key >= 0]
    assert produced == len(kept) + 2  # and the Begin and the Commit
    parts = native.take_transactions()
    assert [p.began for p in parts] == [True]
    assert (parts[0].records, parts[0].end_lsn) == (len(kept), END_LSN)

    records = read_to_end(bootstrap, topic)
    keys, ordinals = [], []
    for record in records:
        value = record.value()
        assert value.startswith(PREFIX)
        at = len(PREFIX)
        fields = []
        for _ in range(5):  # commit_lsn, change_lsn, xid, commit_ts, ordinal
            field, at = read_long(value, at)
            fields.append(field)
        assert (fields[0], fields[2]) == (COMMIT_LSN, XID)
        ordinals.append(fields[4])
        key, _ = read_long(record.key(), 0)
        keys.append(key)
    # Every kept row once, in stream order, numbered as one transaction.
    assert keys == kept
    assert ordinals == list(range(len(kept)))


def _damaged_replay(tmp_path: Path, encoder: TextRowEncoder) -> StreamedReplay:
    """The replay of :func:`_spool`'s transaction whose file lost its last bytes: the
    last entry is cut short."""
    spools, _ = _spool(tmp_path, encoder)
    committed = spools.committed(XID)
    file = committed.file
    assert file is not None
    file.truncate(committed.ranges[-1][1] - 3)
    return StreamedReplay(StreamCommit(XID, Lsn(COMMIT_LSN), Lsn(END_LSN), COMMIT_TIME), committed)


def test_a_damaged_spool_is_refused_with_the_transaction_named(tmp_path: Path) -> None:
    from capture_native import SpoolDamagedError, TextRowEncoder  # noqa: PLC0415

    encoder = TextRowEncoder(["long", "string"], [0], [False])
    replay = _damaged_replay(tmp_path, encoder)
    spool = CompiledStream.open_spool(replay)
    native = _stream(_producer("127.0.0.1:9"), encoder, "never-produced")
    native.disarm()  # nothing is produced: every row goes back as a frame

    def drain() -> None:
        while native.take_spool(spool, 1000).stopped != compiled_stream.Stop.EMPTY:
            pass

    with pytest.raises(SpoolDamagedError, match=f"streamed transaction {XID} is damaged"):
        drain()
    spool.close()
    replay.close()


def test_the_loops_driver_turns_a_damaged_spool_into_a_protocol_error(tmp_path: Path) -> None:
    """What the replication loop gets from the same damage through the compiled stream's
    driver (``capture.stream.compiled_stream.CompiledStream.take_spool``): a
    ``ProtocolError``, which stops the attempt and says what to do, not the extension's
    own exception."""
    from capture_native import TextRowEncoder  # noqa: PLC0415

    encoder = TextRowEncoder(["long", "string"], [0], [False])
    replay = _damaged_replay(tmp_path, encoder)
    book = ProgressBook(Lsn(0))
    driver = CompiledStream(
        _producer("127.0.0.1:9"),
        0,  # no connection: the replay reads the spool, never libpq
        book,
        ChangeStream(describe_relation, "cdc"),
        TableStates("slot", {}, snapshot_new=False, clock=lambda: 0),
        lambda _topic: None,
        None,
    )
    spool = driver.open_spool(replay)

    def drain() -> None:
        # No table is armed: every row comes back as a frame, the loop's to handle.
        while driver.take_spool(spool, 1000).stopped != compiled_stream.Stop.EMPTY:
            pass

    try:
        with pytest.raises(ProtocolError, match=f"transaction {XID} is damaged.*restart capture"):
            drain()
        # The Begin the compiled stream took is in the book all the same.
        assert book.next_transaction_id == 1
    finally:
        spool.close()
        replay.close()
