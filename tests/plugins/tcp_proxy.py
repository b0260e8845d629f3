"""A TCP proxy the test controls, to cut a service off the network and let it back on.

The proxy listens on a free loopback port and forwards each connection to one target
``host:port``. :meth:`TcpProxy.cut` takes the network away in one of two ways:

- :attr:`Cut.RESET` -- every open connection is closed with a reset (``SO_LINGER`` 0),
  and each new connection is accepted and reset at once: what a peer that went away
  looks like (a restarted host, a firewall sending RSTs). Clients see an error now.
- :attr:`Cut.BLACKHOLE` -- nothing is closed and nothing more is forwarded, either way;
  new connections are accepted (the kernel completes the handshake) but never reach the
  target: what a dead network looks like. Clients see nothing at all, so only their own
  timeouts can notice.

:meth:`TcpProxy.restore` forwards again. Bytes a blackholed connection held are then
delivered in order, as TCP retransmission would after a partition heals, and connections
accepted during a blackhole are connected to the target then, as a connect whose SYN
retries outlasted the outage. Connections reset by a cut stay closed.

A proxy made with ``kafka_frames=True`` stands before a Kafka broker and can also refuse
one topic's writes while everything else flows: :meth:`TcpProxy.hold_writes` holds each
client connection at the first Produce request (API key 0) that names the topic (and, when
given, comes from one ``client.id``), and :meth:`TcpProxy.release_writes` lets it go on.
Requests are read whole (Kafka frames each as a 4-byte size and the body: the API key,
its version, a correlation id and the client id as a 2-byte length and its bytes), so a
hold starts at a request's boundary; the held request and whatever the client sends
after it on that connection wait, in order, while the broker's answers to earlier
requests still come back. To the client this is a broker that does not answer its
writes: what a partition whose leader is stuck looks like. Reads, metadata and other
topics' writes on other connections go on.

Invariant: while cut, no byte reaches the target or the client; the proxy never alters,
drops or reorders the bytes of a connection it keeps open.

One accept thread and, per connection, one thread per direction; each waits on the
proxy's ``flowing`` event, so a cut and a restore take effect within one poll interval
(:data:`_POLL_S`) without any lock held across I/O.
"""

from __future__ import annotations

import contextlib
import enum
import select
import socket
import struct
import threading
from dataclasses import dataclass, field
from types import TracebackType

_POLL_S = 0.05
_CHUNK = 64 * 1024
_KAFKA_SIZE = struct.Struct(">i")
_KAFKA_INT16 = struct.Struct(">h")
"""An API key, and a string's length."""
_KAFKA_PRODUCE = 0
_KAFKA_CLIENT_ID_AT = 12
"""Where a request's client id starts: after the size, API key, API version and
correlation id (request header versions 1 and 2, every Produce request's)."""


