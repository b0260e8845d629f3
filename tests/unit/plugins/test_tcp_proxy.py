"""The test proxy over loopback sockets: forwarding, a reset cut, a blackhole cut, restore,
and a Kafka topic's writes held and released."""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from tests.plugins.tcp_proxy import Cut, TcpProxy

WAIT_S = 10.0


class EchoServer:
    """Echoes every byte back; counts the connections it accepted."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", echo.port) as built:
        yield built


def connect(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S)


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def readable(sock: socket.socket, timeout_s: float) -> bool:
    ready, _, _ = select.select([sock], [], [], timeout_s)
    return bool(ready)


def closed_by_peer(sock: socket.socket) -> bool:
    """True when the peer closed or reset the connection (EOF or ECONNRESET)."""
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def turned_away(proxy: TcpProxy) -> bool:
    """True when a new connection is reset or closed, during the connect or right after."""
    try:
        sock = connect(proxy)
    except ConnectionResetError:
        return True
    with sock:
        return closed_by_peer(sock)


def test_forwards_both_ways(proxy: TcpProxy) -> None:
    payload = bytes(range(256)) * 1024
    with connect(proxy) as sock:
        sock.sendall(payload)
        assert receive(sock, len(payload)) == payload
    assert proxy.accepted == proxy.forwarded == 1


def test_a_reset_cut_closes_open_connections_and_resets_new_ones(proxy: TcpProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"ping")
        assert receive(sock, 4) == b"ping"
        proxy.cut(Cut.RESET)
        assert closed_by_peer(sock)
    assert turned_away(proxy)
    assert proxy.open_connections == 0
    assert (proxy.accepted, proxy.forwarded) == (2, 1)
    proxy.restore()
    with connect(proxy) as sock:
        sock.sendall(b"again")
        assert receive(sock, 5) == b"again"


def test_a_blackhole_holds_bytes_until_the_restore(proxy: TcpProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"before")
        assert receive(sock, 6) == b"before"
        proxy.cut(Cut.BLACKHOLE)
        sock.sendall(b"during")
        # Nothing comes back while cut: the echo never saw the bytes.
        assert not readable(sock, 0.5)
        assert proxy.open_connections == 1
        proxy.restore()
        assert receive(sock, 6) == b"during"


def test_a_connection_made_in_a_blackhole_reaches_the_target_after_the_restore(
    proxy: TcpProxy, echo: EchoServer
) -> None:
    proxy.cut(Cut.BLACKHOLE)
    with connect(proxy) as sock:  # the handshake completes: the proxy accepts
        sock.sendall(b"hello")
        assert not readable(sock, 0.5)
        assert echo.accepted == 0
        proxy.restore()
        assert receive(sock, 5) == b"hello"
    assert echo.accepted == 1


def test_a_target_that_is_down_resets_the_client() -> None:
    # Bound but not listening: connects are refused, and the port cannot be drawn as an
    # ephemeral port (a freed one can, and Linux then connects the socket to itself).
    with socket.socket() as down:
        down.bind(("127.0.0.1", 0))
        with TcpProxy("127.0.0.1", down.getsockname()[1]) as proxy:
            assert turned_away(proxy)


def kafka_request(api_key: int, body: bytes, client_id: bytes = b"rdkafka") -> bytes:
    """A request as Kafka frames it: a 4-byte size, then the header (API key, version,
    correlation id, client id) and the rest."""
    header = struct.pack(">hhih", api_key, 9, 1, len(client_id)) + client_id
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


PRODUCE, FETCH = 0, 1


def test_held_writes_wait_in_order_and_other_requests_flow(echo: EchoServer) -> None:
    with TcpProxy("127.0.0.1", echo.port, kafka_frames=True) as proxy:
        control = kafka_request(PRODUCE, b"\x00\x07app._control records")
        read = kafka_request(FETCH, b"\x00\x07app._control from 5")
        other = kafka_request(PRODUCE, b"\x00\x05app.t records")
        proxy.hold_writes("app._control")
        with connect(proxy) as held, connect(proxy) as free:
            # A read of the topic, and a write of another, pass.
            held.sendall(read)
            assert receive(held, len(read)) == read
            free.sendall(other)
            assert receive(free, len(other)) == other
            # The write waits, and so does what its connection sends after it.
            held.sendall(control + read)
            assert not readable(held, 0.5)
            assert proxy.holding == 1
            free.sendall(other)
            assert receive(free, len(other)) == other
            proxy.release_writes()
            assert receive(held, len(control) + len(read)) == control + read
            assert proxy.holding == 0


def test_a_request_split_across_sends_is_judged_whole(echo: EchoServer) -> None:
    with TcpProxy("127.0.0.1", echo.port, kafka_frames=True) as proxy:
        request = kafka_request(PRODUCE, b"\x00\x07app._control " + bytes(100_000))
        proxy.hold_writes("app._control")
        with connect(proxy) as sock:
            for start in range(0, len(request), 7_000):
                sock.sendall(request[start : start + 7_000])
            assert not readable(sock, 0.5)
            assert proxy.holding == 1
            proxy.release_writes()
            assert receive(sock, len(request)) == request


def test_a_held_connection_that_closes_lets_go(echo: EchoServer) -> None:
    with TcpProxy("127.0.0.1", echo.port, kafka_frames=True) as proxy:
        proxy.hold_writes("app._control")
        with connect(proxy) as sock:
            sock.sendall(kafka_request(PRODUCE, b"app._control"))
            deadline = time.monotonic() + WAIT_S
            while proxy.holding == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert proxy.holding == 1
            proxy.cut(Cut.RESET)  # closes it, as a broker that went away does
            assert closed_by_peer(sock)
            deadline = time.monotonic() + WAIT_S
            while proxy.holding and time.monotonic() < deadline:
                time.sleep(0.01)
            assert proxy.holding == 0


def test_writes_are_held_only_by_a_kafka_proxy(proxy: TcpProxy) -> None:
    with pytest.raises(ValueError, match="kafka_frames=True"):
        proxy.hold_writes("app._control")


def test_writes_held_for_one_client_leave_another_clients_through(echo: EchoServer) -> None:
    with TcpProxy("127.0.0.1", echo.port, kafka_frames=True) as proxy:
        theirs = kafka_request(PRODUCE, b"app._control", client_id=b"capture")
        mine = kafka_request(PRODUCE, b"app._control", client_id=b"apply")
        proxy.hold_writes("app._control", client_id="apply")
        with connect(proxy) as capture, connect(proxy) as apply:
            capture.sendall(theirs)
            assert receive(capture, len(theirs)) == theirs
            apply.sendall(mine)
            assert not readable(apply, 0.5)
            proxy.release_writes()
            assert receive(apply, len(mine)) == mine
