"""A replication connection that goes silent is taken as dead, a quiet one is not.

Through a TCP proxy in front of the real PostgreSQL: while the network is fine, an idle
stream whose status updates ask for answers gets them and never trips the silence
timeout; once the proxy blackholes the connection (nothing closed, nothing forwarded,
what a dead network looks like), the stream ends with a TransientError within the
timeout, so the retry can reconnect.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from capture.errors import TransientError
from capture.rows.typemap import SESSION_SETTINGS
from capture.stream.replication import ReplicationStream
from schemas.lsn import Lsn
from tests.plugins.services import Services
from tests.plugins.tcp_proxy import Cut, TcpProxy

pytestmark = pytest.mark.slow

SILENCE_S = 3.0


@pytest.fixture
def proxy(services: Services) -> Iterator[TcpProxy]:
    params = conninfo_to_dict(services.postgres_dsn)
    with TcpProxy(str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))) as p:
        yield p


def _through(services: Services, proxy: TcpProxy) -> str:
    return make_conninfo(services.postgres_dsn, host="127.0.0.1", port=str(proxy.port))


def _stream_for(stream: ReplicationStream, seconds: float) -> None:
    """Read and send status updates the way capture does, for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stream.read(0.2)
        stream.send_status(Lsn(0))


def test_a_quiet_server_answers_and_a_silent_one_is_taken_as_dead(
    services: Services, proxy: TcpProxy, pgoutput_slot: str
) -> None:
    stream = ReplicationStream.start(
        _through(services, proxy),
        password=None,
        slot=pgoutput_slot,
        publication=pgoutput_slot,
        start_lsn=Lsn(0),
        settings=SESSION_SETTINGS,
        silence_timeout_s=SILENCE_S,
    )
    try:
        # Three silence timeouts of an idle database: the answers keep it alive.
        _stream_for(stream, 3 * SILENCE_S)
        proxy.cut(Cut.BLACKHOLE)
        with pytest.raises(TransientError, match="sent nothing"):
            _stream_for(stream, 10 * SILENCE_S)
    finally:
        proxy.restore()
        stream.close()
