"""The replication connection: the only code that reads the PostgreSQL socket.

``START_REPLICATION SLOT .. LOGICAL <lsn> (proto_version '1', publication_names ..)`` on
a ``replication="database"`` connection turns it into a COPY_BOTH stream
(https://www.postgresql.org/docs/current/protocol-replication.html). Frames are read
without blocking (``get_copy_data(async_=1)`` and ``select`` on the socket) so the loop
can also serve Kafka callbacks, the control topic and status updates while the server
is quiet, and so a blocking read never holds the GIL.

Protocol version 1 is requested on purpose: without ``streaming``, the server sends a
transaction only once it has committed, in commit order, so every change we publish is
committed and its commit LSN is known from Begin before the first change arrives. Large
transactions are spilled to disk by the server, not held by us.

The session settings of the connection fix the text form of values (ISO dates, UTC,
hex bytea...), because pgoutput renders columns with the walsender session's output
functions; :data:`capture.typemap.SESSION_SETTINGS` lists them.
"""

from __future__ import annotations

import select
from collections.abc import Mapping

import psycopg
from psycopg import sql

from capture.errors import ConfigError, TransientError
from capture.replication_protocol import (
    PrimaryKeepalive,
    XLogData,
    encode_status_update,
    parse_copy_data,
    pg_now_micros,
)
from capture.typemap import libpq_options
from schemas.lsn import Lsn, format_lsn

Frame = XLogData | PrimaryKeepalive


class ReplicationStream:
    """One START_REPLICATION stream of a logical slot."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        self._conn = conn
        self._pgconn = conn.pgconn

    @classmethod
    def start(
        cls,
        dsn: str,
        *,
        password: str | None,
        slot: str,
        publication: str,
        start_lsn: Lsn,
        settings: Mapping[str, str],
    ) -> ReplicationStream:
        try:
            conn = psycopg.connect(
                dsn,
                password=password,
                autocommit=True,
                replication="database",
                options=libpq_options(settings),
            )
        except psycopg.OperationalError as exc:
            raise TransientError(f"cannot open the replication connection: {exc}") from exc
        command = sql.SQL(
            "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {})"
        ).format(sql.Identifier(slot), sql.SQL(format_lsn(start_lsn)), sql.Literal(publication))
        try:
            conn.execute(command)
        except psycopg.errors.ObjectInUse as exc:
            conn.close()
            raise TransientError(
                f"replication slot {slot} is in use by another process; "
                "two captures must never share a slot"
            ) from exc
        except psycopg.errors.UndefinedObject as exc:
            conn.close()
            raise ConfigError(f"cannot stream slot {slot}: {exc.diag.message_primary}") from exc
        except psycopg.OperationalError as exc:
            conn.close()
            raise TransientError(f"START_REPLICATION failed: {exc}") from exc
        return cls(conn)

    def read(self, timeout_s: float) -> Frame | None:
        """The next frame, or None if none arrived within ``timeout_s``."""
        try:
            size, data = self._pgconn.get_copy_data(1)
            if size == 0:
                ready, _, _ = select.select([self._pgconn.socket], [], [], timeout_s)
                if not ready:
                    return None
                self._pgconn.consume_input()
                size, data = self._pgconn.get_copy_data(1)
                if size == 0:
                    return None
        except psycopg.OperationalError as exc:
            raise TransientError(f"replication stream broke: {exc}") from exc
        if size < 0:
            raise TransientError("the server ended the replication stream")
        return parse_copy_data(data)

    def send_status(self, flushed: Lsn, *, reply_requested: bool = False) -> None:
        """Standby status update: written and flushed both report ``flushed``, the LSN
        whose data is safe in the lake; nothing beyond it is acknowledged."""
        message = encode_status_update(flushed, flushed, flushed, pg_now_micros(), reply_requested)
        try:
            self._pgconn.put_copy_data(message)
            self._pgconn.flush()
        except psycopg.OperationalError as exc:
            raise TransientError(f"cannot send a status update: {exc}") from exc

    def close(self) -> None:
        self._conn.close()
