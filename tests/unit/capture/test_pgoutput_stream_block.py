"""Stream blocks: every streamed message from hand-built bytes, inside and outside a block.

The byte layouts are written out from
https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html, field by
field, independently of the decoder; ``test_pgoutput_decode.py`` checks the same messages
recorded from a real server.
"""

from __future__ import annotations

import random
import struct

import pytest

from capture.errors import ProtocolError
from capture.pgoutput import (
    Begin,
    ColumnKind,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    MalformedMessageError,
    Message,
    Relation,
    RelationColumn,
    ReplicaIdentity,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TruncateOptions,
    TupleData,
    Type,
    Update,
    decode,
)
from capture.pgoutput.stream_block import (
    STREAMED_XID_TAGS,
    StreamBlocks,
    StreamOrderError,
    split_stream_xid,
)
from schemas.lsn import Lsn

XID = 7001
SUBXID = 7002
OID = 16384


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack("!I", xid)


def _text_tuple(*values: str | None) -> bytes:
    out = struct.pack("!H", len(values))
    for value in values:
        if value is None:
            out += b"n"
        else:
            out += b"t" + struct.pack("!I", len(value.encode())) + value.encode()
    return out


def _tuple_data(*values: str | None) -> TupleData:
    return TupleData(
        kinds=tuple(ColumnKind.NULL if v is None else ColumnKind.TEXT for v in values),
        values=tuple(None if v is None else v.encode() for v in values),
    )


def relation_bytes(xid: int | None) -> bytes:
    return (
        b"R"
        + _xid(xid)
        + struct.pack("!I", OID)
        + b"public\x00accounts\x00d"
        + struct.pack("!H", 2)
        + b"\x01aid\x00"
        + struct.pack("!Ii", 23, -1)
        + b"\x00filler\x00"
        + struct.pack("!Ii", 1042, 88)
    )


def type_bytes(xid: int | None) -> bytes:
    return b"Y" + _xid(xid) + struct.pack("!I", 90001) + b"public\x00mood\x00"


def insert_bytes(xid: int | None, aid: str = "1") -> bytes:
    return b"I" + _xid(xid) + struct.pack("!I", OID) + b"N" + _text_tuple(aid, None)


def update_bytes(xid: int | None) -> bytes:
    return (
        b"U"
        + _xid(xid)
        + struct.pack("!I", OID)
        + b"K"
        + _text_tuple("1", None)
        + b"N"
        + _text_tuple("2", "x")
    )


def delete_bytes(xid: int | None) -> bytes:
    return b"D" + _xid(xid) + struct.pack("!I", OID) + b"K" + _text_tuple("2", None)


def truncate_bytes(xid: int | None) -> bytes:
    return b"T" + _xid(xid) + struct.pack("!IB", 2, 3) + struct.pack("!II", OID, OID + 1)


def message_bytes(xid: int | None) -> bytes:
    return (
        b"M"
        + _xid(xid)
        + struct.pack("!BQ", 1, 0x1_0000_0100)
        + b"app\x00"
        + struct.pack("!I", 3)
        + b"abc"
    )


def begin_bytes(xid: int) -> bytes:
    return b"B" + struct.pack("!QqI", 0x2000, 5, xid)


def commit_bytes() -> bytes:
    return b"C" + struct.pack("!BQQq", 0, 0x2000, 0x2030, 5)


def stream_start_bytes(xid: int, first_segment: int = 1) -> bytes:
    return b"S" + struct.pack("!IB", xid, first_segment)


def stream_commit_bytes(xid: int) -> bytes:
    return b"c" + struct.pack("!IBQQq", xid, 0, 0x5000, 0x5038, 777)


def stream_abort_bytes(xid: int, subxid: int, parallel: bool = False) -> bytes:
    info = struct.pack("!Qq", 0x4000, 666) if parallel else b""
    return b"A" + struct.pack("!II", xid, subxid) + info


def expected(name: str, xid: int | None) -> Message:
    """The message each builder writes, with ``xid`` where the stream puts it."""
    messages: dict[str, Message] = {
        "relation": Relation(
            xid=xid,
            oid=OID,
            namespace="public",
            name="accounts",
            replica_identity=ReplicaIdentity.DEFAULT,
            columns=(
                RelationColumn(is_key=True, name="aid", type_oid=23, type_modifier=-1),
                RelationColumn(is_key=False, name="filler", type_oid=1042, type_modifier=88),
            ),
        ),
        "type": Type(xid=xid, oid=90001, namespace="public", name="mood"),
        "insert": Insert(xid=xid, relation_oid=OID, new=_tuple_data("1", None)),
        "update": Update(
            xid=xid,
            relation_oid=OID,
            key=_tuple_data("1", None),
            old=None,
            new=_tuple_data("2", "x"),
        ),
        "delete": Delete(xid=xid, relation_oid=OID, key=_tuple_data("2", None), old=None),
        "truncate": Truncate(
            xid=xid,
            options=TruncateOptions.CASCADE | TruncateOptions.RESTART_IDENTITY,
            relation_oids=(OID, OID + 1),
        ),
        "message": LogicalMessage(
            xid=xid, transactional=True, lsn=Lsn(0x1_0000_0100), prefix="app", content=b"abc"
        ),
    }
    return messages[name]


