"""The pgoutput logical replication messages, as immutable values.

One frozen dataclass per message of
https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html;
:func:`capture.pgoutput.decode` builds them from bytes. Field names follow the
PostgreSQL documentation.

Invariants:

- LSNs are :data:`schemas.lsn.Lsn`; xids and OIDs are unsigned 32-bit ints.
- Timestamps stay as the wire's int64 microseconds since the PostgreSQL epoch
  (2000-01-01 00:00:00 UTC); :func:`pg_micros_to_datetime` and
  :func:`pg_micros_to_unix_micros` convert them when a consumer needs to.
- ``xid`` on Relation, Type, Insert, Update, Delete, Truncate and LogicalMessage is
  ``None`` outside a streamed transaction: the server sends it only between
  StreamStart and StreamStop (protocol version 2 and later). There it is the xid of
  the (sub)transaction that made the change, so after a SAVEPOINT it differs from
  StreamStart's top-level xid; StreamAbort names the subtransaction to drop.
- Column values stay the bytes the server sent. Turning text into Python values needs
  the column's type from the Relation message, which is the caller's business.
- Strings (names, prefixes, gids) are decoded from UTF-8; an empty namespace on the
  wire means ``pg_catalog`` and is reported as such.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias, TypeVar

from schemas.lsn import Lsn

BEGIN = ord("B")
COMMIT = ord("C")
ORIGIN = ord("O")
RELATION = ord("R")
TYPE = ord("Y")
INSERT = ord("I")
UPDATE = ord("U")
DELETE = ord("D")
TRUNCATE = ord("T")
LOGICAL_MESSAGE = ord("M")
STREAM_START = ord("S")
STREAM_STOP = ord("E")
STREAM_COMMIT = ord("c")
STREAM_ABORT = ord("A")
BEGIN_PREPARE = ord("b")
PREPARE = ord("P")
COMMIT_PREPARED = ord("K")
ROLLBACK_PREPARED = ord("r")
STREAM_PREPARE = ord("p")

# Submessage markers inside Insert, Update and Delete.
NEW_TUPLE = ord("N")
OLD_KEY = ord("K")
OLD_TUPLE = ord("O")

# 2000-01-01 00:00:00 UTC in microseconds since the Unix epoch.
PG_EPOCH_UNIX_MICROS = 946_684_800_000_000
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


_Frozen = TypeVar("_Frozen")


def frozen_constructor(cls: type[_Frozen]) -> Callable[..., _Frozen]:
    """A positional constructor of the frozen slots dataclass ``cls``, for hot paths.

    The ``__init__`` that ``dataclass(frozen=True)`` writes must set every field through
    ``object.__setattr__``, which costs about twice as much as storing it through the
    field's slot descriptor, as this constructor does; for the few objects made per row
    change that was a tenth of decoding and encoding it. The object is the same: same
    class, same fields, frozen afterwards. Like ``dataclass`` itself, the function is
    generated from the field names.
    """
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} is not a dataclass without __post_init__")
    names = [f.name for f in dataclasses.fields(cls)]
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    scope.update({f"_set_{name}": vars(cls)[name].__set__ for name in names})
    body = "".join(f"    _set_{name}(obj, {name})\n" for name in names)
    source = f"def build({', '.join(names)}):\n    obj = _new(_cls)\n{body}    return obj\n"
    exec(source, scope)  # noqa: S102 -- field names of our own dataclass, as dataclass does
    build: Callable[..., _Frozen] = scope["build"]
    return build


def pg_micros_to_unix_micros(pg_micros: int) -> int:
    """Convert a wire timestamp to microseconds since 1970-01-01 UTC."""
    return pg_micros + PG_EPOCH_UNIX_MICROS


def unix_micros_to_pg_micros(unix_micros: int) -> int:
    """Convert microseconds since 1970-01-01 UTC to a wire timestamp."""
    return unix_micros - PG_EPOCH_UNIX_MICROS


def pg_micros_to_datetime(pg_micros: int) -> datetime:
    """Convert a wire timestamp to an aware UTC ``datetime``.

    Raises ``OverflowError`` for values beyond ``datetime``'s range (years 1..9999),
    which commit and prepare timestamps never reach.
    """
    return _PG_EPOCH + timedelta(microseconds=pg_micros)


class ReplicaIdentity(enum.Enum):
    """``pg_class.relreplident``: which old values Update and Delete carry."""

    DEFAULT = "d"  # primary key columns
    NOTHING = "n"  # no old values at all
    FULL = "f"  # every column
    INDEX = "i"  # the columns of a chosen unique index


class ColumnKind(enum.Enum):
    """How one column of a tuple is sent."""

    NULL = "n"
    UNCHANGED_TOAST = "u"  # TOASTed on disk and not modified; the value is not sent
    TEXT = "t"  # the type's text output
    BINARY = "b"  # the type's send function output (``binary 'true'``)


class TruncateOptions(enum.Flag):
    """Options of a TRUNCATE statement; ``TruncateOptions(0)`` when none was given."""

    CASCADE = 1
    RESTART_IDENTITY = 2


@dataclass(frozen=True, slots=True)
class TupleData:
    """Column values of one row, in the column order of the Relation message.

    ``kinds[i]`` says how column ``i`` was sent; ``values[i]`` holds its bytes for
    ``TEXT`` and ``BINARY`` and is ``None`` for ``NULL`` and ``UNCHANGED_TOAST``. Two
    parallel tuples rather than one object per column keep decoding cheap.
    """

    kinds: tuple[ColumnKind, ...]
    values: tuple[bytes | None, ...]

    def __len__(self) -> int:
        return len(self.kinds)


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: Lsn
    commit_time: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int


@dataclass(frozen=True, slots=True)
class Origin:
    """The transaction was replayed from another node; several may precede a change."""

    commit_lsn: Lsn
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    is_key: bool
    name: str
    type_oid: int
    type_modifier: int


@dataclass(frozen=True, slots=True)
class Relation:
    """Schema of a table, sent before its first change and again after each DDL.

    Generated and dropped columns are not listed, and tuple data skips them too.
    """

    xid: int | None
    oid: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    """Name of a non-built-in type used by a following Relation message."""

    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    xid: int | None
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    """An updated row.

    At most one of ``key`` and ``old`` is set. ``key`` ('K') carries the old replica
    identity columns (the others are ``NULL``) and is sent only when a key column
    changed; ``old`` ('O') carries the whole old row under REPLICA IDENTITY FULL.
    Neither is sent under REPLICA IDENTITY DEFAULT or INDEX when no key column changed.
    """

    xid: int | None
    relation_oid: int
    key: TupleData | None
    old: TupleData | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    """A deleted row: exactly one of ``key`` ('K') and ``old`` ('O') is set."""

    xid: int | None
    relation_oid: int
    key: TupleData | None
    old: TupleData | None


@dataclass(frozen=True, slots=True)
class Truncate:
    xid: int | None
    options: TruncateOptions
    relation_oids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LogicalMessage:
    """A ``pg_logical_emit_message`` call; non-transactional ones arrive outside Begin."""

    xid: int | None
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """A streamed (sub)transaction was rolled back; drop what it streamed.

    ``subxid == xid`` when the whole transaction aborted. ``abort_lsn`` and
    ``abort_time`` are sent only with protocol version 4 and ``streaming 'parallel'``.
    """

    xid: int
    subxid: int
    abort_lsn: Lsn | None
    abort_time: int | None


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    prepare_end_lsn: Lsn
    rollback_end_lsn: Lsn
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    prepare_lsn: Lsn
    end_lsn: Lsn
    prepare_time: int
    xid: int
    gid: str


Message: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)
