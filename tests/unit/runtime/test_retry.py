"""The retry policy: which errors are retried, how the backoff grows and starts over."""

from __future__ import annotations

import random

import pytest

from runtime.errors import ConfigError, TransientError
from runtime.retry import Backoff, call_with_retry, run_with_retry


class Script:
    """A fake service: each run lasts the next duration on a fake clock, then fails
    transiently, until the durations run out and it returns."""

    def __init__(self, durations: list[float]) -> None:
        self.durations = durations
        self.now = 0.0
        self.sleeps: list[float] = []
        self.runs = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def run(self) -> None:
        self.runs += 1
        if self.runs > len(self.durations):
            return
        self.now += self.durations[self.runs - 1]
        raise TransientError("connection reset")


class Ceiling(random.Random):
    """Jitter that always draws the ceiling, so the delays show the backoff itself."""

    def uniform(self, a: float, b: float) -> float:
        return b


def retry(script: Script, healthy_s: float = 60.0) -> None:
    run_with_retry(
        script.run,
        should_stop=lambda: False,
        sleep=script.sleep,
        backoff=Backoff(initial_s=0.5, maximum_s=30.0),
        rng=Ceiling(),
        clock=script.clock,
        healthy_s=healthy_s,
    )


def test_the_backoff_doubles_up_to_its_ceiling() -> None:
    script = Script([0.1] * 8)
    retry(script)
    assert script.sleeps == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert script.runs == 9


def test_a_run_that_streamed_for_a_while_starts_the_backoff_over() -> None:
    # Three quick failures (an outage), an hour of streaming, then a new outage.
    script = Script([0.1, 0.1, 0.1, 3600.0, 0.1])
    retry(script)
    assert script.sleeps == [0.5, 1.0, 2.0, 0.5, 1.0]


def test_only_transient_errors_are_retried() -> None:
    def broken() -> None:
        raise ConfigError("no table can be captured")

    with pytest.raises(ConfigError):
        run_with_retry(broken, should_stop=lambda: False, sleep=lambda _s: None)


def test_a_stop_ends_the_retries() -> None:
    script = Script([0.1] * 100)
    run_with_retry(
        script.run, should_stop=lambda: script.runs >= 3, sleep=script.sleep, rng=Ceiling()
    )
    assert script.runs == 3


class Flaky:
    """A step that fails transiently ``failures`` times, then returns its call count."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise TransientError(f"failure {self.calls}")
        return self.calls


def test_a_bounded_step_returns_once_it_succeeds_within_its_attempts() -> None:
    sleeps: list[float] = []
    step = Flaky(failures=2)
    result = call_with_retry(
        step, what="step", attempts=3, sleep=sleeps.append, rng=random.Random(1)
    )
    assert result == 3
    assert len(sleeps) == 2
    assert all(0 <= s <= Backoff().maximum_s for s in sleeps)


def test_a_bounded_step_raises_its_last_failure_after_its_attempts() -> None:
    sleeps: list[float] = []
    step = Flaky(failures=5)
    with pytest.raises(TransientError, match="failure 3"):
        call_with_retry(step, what="step", attempts=3, sleep=sleeps.append)
    assert step.calls == 3
    assert len(sleeps) == 2, "no sleep after the last attempt"


def test_a_bounded_step_does_not_retry_other_errors() -> None:
    calls = 0

    def broken() -> None:
        nonlocal calls
        calls += 1
        raise ConfigError("wrong")

    with pytest.raises(ConfigError):
        call_with_retry(broken, what="step", attempts=3, sleep=lambda _: None)
    assert calls == 1


def test_a_bounded_step_needs_at_least_one_attempt() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        call_with_retry(Flaky(0), what="step", attempts=0)