BUILDERS = {
    "relation": relation_bytes,
    "type": type_bytes,
    "insert": insert_bytes,
    "update": update_bytes,
    "delete": delete_bytes,
    "truncate": truncate_bytes,
    "message": message_bytes,
}
DATA = pytest.mark.parametrize("name", list(BUILDERS))


def in_block(blocks: StreamBlocks, xid: int = XID) -> StreamBlocks:
    blocks.decode(stream_start_bytes(xid))
    return blocks


@DATA
def test_a_data_message_outside_a_block_has_no_xid(name):
    assert StreamBlocks().decode(BUILDERS[name](None)) == expected(name, None)


@DATA
def test_a_data_message_inside_a_block_carries_the_changing_subtransactions_xid(name):
    blocks = in_block(StreamBlocks())
    assert blocks.decode(BUILDERS[name](SUBXID)) == expected(name, SUBXID)
    assert blocks.block_xid == XID


@DATA
def test_every_truncation_of_a_streamed_data_message_is_malformed(name):
    payload = BUILDERS[name](SUBXID)
    for length in range(len(payload)):
        with pytest.raises(MalformedMessageError):
            decode(payload[:length], in_stream=True)
    with pytest.raises(MalformedMessageError):
        decode(payload + b"\x00", in_stream=True)


@DATA
def test_splitting_the_xid_off_leaves_the_unstreamed_message(name):
    xid, message = split_stream_xid(BUILDERS[name](SUBXID))
    assert xid == SUBXID
    assert message == BUILDERS[name](None)
    assert decode(message) == expected(name, None)


def test_the_tags_that_carry_an_xid_are_exactly_the_data_messages():
    assert {BUILDERS[name](None)[0] for name in BUILDERS} == STREAMED_XID_TAGS


def test_split_stream_xid_rejects_what_carries_no_xid():
    with pytest.raises(MalformedMessageError, match="empty message"):
        split_stream_xid(b"")
    with pytest.raises(MalformedMessageError) as info:
        split_stream_xid(begin_bytes(XID))
    assert (info.value.offset, info.value.got) == (0, "0x42 ('B')")
    with pytest.raises(MalformedMessageError) as info:
        split_stream_xid(b"I\x00\x00\x1b")
    assert (info.value.offset, info.value.wanted) == (1, "4 bytes")


def test_stream_start_stop_commit_and_abort_fields():
    assert decode(stream_start_bytes(XID, 1)) == StreamStart(xid=XID, first_segment=True)
    assert decode(stream_start_bytes(XID, 0)) == StreamStart(xid=XID, first_segment=False)
    assert decode(b"E", in_stream=True) == StreamStop()
    assert decode(stream_commit_bytes(XID)) == StreamCommit(
        xid=XID, commit_lsn=Lsn(0x5000), end_lsn=Lsn(0x5038), commit_time=777
    )
    assert decode(stream_abort_bytes(XID, SUBXID)) == StreamAbort(
        xid=XID, subxid=SUBXID, abort_lsn=None, abort_time=None
    )
    # Protocol version 4 with streaming 'parallel' adds the abort's LSN and time.
    assert decode(stream_abort_bytes(XID, XID, parallel=True)) == StreamAbort(
        xid=XID, subxid=XID, abort_lsn=Lsn(0x4000), abort_time=666
    )


@pytest.mark.parametrize(
    "payload",
    [
        stream_start_bytes(XID),
        stream_commit_bytes(XID),
        stream_abort_bytes(XID, SUBXID),
    ],
    ids=["start", "commit", "abort"],
)
def test_every_truncation_of_a_stream_control_message_is_malformed(payload):
    for length in range(len(payload)):
        with pytest.raises(MalformedMessageError):
            decode(payload[:length])


def test_a_parallel_stream_abort_cut_short_is_malformed_unless_it_is_the_short_form():
    payload = stream_abort_bytes(XID, SUBXID, parallel=True)
    short = len(stream_abort_bytes(XID, SUBXID))
    for length in [*range(short), *range(short + 1, len(payload))]:
        with pytest.raises(MalformedMessageError):
            decode(payload[:length])
    # Cut after the subxid it is version 2's Stream Abort: the frame's length decides.
    assert decode(payload[:short]) == StreamAbort(
        xid=XID, subxid=SUBXID, abort_lsn=None, abort_time=None
    )


