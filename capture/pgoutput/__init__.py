"""Pure decoder for PostgreSQL's pgoutput logical replication messages.

``decode(buf, in_stream=...)`` turns one message into a frozen dataclass; nothing here
touches a socket. :class:`StreamBlocks` decodes a stream in order, knowing which messages
sit inside a stream block (and so carry an xid). Formats:
https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from capture.pgoutput.decode import decode
from capture.pgoutput.messages import (
    PG_EPOCH_UNIX_MICROS,
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
    pg_micros_to_datetime,
    pg_micros_to_unix_micros,
    unix_micros_to_pg_micros,
)
from capture.pgoutput.reader import MalformedMessageError, Reader
from capture.pgoutput.stream_block import StreamBlocks, StreamOrderError, split_stream_xid

__all__ = [
    "PG_EPOCH_UNIX_MICROS",
    "Begin",
    "BeginPrepare",
    "ColumnKind",
    "Commit",
    "CommitPrepared",
    "Delete",
    "Insert",
    "LogicalMessage",
    "MalformedMessageError",
    "Message",
    "Origin",
    "Prepare",
    "Reader",
    "Relation",
    "RelationColumn",
    "ReplicaIdentity",
    "RollbackPrepared",
    "StreamAbort",
    "StreamBlocks",
    "StreamCommit",
    "StreamOrderError",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TruncateOptions",
    "TupleData",
    "Type",
    "Update",
    "decode",
    "pg_micros_to_datetime",
    "pg_micros_to_unix_micros",
    "split_stream_xid",
    "unix_micros_to_pg_micros",
]
