"""The replication connection: the only code that reads the PostgreSQL socket.

``START_REPLICATION SLOT .. LOGICAL <lsn> (proto_version '1', publication_names ..)`` on
a ``replication="database"`` connection turns it into a COPY_BOTH stream
(https://www.postgresql.org/docs/current/protocol-replication.html). Frames are read
without blocking (``get_copy_data(async_=1)`` and ``select`` on the socket) so the loop
can also serve Kafka callbacks, the control topic and status updates while the server
is quiet, and so a blocking read never holds the GIL.

By default protocol version 1 is requested: without ``streaming``, the server sends a
transaction only once it has committed, in commit order, so every change we publish is
committed and its commit LSN is known from Begin before the first change arrives. Large
transactions are spilled to disk by the server, not held by us. With ``streaming``
(``CAPTURE_STREAMING``) it is ``proto_version '2'`` and ``streaming 'on'``, which every
supported server (15 to 18) accepts: a transaction outgrowing the server's
``logical_decoding_work_mem`` then arrives in stream blocks while it runs, and capture
spools it until its Stream Commit (:mod:`capture.stream.in_progress`,
docs/streaming.md). Versions 3 and 4 add two-phase and parallel-apply messages capture
has no use for.

The session settings of the connection fix the text form of values (ISO dates, UTC,
hex bytea...), because pgoutput renders columns with the walsender session's output
functions; :data:`capture.rows.typemap.SESSION_SETTINGS` lists them.

**The server's shutdown.** A logical walsender told to stop (fast or smart shutdown)
exits only once its client has confirmed everything it sent (``WalSndDone`` in
walsender.c), and capture confirms only what the lake has applied: held open, the
stream would keep PostgreSQL from shutting down until apply caught up, forever while
apply is down. So the stream keeps a second, ordinary connection that sends nothing:
a fast shutdown ends ordinary sessions first (``57P01 terminating connection due to
administrator command``), which makes its socket readable, and the stream then ends
with a :class:`TransientError`. The retry closes the replication connection, the
walsender exits, the shutdown goes on, and capture reconnects (with backoff) once the
server is back, from the slot's confirmed LSN: nothing is lost.

**A silent server.** A dead network closes nothing: the socket just stays quiet, and a
quiet stream is also what an idle database looks like. So when nothing has arrived for
a third of ``silence_timeout_s``, status updates ask the server to answer
(``reply_requested``), which a live walsender does at once with a keepalive; if nothing
at all arrives within ``silence_timeout_s`` of the first unanswered request, the
connection is taken as dead (:class:`TransientError`) and the retry reconnects. The
kernel's own TCP timeouts (:mod:`capture.source.connection`) catch the same thing when
the peer is truly gone, but not when something in between still acknowledges the
packets (a proxy, a stuck load balancer).

**The server it reaches.** Given the server the attempt checked (``server``, see
:mod:`capture.source.server_identity`), the connection identifies itself
(``IDENTIFY_SYSTEM``) before it streams: a multi-host DSN may reach another server than
the checks did when a failover happens in between, and streaming from it unchecked could
skip changes. A different one ends the attempt (:class:`TransientError`), and the next
attempt checks whichever server it reaches from the start.
"""

from __future__ import annotations

import select
import time
from collections.abc import Mapping

import psycopg
from psycopg import sql

from capture.errors import ConfigError, TransientError
from capture.rows.typemap import libpq_options
from capture.source.server_identity import identify
from capture.stream.copy_data import (
    PrimaryKeepalive,
    XLogData,
    encode_status_update,
    parse_copy_data,
    pg_now_micros,
)
from schemas.control import ServerIdentity
from schemas.lsn import Lsn, format_lsn

Frame = XLogData | PrimaryKeepalive

_WATCH_EVERY_S = 1.0
"""How often the shutdown watch is looked at while frames keep arriving."""

DEFAULT_SILENCE_TIMEOUT_S = 60.0