def test_malformed_stream_control_fields_are_named():
    with pytest.raises(MalformedMessageError, match="first-segment flag"):
        decode(stream_start_bytes(XID, 2))
    with pytest.raises(MalformedMessageError, match="Stream Commit flags"):
        decode(b"c" + struct.pack("!IBQQq", XID, 1, 1, 2, 3))
    # Neither version 2's 8 bytes nor version 4's 24: a misread, not a shorter form.
    with pytest.raises(MalformedMessageError, match="abort LSN and timestamp"):
        decode(stream_abort_bytes(XID, SUBXID) + b"\x00" * 8)
    with pytest.raises(MalformedMessageError, match="trailing"):
        decode(b"E\x00")
    with pytest.raises(MalformedMessageError, match="trailing"):
        decode(stream_start_bytes(XID) + b"\x00")


def test_blocks_open_and_close_around_their_messages():
    blocks = StreamBlocks()
    assert blocks.block_xid is None
    assert blocks.decode(stream_start_bytes(XID)) == StreamStart(xid=XID, first_segment=True)
    assert blocks.block_xid == XID
    inserted = blocks.decode(insert_bytes(XID))
    assert isinstance(inserted, Insert)
    assert inserted.xid == XID
    assert blocks.decode(b"E") == StreamStop()
    assert blocks.block_xid is None
    # Between blocks the same bytes are read without an xid again.
    assert blocks.decode(insert_bytes(None)) == expected("insert", None)


@pytest.mark.parametrize(
    "payload",
    [
        stream_start_bytes(XID + 10),
        begin_bytes(XID),
        commit_bytes(),
        stream_commit_bytes(XID),
        stream_abort_bytes(XID, SUBXID),
    ],
    ids=["stream-start", "begin", "commit", "stream-commit", "stream-abort"],
)
def test_what_only_comes_between_blocks_is_refused_inside_one(payload):
    blocks = in_block(StreamBlocks())
    with pytest.raises(StreamOrderError, match=f"inside the stream block of transaction {XID}"):
        blocks.decode(payload)
    # The error leaves the block open: the stream is not read on by guessing.
    assert blocks.block_xid == XID


def test_a_stream_stop_between_blocks_is_refused():
    blocks = StreamBlocks()
    with pytest.raises(StreamOrderError, match="StreamStop arrived between stream blocks") as info:
        blocks.decode(b"E")
    assert isinstance(info.value, ProtocolError)
    assert info.value.block_xid is None
    assert blocks.block_xid is None


def test_reset_forgets_an_open_block():
    blocks = in_block(StreamBlocks())
    blocks.reset()
    assert blocks.block_xid is None
    assert blocks.decode(insert_bytes(None)) == expected("insert", None)


def test_a_subtransaction_abort_sequence_between_ordinary_transactions():
    """Two blocks of one transaction with a savepoint rolled back, an ordinary
    transaction between them, then the abort of the savepoint and the commit."""
    stream = [
        stream_start_bytes(XID, 1),
        relation_bytes(XID),
        insert_bytes(XID, "1"),
        insert_bytes(SUBXID, "2"),
        b"E",
        begin_bytes(XID + 5),
        relation_bytes(None),
        insert_bytes(None, "9"),
        commit_bytes(),
        stream_start_bytes(XID, 0),
        insert_bytes(SUBXID, "3"),
        b"E",
        stream_abort_bytes(XID, SUBXID),
        stream_start_bytes(XID, 0),
        insert_bytes(XID, "4"),
        b"E",
        stream_commit_bytes(XID),
    ]
    blocks = StreamBlocks()
    decoded = [blocks.decode(payload) for payload in stream]
    assert blocks.block_xid is None
    inserts = [(m.xid, m.new.values[0]) for m in decoded if isinstance(m, Insert)]
    assert inserts == [(XID, b"1"), (SUBXID, b"2"), (None, b"9"), (SUBXID, b"3"), (XID, b"4")]
    assert [type(m) for m in decoded if not isinstance(m, (Insert, Relation))] == [
        StreamStart,
        StreamStop,
        Begin,
        Commit,
        StreamStart,
        StreamStop,
        StreamAbort,
        StreamStart,
        StreamStop,
        StreamCommit,
    ]
    assert decoded[12] == StreamAbort(xid=XID, subxid=SUBXID, abort_lsn=None, abort_time=None)


def test_garbage_raises_protocol_errors_only():
    """Mutated streamed messages, read in and out of blocks: a typed error or a message,
    never an ``IndexError``, ``struct.error`` or ``UnicodeDecodeError``."""
    rng = random.Random(27)
    seeds = [builder(SUBXID) for builder in BUILDERS.values()] + [
        stream_start_bytes(XID),
        stream_commit_bytes(XID),
        stream_abort_bytes(XID, SUBXID, parallel=True),
        b"E",
    ]
    outcomes: set[str] = set()
    for _ in range(3000):
        payload = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        del payload[rng.randrange(len(payload) + 1) :]
        blocks = StreamBlocks()
        if rng.random() < 0.5:
            blocks.decode(stream_start_bytes(XID))
        try:
            blocks.decode(bytes(payload))
            outcomes.add("message")
        except ProtocolError:
            outcomes.add("error")
        try:
            split_stream_xid(bytes(payload))
        except MalformedMessageError:
            outcomes.add("no xid")
    assert outcomes == {"message", "error", "no xid"}
