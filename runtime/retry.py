"""The one retry policy: exponential backoff with full jitter for transient failures.

Only :class:`~runtime.errors.TransientError` is retried; anything else goes up at once.
Two shapes share the policy:

- :func:`run_with_retry` runs a whole service until it stops. Each capture retry starts
  from scratch (new connections, streaming from the slot's confirmed LSN), which is safe
  because nothing past an applied transaction was ever confirmed.
- :func:`call_with_retry` retries one step a bounded number of times and then lets the
  last failure go up (an apply micro-batch, a control-topic publish): the step is
  idempotent, and after the last attempt the caller's own recovery takes over (Spark
  restarts the query from its checkpoint).

The backoff grows while attempts keep failing and starts over after a run that streamed
for a while (``healthy_s``) before it failed: an outage hours after the last one is
retried within a second, not after the 30 s ceiling the last outage climbed to.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from runtime.errors import TransientError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 0.5
    maximum_s: float = 30.0
    multiplier: float = 2.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max, initial * multiplier**attempt)]."""
        ceiling = min(self.maximum_s, self.initial_s * self.multiplier**attempt)
        return rng.uniform(0, ceiling)


def run_with_retry(
    run: Callable[[], None],
    *,
    should_stop: Callable[[], bool],
    sleep: Callable[[float], None],
    backoff: Backoff = Backoff(),
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
    healthy_s: float = 60.0,
) -> None:
    """Call ``run`` until it returns, retrying transient failures; a run that lasted
    ``healthy_s`` before failing starts the backoff over, so it is not punished for an
    old failure."""
    rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
    attempt = 0
    while not should_stop():
        started = clock()
        try:
            run()
        except TransientError as exc:
            if clock() - started >= healthy_s:
                attempt = 0
            delay = backoff.delay(attempt, rng)
            log.warning("transient failure, retrying in %.1fs: %s", delay, exc)
            attempt += 1
            sleep(delay)
        else:
            return


def call_with_retry(
    step: Callable[[], T],
    *,
    what: str,
    attempts: int,
    sleep: Callable[[float], None] = time.sleep,
    backoff: Backoff = Backoff(),
    rng: random.Random | None = None,
) -> T:
    """Return ``step()``, calling it up to ``attempts`` times while it raises
    :class:`TransientError`; the last failure is raised as it is."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
    for attempt in range(attempts - 1):
        try:
            return step()
        except TransientError as exc:
            delay = backoff.delay(attempt, rng)
            log.warning(
                "%s failed, retrying in %.1fs (attempt %d of %d): %s",
                what,
                delay,
                attempt + 1,
                attempts,
                exc,
            )
            sleep(delay)
    return step()