class ServerShutdownWatch:
    """An idle ordinary connection whose only job is to notice the server going away."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        self._conn = conn
        self.socket = conn.pgconn.socket

    @classmethod
    def open(cls, dsn: str, *, password: str | None) -> ServerShutdownWatch:
        try:
            return cls(psycopg.connect(dsn, password=password, autocommit=True))
        except psycopg.OperationalError as exc:
            raise TransientError(f"cannot open the shutdown-watch connection: {exc}") from exc

    def server_going_away(self) -> bool:
        """Whether the server ended this idle session (its socket was readable)."""
        pgconn = self._conn.pgconn
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            return True
        return pgconn.status != psycopg.pq.ConnStatus.OK

    def close(self) -> None:
        self._conn.close()


def _check_reached(conn: psycopg.Connection[tuple[object, ...]], server: ServerIdentity) -> None:
    """Close ``conn`` and raise when it reached another server than ``server``."""
    try:
        reached = identify(conn).identity
    except psycopg.Error as exc:
        conn.close()
        raise TransientError(f"IDENTIFY_SYSTEM failed: {exc}") from exc
    except TransientError:
        conn.close()
        raise
    if reached != server:
        conn.close()
        raise TransientError(
            f"the replication connection reached another server (system identifier "
            f"{reached.system_identifier}, timeline {reached.timeline}) than the one the "
            f"slot was checked on ({server.system_identifier}, timeline {server.timeline}): "
            "a failover in between? Starting over"
        )


class ReplicationStream:
    """One START_REPLICATION stream of a logical slot, and the watch that ends it when
    the server shuts down (see the module docstring)."""

    def __init__(
        self,
        conn: psycopg.Connection[tuple[object, ...]],
        watch: ServerShutdownWatch,
        *,
        silence_timeout_s: float = DEFAULT_SILENCE_TIMEOUT_S,
    ) -> None:
        self._conn = conn
        self._pgconn = conn.pgconn
        self._watch = watch
        self._watched_at = time.monotonic()
        self._silence_timeout_s = silence_timeout_s
        self._heard_at = time.monotonic()
        self._asked_at: float | None = None

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
        silence_timeout_s: float = DEFAULT_SILENCE_TIMEOUT_S,
        server: ServerIdentity | None = None,
        streaming: bool = False,
    ) -> ReplicationStream:
        """``server``: the server the attempt's checks ran on; a connection that reaches
        another one is closed with a :class:`TransientError` (module docstring);
        ``streaming``: ask for transactions in progress (protocol version 2)."""
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
        if server is not None:
            _check_reached(conn, server)
        command = sql.SQL(
            "START_REPLICATION SLOT {} LOGICAL {} (proto_version {}, publication_names {}{})"
        ).format(
            sql.Identifier(slot),
            sql.SQL(format_lsn(start_lsn)),
            sql.Literal("2" if streaming else "1"),
            sql.Literal(publication),
            sql.SQL(", streaming 'on'") if streaming else sql.SQL(""),
        )
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
        try:
            watch = ServerShutdownWatch.open(dsn, password=password)
        except TransientError:
            conn.close()
            raise
        return cls(conn, watch, silence_timeout_s=silence_timeout_s)

    def read(self, timeout_s: float) -> Frame | None:
        """The next frame, or None if none arrived within ``timeout_s``.

        Raises :class:`TransientError` when the server is shutting down."""
        try:
            size, data = self._pgconn.get_copy_data(1)
        except psycopg.OperationalError as exc:
            raise TransientError(f"replication stream broke: {exc}") from exc
        if size == 0:
            if not self.wait(timeout_s):
                return None
            try:
                size, data = self._pgconn.get_copy_data(1)
            except psycopg.OperationalError as exc:
                raise TransientError(f"replication stream broke: {exc}") from exc
            if size == 0:
                self._check_silence()
                return None
        if size < 0:
            raise TransientError("the server ended the replication stream")
        self.heard()
        return parse_copy_data(data)

    @property
    def connection_pointer(self) -> int | None:
        """The libpq connection (``PGconn *``) the stream reads, for the compiled stream;
        None where psycopg does not say (its pure-Python implementation)."""
        pointer = getattr(self._pgconn, "pgconn_ptr", None)
        return pointer if isinstance(pointer, int) else None

    def wait(self, timeout_s: float) -> bool:
        """:meth:`read` for a reader of libpq's buffer (the compiled stream): wait up to
        ``timeout_s`` for the server, and True once what it sent is in the buffer."""
        try:
            ready, _, _ = select.select(
                [self._pgconn.socket, self._watch.socket], [], [], timeout_s
            )
            if self._watch.socket in ready:
                self._check_watch()
            if self._pgconn.socket not in ready:
                self._check_silence()
                return False
            self._pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise TransientError(f"replication stream broke: {exc}") from exc
        return True

    def heard(self) -> None:
        """A reader of libpq's buffer took frames: the server was heard (what
        :meth:`read` notes for each frame it returns)."""
        self._heard_at = time.monotonic()
        self._asked_at = None
        if self._heard_at - self._watched_at >= _WATCH_EVERY_S:
            ready, _, _ = select.select([self._watch.socket], [], [], 0)
            if ready:
                self._check_watch()
            self._watched_at = time.monotonic()

    def broken(self, ended: bool) -> TransientError:
        """The error for a stream a reader of libpq's buffer found ended (the server
        ended the COPY) or broken (libpq's error message says why)."""
        if ended:
            return TransientError("the server ended the replication stream")
        message = self._pgconn.get_error_message()
        return TransientError(f"replication stream broke: {message}")

    def read_buffered(self) -> Frame | None:
        """The next frame if it is already received (in libpq's buffer), else None,
        without waiting or a system call: the rest of a burst after :meth:`read`, which
        noted that the server was heard and checked the shutdown watch."""
        try:
            size, data = self._pgconn.get_copy_data(1)
        except psycopg.OperationalError as exc:
            raise TransientError(f"replication stream broke: {exc}") from exc
        if size == 0:
            return None
        if size < 0:
            raise TransientError("the server ended the replication stream")
        return parse_copy_data(data)

    def _check_silence(self) -> None:
        asked = self._asked_at
        if asked is not None and time.monotonic() - asked > self._silence_timeout_s:
            raise TransientError(
                f"the server sent nothing for {time.monotonic() - self._heard_at:.0f} s, "
                f"not even the answer asked for {time.monotonic() - asked:.0f} s ago: the "
                "network to it may be dead; reconnecting"
            )

    def _check_watch(self) -> None:
        if self._watch.server_going_away():
            raise TransientError(
                "the server is shutting down (it ended capture's idle session): closing the "
                "replication connection so the shutdown is not held up by the slot, and "
                "reconnecting once the server is back"
            )

    def send_status(self, flushed: Lsn, *, reply_requested: bool = False) -> None:
        """Standby status update: written and flushed both report ``flushed``, the LSN
        whose data is safe in the lake; nothing beyond it is acknowledged. After a third
        of the silence timeout without a frame, it asks the server to answer."""
        now = time.monotonic()
        if now - self._heard_at >= self._silence_timeout_s / 3:
            reply_requested = True
        if reply_requested and self._asked_at is None:
            self._asked_at = now
        message = encode_status_update(flushed, flushed, flushed, pg_now_micros(), reply_requested)
        try:
            self._pgconn.put_copy_data(message)
            self._pgconn.flush()
        except psycopg.OperationalError as exc:
            raise TransientError(f"cannot send a status update: {exc}") from exc

    def close(self) -> None:
        self._watch.close()
        self._conn.close()
