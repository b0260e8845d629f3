"""The retry policy: which errors are retried, how the backoff grows and starts over."""

from __future__ import annotations

import logging
import random

import pytest

from runtime.errors import ConfigError, TransientError
from runtime.retry import Backoff, FailureRun, call_until_done, call_with_retry, run_with_retry


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


class Outage:
    """A step that fails transiently for ``seconds`` of a fake clock the sleeps move on,
    then succeeds; each failed call also takes ``attempt_s`` (a flush that timed out)."""

    def __init__(self, seconds: float, attempt_s: float = 5.0) -> None:
        self.seconds = seconds
        self.attempt_s = attempt_s
        self.now = 0.0
        self.calls = 0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> None:
        self.calls += 1
        if self.now < self.seconds:
            self.now += self.attempt_s
            raise TransientError(f"broker away ({self.calls})")


def until_done(step: Outage, **overrides: object) -> bool:
    options: dict[str, object] = {
        "what": "publishing",
        "should_stop": lambda: False,
        "sleep": step.sleep,
        "backoff": Backoff(initial_s=0.5, maximum_s=5.0),
        "rng": Ceiling(),
        "clock": step.clock,
    }
    options.update(overrides)
    return call_until_done(step, **options)  # type: ignore[arg-type]


def test_an_unbounded_step_outlasts_an_outage_of_any_length() -> None:
    step = Outage(seconds=3 * 3600)  # three hours: far past any attempt count
    failures: list[TransientError] = []
    assert until_done(step, on_failure=failures.append)
    assert step.calls == len(failures) + 1 > 1000
    assert max(step.sleeps) == 5.0, "the backoff is capped"
    assert step.sleeps[:4] == [0.5, 1.0, 2.0, 4.0]


def test_an_unbounded_step_logs_when_failing_starts_then_once_a_minute_then_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    step = Outage(seconds=300)  # 5 min: attempts every 5 s + up to 5 s of backoff
    with caplog.at_level(logging.INFO, logger="runtime.retry"):
        assert until_done(step, log_every_s=60.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert step.calls > 30
    assert 5 <= len(warnings) <= 6, [r.getMessage() for r in warnings]
    assert "attempt 1, failing for 0s" in warnings[0].getMessage()
    assert "retrying until it succeeds" in warnings[1].getMessage()
    assert caplog.records[-1].levelno == logging.INFO
    assert f"succeeded after {step.calls - 1} failed attempts" in caplog.records[-1].getMessage()


def test_a_stop_ends_an_unbounded_step_without_raising() -> None:
    step = Outage(seconds=3600)
    assert not until_done(step, should_stop=lambda: step.calls >= 3)
    assert step.calls == 3


def test_a_stop_during_the_backoff_is_not_followed_by_another_attempt() -> None:
    step = Outage(seconds=3600)
    stopped = False

    def sleep(seconds: float) -> None:
        nonlocal stopped
        stopped = True  # as Event.wait returns early when the stop is set

    assert not until_done(step, should_stop=lambda: stopped, sleep=sleep)
    assert step.calls == 1


def test_an_unbounded_step_does_not_retry_other_errors() -> None:
    def broken() -> None:
        raise ConfigError("the control topic does not exist")

    with pytest.raises(ConfigError):
        call_until_done(broken, what="publishing", should_stop=lambda: False, sleep=lambda _: None)


def test_a_run_of_failures_logs_its_first_and_then_one_per_interval() -> None:
    run = FailureRun(started=0.0, log_every_s=60.0)
    logged = [t for t in (0.0, 10.0, 59.0, 60.0, 61.0, 119.0, 125.0) if run.failed(t)]
    assert logged == [0.0, 60.0, 125.0]
    assert run.attempts == 7


def test_the_backoff_holds_its_ceiling_past_where_the_power_overflows() -> None:
    assert Backoff(initial_s=0.5, maximum_s=30.0).delay(5000, Ceiling()) == 30.0
