"""Decode one pgoutput message from bytes; no I/O.

Formats: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
(protocol versions 1 to 4). The bytes are the payload of one XLogData frame; see
:mod:`capture.stream.copy_data`.

Invariants:

- :func:`decode` consumes the whole buffer or raises :class:`MalformedMessageError`: empty,
  truncated, unknown tags, unknown flags or submessage markers, invalid UTF-8 and
  trailing bytes are all errors, never a partially filled message.
- Whether a message carries an xid is not in the message itself: the server adds it
  only inside a streamed transaction. The caller tracks StreamStart/StreamStop and
  passes ``in_stream``; decoding a message with the wrong ``in_stream`` misreads it,
  which the length checks usually but not always catch.
- Stream Abort carries an abort LSN and timestamp only with protocol version 4 and
  ``streaming 'parallel'``. The frame is length-delimited, so their presence is read
  from the length: exactly 8 or exactly 24 bytes may follow the tag.

Speed: Insert, Update and Delete are nearly every message of a busy stream, so they
first go through :func:`_row_change`, which reads the bytes with local arithmetic
instead of one :class:`Reader` call per field; Begin and Commit, fixed-size, are read
with one unpack when their length and flags are right. These fast paths check every
bound too, but only say whether the message is well formed: on anything unexpected
they give up and the :class:`Reader`-based decoder reads the message again, to raise
the precise :class:`MalformedMessageError`. Both build the same message from the same bytes
(tests/unit/capture/test_pgoutput_decode.py compares them on mutated vectors).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from capture.pgoutput.messages import (
    BEGIN,
    BEGIN_PREPARE,
    COMMIT,
    COMMIT_PREPARED,
    DELETE,
    INSERT,
    LOGICAL_MESSAGE,
    NEW_TUPLE,
    OLD_KEY,
    OLD_TUPLE,
    ORIGIN,
    PREPARE,
    RELATION,
    ROLLBACK_PREPARED,
    STREAM_ABORT,
    STREAM_COMMIT,
    STREAM_PREPARE,
    STREAM_START,
    STREAM_STOP,
    TRUNCATE,
    TYPE,
    UPDATE,
    Begin,
    BeginPrepare,
    ColumnKind,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
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
    frozen_constructor,
)
from capture.pgoutput.reader import MalformedMessageError, Reader

_COLUMN_KINDS = {ord(kind.value): kind for kind in ColumnKind}
_REPLICA_IDENTITIES = {ord(identity.value): identity for identity in ReplicaIdentity}
_VALUE_KINDS = frozenset({ord(ColumnKind.TEXT.value), ord(ColumnKind.BINARY.value)})

_COLUMN_IS_KEY = 1
_MESSAGE_TRANSACTIONAL = 1
_TRUNCATE_ALL_OPTIONS = TruncateOptions.CASCADE | TruncateOptions.RESTART_IDENTITY

# Fixed-layout runs of fields, each read with a single bounds check.
_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!BQQq")
_ORIGIN = struct.Struct("!Q")
_STREAM_START = struct.Struct("!IB")
_STREAM_COMMIT = struct.Struct("!IBQQq")
_STREAM_ABORT = struct.Struct("!II")
_STREAM_ABORT_INFO = struct.Struct("!Qq")
_PREPARE = struct.Struct("!BQQqI")
_BEGIN_PREPARE = struct.Struct("!QQqI")
_ROLLBACK_PREPARED = struct.Struct("!BQQqqI")
_COLUMN_TYPE = struct.Struct("!Ii")


def decode(buf: bytes | memoryview, *, in_stream: bool = False) -> Message:
    """Decode one pgoutput message.

    ``in_stream`` must be true between a StreamStart and the following StreamStop:
    there, the server prefixes data messages with the xid of the (sub)transaction
    that made them.
    """
    data = bytes(buf)
    tag = data[0] if data else None
    if tag in _ROW_CHANGE_TAGS:
        message = _row_change(data, in_stream)
        if message is not None:
            return message
    elif tag == BEGIN and len(data) == 1 + _BEGIN.size:
        final_lsn, commit_time, xid = _BEGIN.unpack_from(data, 1)
        return _new_begin(final_lsn, commit_time, xid)
    elif tag == COMMIT and len(data) == 1 + _COMMIT.size and data[1] == 0:
        _, commit_lsn, end_lsn, commit_time = _COMMIT.unpack_from(data, 1)
        return _new_commit(commit_lsn, end_lsn, commit_time)
    return _decode_checked(buf, in_stream)


def _decode_checked(buf: bytes | memoryview, in_stream: bool) -> Message:
    """:func:`decode` with a :class:`Reader`: any message, and the precise error."""
    reader = Reader(buf)
    if not reader.remaining():
        raise MalformedMessageError(0, "pgoutput message tag", "empty message")
    tag = reader.u8()
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise MalformedMessageError(0, "pgoutput message tag", _describe_byte(tag))
    message = decoder(reader, in_stream)
    reader.finish()
    return message


_ROW_CHANGE_TAGS = frozenset({INSERT, UPDATE, DELETE})
_new_begin = frozen_constructor(Begin)
_new_commit = frozen_constructor(Commit)
_new_insert = frozen_constructor(Insert)
_new_update = frozen_constructor(Update)
_new_delete = frozen_constructor(Delete)
_new_tuple_data = frozen_constructor(TupleData)
_KINDS = {ord(kind.value): kind for kind in ColumnKind}
_TEXT = ord(ColumnKind.TEXT.value)
_BINARY = ord(ColumnKind.BINARY.value)
_NULL = ord(ColumnKind.NULL.value)
_UNCHANGED_TOAST = ord(ColumnKind.UNCHANGED_TOAST.value)
_VALUE_TAGS = frozenset({_TEXT, _BINARY})
_NO_VALUE_TAGS = frozenset({_NULL, _UNCHANGED_TOAST})
_U32 = struct.Struct("!I")


def _row_change(data: bytes, in_stream: bool) -> Insert | Update | Delete | None:
    """Insert, Update or Delete from ``data``; None if it is not well formed."""
    end = len(data)
    pos = 5 if in_stream else 1
    if pos + 5 > end:
        return None
    xid: int | None = _U32.unpack_from(data, 1)[0] if in_stream else None
    relation_oid: int = _U32.unpack_from(data, pos)[0]
    tag, marker = data[0], data[pos + 4]
    pos += 5
    if tag not in _ROW_CHANGE_TAGS:
        return None
    if tag == INSERT:
        if marker != NEW_TUPLE:
            return None
        new = _row_tuple(data, pos, end)
        if new is None or new[1] != end:
            return None
        return _new_insert(xid, relation_oid, new[0])
    if marker not in (OLD_KEY, OLD_TUPLE) and not (tag == UPDATE and marker == NEW_TUPLE):
        return None
    first = None
    if marker != NEW_TUPLE:
        first = _row_tuple(data, pos, end)
        if first is None:
            return None
        pos = first[1]
    if tag == DELETE:
        if first is None or pos != end:
            return None
        if marker == OLD_KEY:
            return _new_delete(xid, relation_oid, first[0], None)
        return _new_delete(xid, relation_oid, None, first[0])
    if first is not None:
        if pos >= end or data[pos] != NEW_TUPLE:
            return None
        pos += 1
    new = _row_tuple(data, pos, end)
    if new is None or new[1] != end:
        return None
    key = first[0] if first is not None and marker == OLD_KEY else None
    old = first[0] if first is not None and marker == OLD_TUPLE else None
    return _new_update(xid, relation_oid, key, old, new[0])


def _row_tuple(data: bytes, pos: int, end: int) -> tuple[TupleData, int] | None:
    """TupleData at ``pos`` and the position after it; None if it is not well formed."""
    if pos + 2 > end:
        return None
    count = (data[pos] << 8) | data[pos + 1]
    pos += 2
    kinds = []
    values: list[bytes | None] = []
    for _ in range(count):
        if pos >= end:
            return None
        tag = data[pos]
        if tag in _VALUE_TAGS:
            start = pos + 5
            if start > end:
                return None
            pos = start + _U32.unpack_from(data, pos + 1)[0]
            if pos > end:
                return None
            values.append(data[start:pos])
        elif tag in _NO_VALUE_TAGS:
            pos += 1
            values.append(None)
        else:
            return None
        kinds.append(_KINDS[tag])
    return _new_tuple_data(tuple(kinds), tuple(values)), pos


def _describe_byte(value: int) -> str:
    shown = chr(value) if 0x20 < value < 0x7F else "?"
    return f"0x{value:02x} ({shown!r})"


def _check_flags(flags: int, allowed: int, offset: int, wanted: str) -> None:
    if flags & ~allowed:
        raise MalformedMessageError(offset, wanted, f"0x{flags:02x}")


def _stream_xid(reader: Reader, in_stream: bool) -> int | None:
    return reader.u32() if in_stream else None


def _tuple(reader: Reader) -> TupleData:
    count = reader.u16()
    kinds: list[ColumnKind] = []
    values: list[bytes | None] = []
    for _ in range(count):
        tag = reader.u8()
        kind = _COLUMN_KINDS.get(tag)
        if kind is None:
            raise MalformedMessageError(
                reader.offset - 1, "column kind 'n', 'u', 't' or 'b'", _describe_byte(tag)
            )
        kinds.append(kind)
        values.append(reader.counted_bytes() if tag in _VALUE_KINDS else None)
    return TupleData(tuple(kinds), tuple(values))


def _tuple_marker(reader: Reader, allowed: tuple[int, ...], wanted: str) -> int:
    marker = reader.u8()
    if marker not in allowed:
        raise MalformedMessageError(reader.offset - 1, wanted, _describe_byte(marker))
    return marker


def _namespace(reader: Reader) -> str:
    # The server saves bytes by sending pg_catalog as the empty string.
    return reader.cstring() or "pg_catalog"


def _begin(reader: Reader, in_stream: bool) -> Begin:
    final_lsn, commit_time, xid = reader.unpack(_BEGIN)
    return Begin(final_lsn=final_lsn, commit_time=commit_time, xid=xid)


def _commit(reader: Reader, in_stream: bool) -> Commit:
    flags, commit_lsn, end_lsn, commit_time = reader.unpack(_COMMIT)
    _check_flags(flags, 0, 1, "Commit flags 0")
    return Commit(commit_lsn=commit_lsn, end_lsn=end_lsn, commit_time=commit_time)


def _origin(reader: Reader, in_stream: bool) -> Origin:
    (commit_lsn,) = reader.unpack(_ORIGIN)
    return Origin(commit_lsn=commit_lsn, name=reader.cstring())


def _relation(reader: Reader, in_stream: bool) -> Relation:
    xid = _stream_xid(reader, in_stream)
    oid = reader.u32()
    namespace = _namespace(reader)
    name = reader.cstring()
    identity_byte = reader.u8()
    identity = _REPLICA_IDENTITIES.get(identity_byte)
    if identity is None:
        raise MalformedMessageError(
            reader.offset - 1,
            "replica identity 'd', 'n', 'f' or 'i'",
            _describe_byte(identity_byte),
        )
    columns: list[RelationColumn] = []
    for _ in range(reader.u16()):
        flags = reader.u8()
        _check_flags(flags, _COLUMN_IS_KEY, reader.offset - 1, "column flags 0 or 1")
        column_name = reader.cstring()
        type_oid, type_modifier = reader.unpack(_COLUMN_TYPE)
        columns.append(
            RelationColumn(
                is_key=bool(flags),
                name=column_name,
                type_oid=type_oid,
                type_modifier=type_modifier,
            )
        )
    return Relation(
        xid=xid,
        oid=oid,
        namespace=namespace,
        name=name,
        replica_identity=identity,
        columns=tuple(columns),
    )


def _type(reader: Reader, in_stream: bool) -> Type:
    xid = _stream_xid(reader, in_stream)
    return Type(xid=xid, oid=reader.u32(), namespace=_namespace(reader), name=reader.cstring())


def _insert(reader: Reader, in_stream: bool) -> Insert:
    xid = _stream_xid(reader, in_stream)
    relation_oid = reader.u32()
    _tuple_marker(reader, (NEW_TUPLE,), "new tuple marker 'N'")
    return Insert(xid=xid, relation_oid=relation_oid, new=_tuple(reader))


def _update(reader: Reader, in_stream: bool) -> Update:
    xid = _stream_xid(reader, in_stream)
    relation_oid = reader.u32()
    marker = _tuple_marker(reader, (NEW_TUPLE, OLD_KEY, OLD_TUPLE), "tuple marker 'K', 'O' or 'N'")
    key = old = None
    if marker == OLD_KEY:
        key = _tuple(reader)
    elif marker == OLD_TUPLE:
        old = _tuple(reader)
    if marker != NEW_TUPLE:
        _tuple_marker(reader, (NEW_TUPLE,), "new tuple marker 'N'")
    return Update(xid=xid, relation_oid=relation_oid, key=key, old=old, new=_tuple(reader))


def _delete(reader: Reader, in_stream: bool) -> Delete:
    xid = _stream_xid(reader, in_stream)
    relation_oid = reader.u32()
    marker = _tuple_marker(reader, (OLD_KEY, OLD_TUPLE), "old tuple marker 'K' or 'O'")
    values = _tuple(reader)
    if marker == OLD_KEY:
        return Delete(xid=xid, relation_oid=relation_oid, key=values, old=None)
    return Delete(xid=xid, relation_oid=relation_oid, key=None, old=values)


def _truncate(reader: Reader, in_stream: bool) -> Truncate:
    xid = _stream_xid(reader, in_stream)
    count = reader.u32()
    flags = reader.u8()
    _check_flags(flags, _TRUNCATE_ALL_OPTIONS.value, reader.offset - 1, "truncate options 0 to 3")
    return Truncate(xid=xid, options=TruncateOptions(flags), relation_oids=reader.u32_array(count))


def _logical_message(reader: Reader, in_stream: bool) -> LogicalMessage:
    xid = _stream_xid(reader, in_stream)
    flags = reader.u8()
    _check_flags(flags, _MESSAGE_TRANSACTIONAL, reader.offset - 1, "message flags 0 or 1")
    (lsn,) = reader.unpack(_ORIGIN)
    return LogicalMessage(
        xid=xid,
        transactional=bool(flags),
        lsn=lsn,
        prefix=reader.cstring(),
        content=reader.counted_bytes(),
    )


def _stream_start(reader: Reader, in_stream: bool) -> StreamStart:
    xid, first_segment = reader.unpack(_STREAM_START)
    _check_flags(first_segment, 1, reader.offset - 1, "first-segment flag 0 or 1")
    return StreamStart(xid=xid, first_segment=bool(first_segment))


def _stream_stop(reader: Reader, in_stream: bool) -> StreamStop:
    return StreamStop()


def _stream_commit(reader: Reader, in_stream: bool) -> StreamCommit:
    xid, flags, commit_lsn, end_lsn, commit_time = reader.unpack(_STREAM_COMMIT)
    _check_flags(flags, 0, 5, "Stream Commit flags 0")
    return StreamCommit(xid=xid, commit_lsn=commit_lsn, end_lsn=end_lsn, commit_time=commit_time)


def _stream_abort(reader: Reader, in_stream: bool) -> StreamAbort:
    xid, subxid = reader.unpack(_STREAM_ABORT)
    left = reader.remaining()
    if left == 0:
        return StreamAbort(xid=xid, subxid=subxid, abort_lsn=None, abort_time=None)
    if left != _STREAM_ABORT_INFO.size:
        raise MalformedMessageError(
            reader.offset,
            "end of message, or abort LSN and timestamp (16 bytes)",
            f"{left} bytes",
        )
    abort_lsn, abort_time = reader.unpack(_STREAM_ABORT_INFO)
    return StreamAbort(xid=xid, subxid=subxid, abort_lsn=abort_lsn, abort_time=abort_time)


def _begin_prepare(reader: Reader, in_stream: bool) -> BeginPrepare:
    prepare_lsn, end_lsn, prepare_time, xid = reader.unpack(_BEGIN_PREPARE)
    return BeginPrepare(
        prepare_lsn=prepare_lsn,
        end_lsn=end_lsn,
        prepare_time=prepare_time,
        xid=xid,
        gid=reader.cstring(),
    )


def _prepare(reader: Reader, in_stream: bool) -> Prepare:
    flags, prepare_lsn, end_lsn, prepare_time, xid = reader.unpack(_PREPARE)
    _check_flags(flags, 0, 1, "Prepare flags 0")
    return Prepare(
        prepare_lsn=prepare_lsn,
        end_lsn=end_lsn,
        prepare_time=prepare_time,
        xid=xid,
        gid=reader.cstring(),
    )


def _commit_prepared(reader: Reader, in_stream: bool) -> CommitPrepared:
    flags, commit_lsn, end_lsn, commit_time, xid = reader.unpack(_PREPARE)
    _check_flags(flags, 0, 1, "Commit Prepared flags 0")
    return CommitPrepared(
        commit_lsn=commit_lsn,
        end_lsn=end_lsn,
        commit_time=commit_time,
        xid=xid,
        gid=reader.cstring(),
    )


def _rollback_prepared(reader: Reader, in_stream: bool) -> RollbackPrepared:
    flags, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid = reader.unpack(
        _ROLLBACK_PREPARED
    )
    _check_flags(flags, 0, 1, "Rollback Prepared flags 0")
    return RollbackPrepared(
        prepare_end_lsn=prepare_end_lsn,
        rollback_end_lsn=rollback_end_lsn,
        prepare_time=prepare_time,
        rollback_time=rollback_time,
        xid=xid,
        gid=reader.cstring(),
    )


def _stream_prepare(reader: Reader, in_stream: bool) -> StreamPrepare:
    flags, prepare_lsn, end_lsn, prepare_time, xid = reader.unpack(_PREPARE)
    _check_flags(flags, 0, 1, "Stream Prepare flags 0")
    return StreamPrepare(
        prepare_lsn=prepare_lsn,
        end_lsn=end_lsn,
        prepare_time=prepare_time,
        xid=xid,
        gid=reader.cstring(),
    )


_DECODERS: dict[int, Callable[[Reader, bool], Message]] = {
    BEGIN: _begin,
    COMMIT: _commit,
    ORIGIN: _origin,
    RELATION: _relation,
    TYPE: _type,
    INSERT: _insert,
    UPDATE: _update,
    DELETE: _delete,
    TRUNCATE: _truncate,
    LOGICAL_MESSAGE: _logical_message,
    STREAM_START: _stream_start,
    STREAM_STOP: _stream_stop,
    STREAM_COMMIT: _stream_commit,
    STREAM_ABORT: _stream_abort,
    BEGIN_PREPARE: _begin_prepare,
    PREPARE: _prepare,
    COMMIT_PREPARED: _commit_prepared,
    ROLLBACK_PREPARED: _rollback_prepared,
    STREAM_PREPARE: _stream_prepare,
}
