"""Waiting in a test until something is true, with one poll and one failure message.

The integration and e2e tests mostly wait: for a slot to stream, a snapshot to finish, a
record to reach Kafka, a process to come back. Every such wait is :func:`wait_for` with
its own bound and a message saying what never happened. (The launcher's own wait for a
service to start is :func:`deploy.local.process.wait_until`, which reads the service's
log on failure; a test that wants a log tail passes ``detail``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.2
"""Between two looks at the awaited condition: short next to the seconds a test waits."""


def wait_for(
    predicate: Callable[[], object],
    what: str,
    timeout_s: float,
    *,
    detail: Callable[[], str] | None = None,
) -> None:
    """Return once ``predicate()`` is true; fail the test if it is still false after
    ``timeout_s``, with ``what`` and, when given, ``detail()`` (read at that moment, e.g.
    a log's tail)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout_s:g} s: {what}"
            if detail is not None:
                message += f"\n{detail()}"
            raise AssertionError(message)
        time.sleep(POLL_S)