class Cut(enum.Enum):
    RESET = "reset"
    BLACKHOLE = "blackhole"


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN, so the peer gets ECONNRESET at once."""
    with contextlib.suppress(OSError):  # already closed
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _KafkaRequests:
    """Cuts a client's byte stream into whole Kafka requests (each a 4-byte size, then
    that many bytes)."""

    def __init__(self) -> None:
        self._pending = bytearray()

    def complete(self, data: bytes) -> list[bytes]:
        """The requests ``data`` completes, in order; the rest waits for more."""
        pending = self._pending
        pending += data
        done = []
        while len(pending) >= _KAFKA_SIZE.size:
            end = _KAFKA_SIZE.size + _KAFKA_SIZE.unpack_from(pending)[0]
            if len(pending) < end:
                break  # the rest of this request is still on its way
            done.append(bytes(pending[:end]))
            del pending[:end]
        return done


@dataclass(eq=False)
class _Connection:
    client: socket.socket
    upstream: socket.socket | None = None
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self, *, reset: bool) -> None:
        self.closed.set()
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            if reset:
                _reset(sock)
            else:
                sock.close()


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; see the module docstring."""

    def __init__(self, target_host: str, target_port: int, *, kafka_frames: bool = False) -> None:
        self._target = (target_host, target_port)
        self._kafka_frames = kafka_frames
        self._held_writes: tuple[bytes, bytes | None] | None = None
        self._holding = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_POLL_S)
        self._flowing = threading.Event()
        self._flowing.set()
        self._mode: Cut | None = None
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._accepted = 0
        self._forwarded = 0
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop, name="proxy-accept")
        self._acceptor.daemon = True
        self._acceptor.start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def accepted(self) -> int:
        """Connections accepted since the start, whatever became of them."""
        with self._lock:
            return self._accepted

    @property
    def forwarded(self) -> int:
        """Connections that reached the target since the start (none does while cut)."""
        with self._lock:
            return self._forwarded

    @property
    def open_connections(self) -> int:
        with self._lock:
            return sum(1 for c in self._connections if not c.closed.is_set())

    @property
    def cut_mode(self) -> Cut | None:
        return self._mode

    def cut(self, mode: Cut = Cut.RESET) -> None:
        """Take the network away (module docstring); a second cut may change the mode."""
        self._mode = mode
        self._flowing.clear()
        if mode is Cut.RESET:
            with self._lock:
                connections, self._connections = self._connections, set()
            for connection in connections:
                connection.close(reset=True)

    def restore(self) -> None:
        self._mode = None
        self._flowing.set()

    def hold_writes(self, topic: str, *, client_id: str | None = None) -> None:
        """Hold every connection at its first Produce request naming ``topic``, of
        ``client_id`` alone when given (module docstring); only for a proxy made with
        ``kafka_frames=True``."""
        if not self._kafka_frames:
            raise ValueError("hold_writes needs a proxy made with kafka_frames=True")
        self._held_writes = (topic.encode(), None if client_id is None else client_id.encode())

    def release_writes(self) -> None:
        """Let the held requests, and every later one, through."""
        self._held_writes = None

    @property
    def holding(self) -> int:
        """Connections waiting at a held Produce request now."""
        with self._lock:
            return self._holding

    def close(self) -> None:
        self._closing.set()
        self._flowing.set()  # wake every waiting thread so it sees the close
        self._acceptor.join(5)
        self._listener.close()
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            connection.close(reset=False)
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            with self._lock:
                self._accepted += 1
            if self._mode is Cut.RESET:
                _reset(client)
                continue
            connection = _Connection(client)
            with self._lock:
                self._connections.add(connection)
            self._spawn(self._connect, connection)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _wait_flowing(self, connection: _Connection) -> bool:
        """Block while the network is cut; False once the connection or proxy closed."""
        while not self._flowing.wait(_POLL_S):
            if connection.closed.is_set() or self._closing.is_set():
                return False
        return not (connection.closed.is_set() or self._closing.is_set())

    def _connect(self, connection: _Connection) -> None:
        if not self._wait_flowing(connection):
            return
        try:
            connection.upstream = socket.create_connection(self._target, timeout=10)
        except OSError:
            self._drop(connection, reset=True)  # the target is down: the client sees it
            return
        if connection.closed.is_set():  # reset by a cut while connecting
            connection.upstream.close()
            return
        connection.upstream.settimeout(None)
        with self._lock:
            self._forwarded += 1
        requests = _KafkaRequests() if self._kafka_frames else None
        self._spawn(self._pump, connection, connection.client, connection.upstream, requests)
        self._spawn(self._pump, connection, connection.upstream, connection.client)

    def _pump(
        self,
        connection: _Connection,
        source: socket.socket,
        sink: socket.socket,
        requests: _KafkaRequests | None = None,
    ) -> None:
        """Forward what ``source`` sends to ``sink`` while the connection flows. With
        ``requests`` (a client's Kafka requests), whole requests only, each waiting while
        :meth:`hold_writes` names it."""
        try:
            while self._wait_flowing(connection):
                ready, _, _ = select.select([source], [], [], _POLL_S)
                if not ready:
                    continue
                data = source.recv(_CHUNK)
                if not data:
                    break
                for piece in (data,) if requests is None else requests.complete(data):
                    if requests is not None and not self._wait_writable(connection, piece):
                        return
                    # Read before a cut, held until the restore: nothing crosses while cut.
                    if not self._wait_flowing(connection):
                        return
                    sink.sendall(piece)
        except (OSError, ValueError):
            pass  # closed under us by a cut or by the other direction
        self._drop(connection, reset=False)

    def _held(self, request: bytes) -> bool:
        held = self._held_writes
        if held is None or len(request) < _KAFKA_CLIENT_ID_AT + _KAFKA_INT16.size:
            return False
        topic, client_id = held
        if _KAFKA_INT16.unpack_from(request, _KAFKA_SIZE.size)[0] != _KAFKA_PRODUCE:
            return False
        if client_id is not None:
            length = _KAFKA_INT16.unpack_from(request, _KAFKA_CLIENT_ID_AT)[0]
            start = _KAFKA_CLIENT_ID_AT + _KAFKA_INT16.size
            if request[start : start + max(length, 0)] != client_id:
                return False
        return topic in request

    def _wait_writable(self, connection: _Connection, request: bytes) -> bool:
        """Block while ``request`` is a write :meth:`hold_writes` holds; False once the
        connection or proxy closed."""
        if not self._held(request):
            return True
        with self._lock:
            self._holding += 1
        try:
            while self._held(request):
                if connection.closed.wait(_POLL_S) or self._closing.is_set():
                    return False
            return True
        finally:
            with self._lock:
                self._holding -= 1

    def _drop(self, connection: _Connection, *, reset: bool) -> None:
        with self._lock:
            self._connections.discard(connection)
        if not connection.closed.is_set():
            connection.close(reset=reset)
