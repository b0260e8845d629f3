"""The one retry policy: exponential backoff with full jitter for transient failures.

Only :class:`~runtime.errors.TransientError` is retried; anything else goes up at once.
Three shapes share the policy:

- :func:`run_with_retry` runs a whole service until it stops. Each capture retry starts
  from scratch (new connections, streaming from the slot's confirmed LSN), which is safe
  because nothing past an applied transaction was ever confirmed.
- :func:`call_with_retry` retries one step a bounded number of times and then lets the
  last failure go up (an apply micro-batch, a control-topic publish): the step is
  idempotent, and after the last attempt the caller's own recovery takes over (Spark
  restarts the query from its checkpoint).
- :func:`call_until_done` retries one step without an attempt limit, until it succeeds
  or the caller stops (apply's control-topic publish): for a step whose failure no
  restart would heal and whose giving up would lose what it carries. Each failure is
  reported to the caller (readiness), but logged only when a run of failures starts and
  then once per ``log_every_s`` (:class:`FailureRun`), so an outage of hours writes a
  line a minute, not one per attempt.

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
        """Full jitter: uniform in [0, min(max, initial * multiplier**attempt)].

        A retry without an attempt limit reaches the attempt (about the thousandth,
        hours into an outage) where the float power overflows: the ceiling holds."""
        try:
            grown = self.initial_s * self.multiplier**attempt
        except OverflowError:
            grown = self.maximum_s
        ceiling = min(self.maximum_s, grown)
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


@dataclass(slots=True)
class FailureRun:
    """A run of failed attempts of one step, and which of them to log: the first, then
    at most one per ``log_every_s``."""

    started: float
    log_every_s: float
    attempts: int = 0
    _last_logged: float | None = None

    def failed(self, now: float) -> bool:
        """Count one failed attempt at ``now``; whether to log it."""
        self.attempts += 1
        if self._last_logged is None or now - self._last_logged >= self.log_every_s:
            self._last_logged = now
            return True
        return False


def call_until_done(
    step: Callable[[], None],
    *,
    what: str,
    should_stop: Callable[[], bool],
    on_failure: Callable[[TransientError], None] = lambda _: None,
    sleep: Callable[[float], object] = time.sleep,
    backoff: Backoff = Backoff(),
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
    log_every_s: float = 60.0,
) -> bool:
    """Call ``step`` until it returns (True), retrying :class:`TransientError` with no
    attempt limit; False when ``should_stop`` turned true first (checked after each
    failure and after each backoff sleep, so ``sleep`` may be an event's ``wait`` that
    the stop cuts short). ``on_failure`` hears every failure, logged or not."""
    rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
    run: FailureRun | None = None
    while True:
        try:
            step()
        except TransientError as exc:
            now = clock()
            if run is None:
                run = FailureRun(started=now, log_every_s=log_every_s)
            on_failure(exc)
            delay = backoff.delay(run.attempts, rng)
            if run.failed(now):
                log.warning(
                    "%s failed, retrying until it succeeds (attempt %d, failing for %.0fs, "
                    "next in %.1fs): %s",
                    what,
                    run.attempts,
                    now - run.started,
                    delay,
                    exc,
                )
            if should_stop():
                break
            sleep(delay)
            if should_stop():
                break
        else:
            if run is not None:
                log.info(
                    "%s succeeded after %d failed attempts over %.0fs",
                    what,
                    run.attempts,
                    clock() - run.started,
                )
            return True
    log.warning("%s given up after %d failed attempts: stopping", what, run.attempts)
    return False
