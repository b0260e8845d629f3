"""pgoutput decoding against messages recorded from PostgreSQL 15, and against garbage.

The vectors and what they mean come from ``vectors/record_vectors.py``: every expected
value below is a fact the server reported (OIDs, xids, commit timestamps, column text),
or a payload LSN checked against the XLogData header it arrived in.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from capture.errors import ProtocolError
from capture.pgoutput import (
    Begin,
    BeginPrepare,
    ColumnKind,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    MalformedMessageError,
    Message,
    Origin,
    Prepare,
    Reader,
    Relation,
    RelationColumn,
    ReplicaIdentity,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TruncateOptions,
    TupleData,
    Type,
    Update,
    decode,
    pg_micros_to_datetime,
    pg_micros_to_unix_micros,
    unix_micros_to_pg_micros,
)
from capture.pgoutput.messages import frozen_constructor
from schemas.lsn import Lsn, parse_lsn

# The module, not the function the package exports under the same name.
decode_module = importlib.import_module("capture.pgoutput.decode")

VECTORS = Path(__file__).parent / "vectors"
V2 = json.loads((VECTORS / "pgoutput_v2.json").read_text())
V3 = json.loads((VECTORS / "pgoutput_v3.json").read_text())

ALL_MESSAGES = [
    pytest.param(message, id=f"v{version}-{scenario['name']}-{i}-{message['message']}")
    for version, doc in ((2, V2), (3, V3))
    for scenario in doc["scenarios"]
    for i, message in enumerate(scenario["messages"])
]


def scenario(doc: dict[str, Any], name: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [s for s in doc["scenarios"] if s["name"] == name]
    (found,) = matches
    return found


def decoded(s: dict[str, Any]) -> list[Message]:
    return [decode(bytes.fromhex(m["hex"]), in_stream=m["in_stream"]) for m in s["messages"]]


def wal_start(s: dict[str, Any], index: int) -> Lsn:
    return parse_lsn(s["messages"][index]["wal_start"])


def tuple_data(columns: list[list[str | None]]) -> TupleData:
    return TupleData(
        kinds=tuple(ColumnKind(kind) for kind, _ in columns),
        values=tuple(None if value is None else value.encode() for _, value in columns),
    )


def relation(facts: dict[str, Any], xid: int | None = None) -> Relation:
    return Relation(
        xid=xid,
        oid=facts["oid"],
        namespace=facts["namespace"],
        name=facts["name"],
        replica_identity=ReplicaIdentity(facts["replica_identity"]),
        columns=tuple(
            RelationColumn(
                is_key=c["is_key"],
                name=c["name"],
                type_oid=c["type_oid"],
                type_modifier=c["type_modifier"],
            )
            for c in facts["columns"]
        ),
    )


def assert_transaction(s: dict[str, Any], begin: Message, commit: Message) -> None:
    """Begin/Commit carry the server's xid and commit time, and consistent LSNs.

    The walsender frames Commit at the transaction's end LSN, and Begin announces the
    commit record's LSN, which Commit repeats.
    """
    facts = s["facts"]
    assert isinstance(begin, Begin)
    assert isinstance(commit, Commit)
    assert begin.xid == facts["xid"]
    assert begin.commit_time == commit.commit_time == facts["commit_time"]
    assert begin.final_lsn == commit.commit_lsn
    assert commit.end_lsn == wal_start(s, -1)
    assert commit.commit_lsn < commit.end_lsn


@pytest.mark.parametrize("message", ALL_MESSAGES)
def test_every_vector_decodes_to_the_message_it_was_recorded_as(message):
    result = decode(bytes.fromhex(message["hex"]), in_stream=message["in_stream"])
    assert type(result).__name__ == message["message"]


def test_insert_with_type_and_composite_key_relation():
    s = scenario(V2, "insert")
    facts = s["facts"]
    begin, type_, rel, first, second, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert type_ == Type(
        xid=None,
        oid=facts["type"]["oid"],
        namespace="public",
        name="vec_mood",
    )
    assert isinstance(type_, Type)
    assert rel == relation(facts["relation"])
    assert isinstance(rel, Relation)
    assert [c.name for c in rel.columns if c.is_key] == ["region", "order_id"]
    assert rel.columns[3].type_modifier == facts["relation"]["columns"][3]["type_modifier"]
    assert rel.columns[7].type_oid == type_.oid
    rows = facts["rows"]
    assert first == Insert(xid=None, relation_oid=rel.oid, new=tuple_data(rows[0]))
    assert second == Insert(xid=None, relation_oid=rel.oid, new=tuple_data(rows[1]))
    assert isinstance(first, Insert)
    assert first.new.values[5] == b"2024-01-02 03:04:05.123456+00"
    assert first.new.values[8] == b"\\x00ff"
    assert isinstance(second, Insert)
    assert second.new.kinds[2:] == (ColumnKind.NULL,) * 7
    assert len(second.new) == 9


def test_update_without_old_tuple_under_default_identity():
    s = scenario(V2, "update_default")
    facts = s["facts"]
    begin, update, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert update == Update(
        xid=None,
        relation_oid=facts["relation_oid"],
        key=None,
        old=None,
        new=tuple_data(facts["new"]),
    )


def test_update_of_a_key_column_carries_the_old_key():
    s = scenario(V2, "update_key")
    facts = s["facts"]
    begin, update, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert update == Update(
        xid=None,
        relation_oid=facts["relation_oid"],
        key=tuple_data(facts["key"]),
        old=None,
        new=tuple_data(facts["new"]),
    )
    assert isinstance(update, Update)
    assert update.key is not None
    assert update.key.values[:2] == (b"eu", b"1")
    assert update.new.values[:2] == (b"eu", b"2")


def test_update_under_replica_identity_full_carries_the_old_row():
    s = scenario(V2, "update_full")
    facts = s["facts"]
    begin, rel, insert, update, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert rel == relation(facts["relation"])
    assert isinstance(rel, Relation)
    assert rel.replica_identity is ReplicaIdentity.FULL
    assert all(c.is_key for c in rel.columns)
    assert insert == Insert(xid=None, relation_oid=rel.oid, new=tuple_data(facts["inserted"]))
    assert update == Update(
        xid=None,
        relation_oid=rel.oid,
        key=None,
        old=tuple_data(facts["old"]),
        new=tuple_data(facts["new"]),
    )


def test_update_leaving_a_toasted_value_alone_marks_it_unchanged():
    s = scenario(V2, "update_unchanged_toast")
    facts = s["facts"]
    begin, rel, update, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert rel == relation(facts["relation"])
    assert update == Update(
        xid=None,
        relation_oid=facts["relation"]["oid"],
        key=None,
        old=None,
        new=tuple_data(facts["new"]),
    )
    assert isinstance(update, Update)
    assert update.new.kinds[2] is ColumnKind.UNCHANGED_TOAST
    assert update.new.values[2] is None


def test_delete_under_default_identity_carries_the_old_key():
    s = scenario(V2, "delete_key")
    facts = s["facts"]
    begin, delete, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert delete == Delete(
        xid=None, relation_oid=facts["relation_oid"], key=tuple_data(facts["key"]), old=None
    )


def test_delete_under_replica_identity_full_carries_the_old_row():
    s = scenario(V2, "delete_full")
    facts = s["facts"]
    begin, delete, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert delete == Delete(
        xid=None, relation_oid=facts["relation_oid"], key=None, old=tuple_data(facts["old"])
    )


def test_truncate_of_two_tables_with_options():
    s = scenario(V2, "truncate")
    facts = s["facts"]
    begin, rel_a, rel_b, truncate, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert rel_a == relation(facts["relations"][0])
    assert rel_b == relation(facts["relations"][1])
    assert truncate == Truncate(
        xid=None,
        options=TruncateOptions.CASCADE | TruncateOptions.RESTART_IDENTITY,
        relation_oids=(facts["relations"][0]["oid"], facts["relations"][1]["oid"]),
    )


def test_transactional_logical_message():
    s = scenario(V2, "message_transactional")
    facts = s["facts"]
    begin, message, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert message == LogicalMessage(
        xid=None,
        transactional=True,
        lsn=wal_start(s, 1),
        prefix="vec_prefix",
        content=bytes.fromhex(facts["content"]),
    )
    assert isinstance(message, LogicalMessage)
    assert message.content == "héllo\x00wörld".encode()


def test_non_transactional_logical_message_stands_alone():
    s = scenario(V2, "message_non_transactional")
    facts = s["facts"]
    (message,) = decoded(s)
    assert message == LogicalMessage(
        xid=None,
        transactional=False,
        lsn=parse_lsn(facts["emit_result_lsn"]),
        prefix="vec_präfix",
        content=bytes(range(256)),
    )


def test_origin_of_a_replayed_transaction():
    s = scenario(V2, "origin")
    facts = s["facts"]
    begin, origin, insert, commit = decoded(s)
    assert_transaction(s, begin, commit)
    assert origin == Origin(commit_lsn=parse_lsn("1/2345678"), name="vec_origin")
    assert insert == Insert(
        xid=None, relation_oid=facts["relation_oid"], new=tuple_data(facts["new"])
    )
    # pg_replication_origin_xact_setup() sets the commit timestamp, so it is known exactly.
    assert isinstance(commit, Commit)
    assert pg_micros_to_datetime(commit.commit_time) == datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)


def stream_segments(messages: list[Message], xid: int) -> int:
    """Check StreamStart/StreamStop pairing and return the number of segments."""
    starts = [m for m in messages if isinstance(m, StreamStart)]
    stops = [m for m in messages if isinstance(m, StreamStop)]
    assert starts
    assert len(starts) == len(stops)
    assert [m.first_segment for m in starts] == [True] + [False] * (len(starts) - 1)
    assert {m.xid for m in starts} == {xid}
    return len(starts)


def test_streamed_transaction_carries_xids_and_ends_in_stream_commit():
    s = scenario(V2, "stream_commit")
    facts = s["facts"]
    xid = facts["xid"]
    messages = decoded(s)
    assert stream_segments(messages, xid) >= 2
    assert messages[1] == relation(facts["relation"], xid=xid)
    inserts = [m for m in messages if isinstance(m, Insert)]
    assert inserts == [
        Insert(xid=xid, relation_oid=facts["relation"]["oid"], new=tuple_data(row))
        for row in facts["first_rows"]
    ]
    commit = messages[-1]
    assert isinstance(commit, StreamCommit)
    assert commit == StreamCommit(
        xid=xid,
        commit_lsn=commit.commit_lsn,
        end_lsn=wal_start(s, -1),
        commit_time=facts["commit_time"],
    )
    assert commit.commit_lsn < commit.end_lsn


def test_rolled_back_streamed_transaction_ends_in_stream_abort():
    s = scenario(V2, "stream_abort")
    xid = s["facts"]["xid"]
    messages = decoded(s)
    stream_segments(messages, xid)
    assert all(m.xid == xid for m in messages if isinstance(m, Insert))
    assert messages[-1] == StreamAbort(xid=xid, subxid=xid, abort_lsn=None, abort_time=None)


def test_rolled_back_streamed_subtransaction():
    s = scenario(V2, "stream_subxact_abort")
    facts = s["facts"]
    xid, subxid = facts["xid"], facts["subxid"]
    assert subxid != xid
    messages = decoded(s)
    stream_segments(messages, xid)
    inserts = [m for m in messages if isinstance(m, Insert)]
    # Inside a stream, a change carries the xid of the (sub)transaction that made it.
    assert [m.xid for m in inserts] == [xid, subxid, subxid]
    assert inserts[0].new == tuple_data([["t", "20000"], ["t", "kept"]])
    abort, commit = messages[-2:]
    assert abort == StreamAbort(xid=xid, subxid=subxid, abort_lsn=None, abort_time=None)
    assert isinstance(commit, StreamCommit)
    assert (commit.xid, commit.commit_time) == (xid, facts["commit_time"])
    assert commit.end_lsn == wal_start(s, -1)


def test_two_phase_commit():
    s = scenario(V3, "prepare_commit")
    facts = s["facts"]
    begin, rel, insert, prepare, commit = decoded(s)
    assert isinstance(begin, BeginPrepare)
    assert isinstance(prepare, Prepare)
    assert begin == BeginPrepare(
        prepare_lsn=prepare.prepare_lsn,
        end_lsn=wal_start(s, 3),
        prepare_time=facts["prepare_time"],
        xid=facts["xid"],
        gid="vec_gid_commit",
    )
    assert prepare == Prepare(
        prepare_lsn=begin.prepare_lsn,
        end_lsn=begin.end_lsn,
        prepare_time=facts["prepare_time"],
        xid=facts["xid"],
        gid="vec_gid_commit",
    )
    assert prepare.prepare_lsn < prepare.end_lsn
    assert rel == relation(facts["relation"])
    assert insert == Insert(
        xid=None, relation_oid=facts["relation"]["oid"], new=tuple_data(facts["new"])
    )
    assert isinstance(commit, CommitPrepared)
    assert commit == CommitPrepared(
        commit_lsn=commit.commit_lsn,
        end_lsn=wal_start(s, 4),
        commit_time=facts["commit_time"],
        xid=facts["xid"],
        gid="vec_gid_commit",
    )
    assert prepare.end_lsn <= commit.commit_lsn < commit.end_lsn


def test_two_phase_rollback():
    s = scenario(V3, "prepare_rollback")
    facts = s["facts"]
    begin, insert, prepare, rollback = decoded(s)
    assert isinstance(begin, BeginPrepare)
    assert isinstance(prepare, Prepare)
    assert (begin.xid, begin.gid, begin.prepare_time) == (
        facts["xid"],
        "vec_gid_rollback",
        facts["prepare_time"],
    )
    assert insert == Insert(
        xid=None, relation_oid=facts["relation_oid"], new=tuple_data(facts["new"])
    )
    assert prepare.end_lsn == begin.end_lsn == wal_start(s, 2)
    assert isinstance(rollback, RollbackPrepared)
    assert rollback == RollbackPrepared(
        prepare_end_lsn=prepare.end_lsn,
        rollback_end_lsn=wal_start(s, 3),
        prepare_time=facts["prepare_time"],
        rollback_time=rollback.rollback_time,
        xid=facts["xid"],
        gid="vec_gid_rollback",
    )
    assert rollback.rollback_time > rollback.prepare_time


def test_streamed_two_phase_transaction():
    s = scenario(V3, "stream_prepare")
    facts = s["facts"]
    xid = facts["xid"]
    messages = decoded(s)
    stream_segments(messages, xid)
    prepare, commit = messages[-2:]
    assert isinstance(prepare, StreamPrepare)
    assert prepare == StreamPrepare(
        prepare_lsn=prepare.prepare_lsn,
        end_lsn=wal_start(s, -2),
        prepare_time=facts["prepare_time"],
        xid=xid,
        gid="vec_gid_stream",
    )
    assert prepare.prepare_lsn < prepare.end_lsn
    assert isinstance(commit, CommitPrepared)
    assert commit == CommitPrepared(
        commit_lsn=commit.commit_lsn,
        end_lsn=wal_start(s, -1),
        commit_time=facts["commit_time"],
        xid=xid,
        gid="vec_gid_stream",
    )


def test_memoryview_slices_decode_like_bytes():
    payload = bytes.fromhex(scenario(V2, "insert")["messages"][3]["hex"])
    framed = memoryview(b"w" * 25 + payload)[25:]
    assert decode(framed) == decode(payload)


# Malformed input: every failure is a MalformedMessageError (a ProtocolError) with an offset.


def decode_error(buf: bytes, *, in_stream: bool = False) -> MalformedMessageError:
    with pytest.raises(MalformedMessageError) as info:
        decode(buf, in_stream=in_stream)
    return info.value


@pytest.mark.parametrize("message", ALL_MESSAGES)
def test_every_truncation_of_a_vector_raises_decode_error(message):
    payload = bytes.fromhex(message["hex"])
    for length in range(len(payload)):
        error = decode_error(payload[:length], in_stream=message["in_stream"])
        assert 0 <= error.offset <= length


@pytest.mark.parametrize("message", ALL_MESSAGES)
def test_trailing_bytes_after_a_vector_raise_decode_error(message):
    payload = bytes.fromhex(message["hex"])
    error = decode_error(payload + b"\x00", in_stream=message["in_stream"])
    assert error.offset == len(payload)


def test_decode_error_is_a_protocol_error_with_a_readable_message():
    error = decode_error(b"")
    assert isinstance(error, ProtocolError)
    assert (error.offset, error.wanted, error.got) == (0, "pgoutput message tag", "empty message")
    assert str(error) == (
        "malformed replication message at byte 0: wanted pgoutput message tag, got empty message"
    )


def test_truncated_fixed_field_reports_wanted_and_available_bytes():
    error = decode_error(b"S" + b"\x00" * 2)
    assert (error.offset, error.wanted, error.got) == (1, "5 bytes", "2 bytes left in message")
    error = decode_error(b"I" + b"\x00" * 3)
    assert (error.offset, error.wanted, error.got) == (1, "4 bytes", "3 bytes left in message")


@pytest.mark.parametrize("tag", [b"\x00", b"Z", b"w", b"k", b"\xff"])
def test_unknown_tag_raises_decode_error(tag):
    error = decode_error(tag + b"\x00" * 20)
    assert error.offset == 0
    assert error.wanted == "pgoutput message tag"
    assert error.got.startswith(f"0x{tag[0]:02x}")


def test_invalid_utf8_in_a_name_reports_its_offset():
    payload = bytearray.fromhex(scenario(V2, "insert")["messages"][2]["hex"])
    at = payload.index(b"vec_orders\x00") + 3
    payload[at] = 0xFF
    error = decode_error(bytes(payload))
    assert (error.offset, error.wanted, error.got) == (at, "UTF-8 text", "invalid byte 0xff")
    assert isinstance(error.__cause__, UnicodeDecodeError)


def test_invalid_utf8_in_a_multibyte_sequence_points_at_the_bad_byte():
    # 0xC3 starts a two-byte sequence; 0x28 cannot continue it.
    error = decode_error(b"O" + b"\x00" * 8 + b"ab\xc3\x28\x00")
    assert error.offset == 11


def test_unterminated_string_raises_decode_error():
    error = decode_error(b"O" + b"\x00" * 8 + b"origin")
    assert (error.offset, error.wanted) == (9, "NUL-terminated string")


def new_tuple(*columns: bytes) -> bytes:
    return struct.pack("!H", len(columns)) + b"".join(columns)


def text(value: bytes) -> bytes:
    return b"t" + struct.pack("!I", len(value)) + value


def test_binary_columns_keep_their_bytes():
    payload = b"I" + struct.pack("!I", 42) + b"N" + new_tuple(b"b\x00\x00\x00\x02\x01\x02", b"n")
    assert decode(payload) == Insert(
        xid=None,
        relation_oid=42,
        new=TupleData(kinds=(ColumnKind.BINARY, ColumnKind.NULL), values=(b"\x01\x02", None)),
    )


def test_insert_in_stream_reads_the_xid_first():
    payload = b"I" + struct.pack("!II", 7, 42) + b"N" + new_tuple(text(b"x"))
    assert decode(payload, in_stream=True) == Insert(
        xid=7, relation_oid=42, new=tuple_data([["t", "x"]])
    )


def test_unknown_column_kind_raises_decode_error():
    payload = b"I" + struct.pack("!I", 42) + b"N" + new_tuple(text(b"x"), b"x")
    error = decode_error(payload)
    assert (error.offset, error.got) == (14, "0x78 ('x')")


def test_column_length_beyond_the_message_raises_decode_error():
    payload = b"I" + struct.pack("!I", 42) + b"N" + new_tuple(b"t\xff\xff\xff\xff")
    error = decode_error(payload)
    assert (error.offset, error.wanted) == (13, "4294967295 bytes")


def test_unexpected_tuple_markers_raise_decode_error():
    assert decode_error(b"I" + struct.pack("!I", 1) + b"K" + new_tuple()).offset == 5
    assert decode_error(b"U" + struct.pack("!I", 1) + b"X" + new_tuple()).offset == 5
    update_two_keys = b"U" + struct.pack("!I", 1) + b"K" + new_tuple() + b"K" + new_tuple()
    assert decode_error(update_two_keys).offset == 8
    assert decode_error(b"D" + struct.pack("!I", 1) + b"N" + new_tuple()).offset == 5


def test_unknown_flags_raise_decode_error():
    commit = b"C\x01" + b"\x00" * 24
    error = decode_error(commit)
    assert (error.offset, error.wanted, error.got) == (1, "Commit flags 0", "0x01")
    truncate = b"T" + struct.pack("!I", 0) + b"\x04"
    assert decode_error(truncate).offset == 5
    message = b"M\x02" + b"\x00" * 8 + b"p\x00" + struct.pack("!I", 0)
    assert decode_error(message).offset == 1
    stream_start = b"S" + struct.pack("!I", 9) + b"\x02"
    assert decode_error(stream_start).offset == 5


def test_unknown_replica_identity_and_column_flags_raise_decode_error():
    head = b"R" + struct.pack("!I", 1) + b"s\x00t\x00"
    column = b"c\x00" + struct.pack("!Ii", 23, -1)
    assert decode(head + b"i" + struct.pack("!H", 1) + b"\x01" + column) == Relation(
        xid=None,
        oid=1,
        namespace="s",
        name="t",
        replica_identity=ReplicaIdentity.INDEX,
        columns=(RelationColumn(is_key=True, name="c", type_oid=23, type_modifier=-1),),
    )
    assert decode_error(head + b"x" + struct.pack("!H", 0)).offset == 9
    assert decode_error(head + b"n" + struct.pack("!H", 1) + b"\x02" + column).offset == 12


def test_empty_namespace_means_pg_catalog():
    assert decode(b"Y" + struct.pack("!I", 25) + b"\x00text\x00") == Type(
        xid=None, oid=25, namespace="pg_catalog", name="text"
    )


def test_huge_truncate_count_fails_without_allocating():
    error = decode_error(b"T" + struct.pack("!I", 0x7FFF_FFFF) + b"\x00" + b"\x00" * 8)
    assert (error.offset, error.wanted) == (6, f"{4 * 0x7FFF_FFFF} bytes")


def test_stream_abort_with_parallel_apply_information():
    payload = b"A" + struct.pack("!IIQq", 5, 6, 0x16_B374_D848, 1_000_000)
    assert decode(payload) == StreamAbort(
        xid=5, subxid=6, abort_lsn=parse_lsn("16/B374D848"), abort_time=1_000_000
    )
    for length in range(10, len(payload)):
        assert decode_error(payload[:length]).offset == 9


def test_stream_stop_has_no_fields():
    assert decode(b"E", in_stream=True) == StreamStop()


def test_reader_does_not_move_on_a_failed_read():
    reader = Reader(b"\x00\x01\xff")
    with pytest.raises(MalformedMessageError):
        reader.i32()
    assert reader.offset == 0
    assert reader.i16() == 1
    assert reader.remaining() == 1
    with pytest.raises(MalformedMessageError) as info:
        reader.finish()
    assert info.value.got == "1 trailing bytes"
    assert reader.u8() == 0xFF
    reader.finish()


def test_reader_signed_and_unsigned_reads():
    reader = Reader(b"\xff" * 30)
    assert (reader.i16(), reader.u16()) == (-1, 0xFFFF)
    assert (reader.i32(), reader.u32()) == (-1, 0xFFFF_FFFF)
    assert (reader.i64(), reader.u64()) == (-1, 0xFFFF_FFFF_FFFF_FFFF)
    assert reader.remaining() == 2


def test_reader_byte_reads_are_bounds_checked():
    reader = Reader(b"\x00\x00\x00\x02abc")
    assert reader.counted_bytes() == b"ab"
    with pytest.raises(MalformedMessageError) as info:
        reader.bytes_(2)
    assert (info.value.offset, info.value.wanted) == (6, "2 bytes")
    with pytest.raises(MalformedMessageError):
        reader.bytes_(-1)
    assert reader.bytes_(1) == b"c"
    assert len(reader.rest()) == 0
    reader.finish()


def test_reader_views_share_memory():
    frame = bytearray(b"abcdef")
    reader = Reader(memoryview(frame))
    assert reader.u8() == ord("a")
    head = reader.view(2)
    rest = reader.rest()
    frame[1:2] = b"B"
    frame[5:6] = b"F"
    assert bytes(head) == b"Bc"
    assert bytes(rest) == b"deF"
    reader.finish()


def test_timestamp_conversions():
    assert pg_micros_to_datetime(0) == datetime(2000, 1, 1, tzinfo=UTC)
    assert pg_micros_to_datetime(-1) == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert pg_micros_to_unix_micros(0) == 946_684_800_000_000
    assert unix_micros_to_pg_micros(0) == -946_684_800_000_000
    commit_time = scenario(V2, "insert")["facts"]["commit_time"]
    as_datetime = pg_micros_to_datetime(commit_time)
    assert as_datetime.timestamp() * 1_000_000 == pytest.approx(
        pg_micros_to_unix_micros(commit_time), abs=1
    )


# -- the row-change fast path -------------------------------------------------------------

VECTOR_MESSAGES: list[dict[str, Any]] = [
    message for doc in (V2, V3) for scenario in doc["scenarios"] for message in scenario["messages"]
]
ROW_CHANGES = ("Insert", "Update", "Delete")
FAST_PATH_MESSAGES = [
    pytest.param(message, id=f"v{version}-{scenario['name']}-{i}-{message['message']}")
    for version, doc in ((2, V2), (3, V3))
    for scenario in doc["scenarios"]
    for i, message in enumerate(scenario["messages"])
    if message["message"] in (*ROW_CHANGES, "Begin", "Commit")
]


def _variants(payload: bytes) -> list[bytes]:
    """Every truncation, one trailing byte, and every byte replaced by a few others."""
    variants = [payload[:length] for length in range(len(payload))]
    variants.append(payload + b"\x00")
    for i in range(len(payload)):
        for byte in (0x00, 0x01, 0x4B, 0x4E, 0x4F, 0x62, 0x6E, 0x74, 0x75, 0xFF):
            variants.append(payload[:i] + bytes([byte]) + payload[i + 1 :])
    return variants


def test_the_vectors_include_every_row_change_shape():
    shapes = set()
    for vector in VECTOR_MESSAGES:
        if vector["message"] not in ROW_CHANGES:
            continue
        message = decode(bytes.fromhex(vector["hex"]), in_stream=vector["in_stream"])
        assert isinstance(message, Insert | Update | Delete)
        shapes.add((type(message).__name__, getattr(message, "key", None) is not None))
        shapes.add((type(message).__name__, getattr(message, "old", None) is not None))
        shapes.add(("in stream", vector["in_stream"]))
    assert {("Update", True), ("Delete", True), ("in stream", True)} <= shapes
    assert len(FAST_PATH_MESSAGES) > 10


@pytest.mark.parametrize("message", FAST_PATH_MESSAGES)
def test_fast_decoding_agrees_with_the_checked_decoder(message):
    """The fast paths either build exactly the message the Reader-based decoder builds,
    or give up and leave the error to it; they never accept what that rejects."""
    payload = bytes.fromhex(message["hex"])
    in_stream = message["in_stream"]
    assert decode(payload, in_stream=in_stream) == decode_module._decode_checked(payload, in_stream)
    for variant in _variants(payload):
        if message["message"] in ROW_CHANGES and variant:
            fast = decode_module._row_change(variant, in_stream)
        else:
            fast = None
        try:
            checked: Message | MalformedMessageError = decode_module._decode_checked(
                variant, in_stream
            )
        except MalformedMessageError as exc:
            checked = exc
        if fast is not None:
            assert fast == checked, variant.hex()
        # What decode() returns or raises is always the checked decoder's answer.
        if isinstance(checked, MalformedMessageError):
            assert decode_error(variant, in_stream=in_stream).offset == checked.offset
        else:
            assert decode(variant, in_stream=in_stream) == checked


def test_frozen_constructor_builds_the_same_frozen_object():
    build = frozen_constructor(Update)
    new = TupleData((ColumnKind.TEXT, ColumnKind.NULL), (b"1", None))
    built = build(7, 16384, None, None, new)
    assert type(built) is Update
    assert built == Update(7, 16384, None, None, new)
    assert hash(built) == hash(Update(7, 16384, None, None, new))
    assert repr(built) == repr(Update(7, 16384, None, None, new))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.xid = 8  # type: ignore[misc]


def test_frozen_constructor_refuses_what_it_cannot_build_faithfully():
    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    with pytest.raises(TypeError):
        frozen_constructor(Checked)
    with pytest.raises(TypeError):
        frozen_constructor(int)
