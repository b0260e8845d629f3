"""How capture's connections to the source notice a dead network.

A connection whose peer vanished without closing it (a cable pulled, a firewall that
drops instead of rejecting, a VM frozen) would otherwise wait for the kernel's default
TCP timeouts: hours for an idle socket, about 15 minutes for unacknowledged writes,
forever for a connect whose startup goes unanswered. Meanwhile capture publishes nothing
and the lag grows with no error to see. So every connection capture opens asks the
kernel to probe and give up within about half a minute: libpq's ``keepalives*``,
``tcp_user_timeout`` and ``connect_timeout`` parameters
(https://www.postgresql.org/docs/current/libpq-connect.html). The end of the
connection is then a :class:`~capture.errors.TransientError` like any other, and the
retry reconnects from the slot's confirmed LSN.

A DSN that sets any of these parameters itself keeps its own value; the defaults fill
in only what it leaves out. They do nothing for a Unix-domain socket.
"""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict, make_conninfo

DEAD_PEER_DEFAULTS: dict[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    # Unacknowledged data (a status update, a query) gives up after 30 s.
    "tcp_user_timeout": "30000",
    # A connect whose server never answers (SYNs lost, a startup packet unanswered).
    "connect_timeout": "30",
}


def with_dead_peer_detection(dsn: str) -> str:
    """``dsn`` with :data:`DEAD_PEER_DEFAULTS` for whatever it does not set."""
    given = conninfo_to_dict(dsn)
    missing = {k: v for k, v in DEAD_PEER_DEFAULTS.items() if k not in given}
    return make_conninfo(dsn, **missing) if missing else dsn
