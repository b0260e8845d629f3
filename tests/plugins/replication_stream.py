"""Reading a START_REPLICATION stream in tests, frame by frame, without capture's loop.

The tests that check what the server sends (the smoke test, the type round trip, the
per-version differences) read the raw CopyData frames themselves, waiting on the socket
between them, so what they assert is the server's stream and not capture's handling.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

import psycopg

from capture.stream.copy_data import XLogData, parse_copy_data


def read_payloads(
    repl: psycopg.Connection[Any], enough: Callable[[list[bytes]], bool], timeout_s: float
) -> list[bytes]:
    """The XLogData payloads (pgoutput messages) that arrive until ``enough`` of them did
    or ``timeout_s`` passed; the caller asserts what it needed."""
    pgconn = repl.pgconn
    payloads: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while not enough(payloads) and time.monotonic() < deadline:
        size, data = pgconn.get_copy_data(1)
        if size == 0:
            select.select([pgconn.socket], [], [], 0.2)
            pgconn.consume_input()
            continue
        assert size > 0, "replication stream ended early"
        frame = parse_copy_data(bytes(data))
        if isinstance(frame, XLogData):
            payloads.append(bytes(frame.payload))
    return payloads
