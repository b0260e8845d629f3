"""The control-topic publish against an in-memory producer: it waits for the broker as
long as it takes, re-sends only what the broker lost, reports every failed attempt (the
job's readiness) and lets a stop end the wait (apply/control/feedback.py, the publish contract)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError

import apply.control.feedback
from apply.control.feedback import Outbox, ProgressPublisher
from apply.errors import ConfigError, TransientError
from apply.settings import KafkaSettings
from runtime.telemetry import Health
from schemas.control import AppliedProgress, ApplyTableStatus
from schemas.lsn import Lsn

TOPIC = "cdc._control"


def progress(partition: int, next_offset: int) -> AppliedProgress:
    return AppliedProgress(
        "cdc.public.t", partition, next_offset, Lsn(0x100), 3, "public.t", Lsn(0x100), 1
    )


class Delivered:
    """What a delivery callback receives as its message: only ``key()`` is read."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def key(self) -> bytes:
        return self._key


@dataclass
class Broker:
    """The broker as the fake producer sees it: away for the next ``away_flushes``
    flushes (nothing acknowledged), and failing the delivery of the keys in ``lose``
    once each (librdkafka giving a message up after ``message.timeout.ms``)."""

    away_flushes: int = 0
    lose: set[bytes] = field(default_factory=set)
    topics: set[str] = field(default_factory=lambda: {TOPIC})
    log: list[bytes] = field(default_factory=list)
    """Every key produced, in order: what went on the wire, duplicates included."""
    acknowledged: list[bytes] = field(default_factory=list)


class FakeProducer:
    """confluent_kafka.Producer as the publisher uses it, over a :class:`Broker`."""

    broker = Broker()

    def __init__(self, conf: dict[str, Any], **_callbacks: Any) -> None:
        self._queue: list[tuple[bytes, Callable[[KafkaError | None, Delivered], None]]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        found = type("Topic", (), {"error": None})() if topic in self.broker.topics else None
        return type("Metadata", (), {"topics": {topic: found} if found else {}})()

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        self.broker.log.append(key)
        self._queue.append((key, on_delivery))

    def flush(self, timeout: float) -> int:
        if self.broker.away_flushes > 0:
            self.broker.away_flushes -= 1
            return len(self._queue)
        queue, self._queue = self._queue, []
        for key, report in queue:
            if key in self.broker.lose:
                self.broker.lose.discard(key)
                report(KafkaError(KafkaError._MSG_TIMED_OUT), Delivered(key))
            else:
                self.broker.acknowledged.append(key)
                report(None, Delivered(key))
        return 0

    def poll(self, timeout: float) -> int:
        return 0

    def purge(self) -> None:
        self._queue.clear()

    def close(self) -> None:
        self._queue.clear()


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Broker:
    state = Broker()
    monkeypatch.setattr(FakeProducer, "broker", state)
    monkeypatch.setattr(apply.control.feedback, "Producer", FakeProducer)
    return state


def publisher() -> ProgressPublisher:
    return ProgressPublisher(KafkaSettings(control_topic=TOPIC))


def test_the_outbox_keeps_the_newest_message_of_each_key_where_it_last_came() -> None:
    outbox = Outbox([progress(0, 5), progress(1, 7), progress(0, 9)])
    assert outbox.due() == [progress(1, 7), progress(0, 9)]
    assert outbox.undelivered == 2


def test_a_lost_delivery_makes_its_message_due_again_and_an_acknowledged_one_leaves() -> None:
    first, second = progress(0, 5), progress(1, 7)
    outbox = Outbox([first, second])
    for message in outbox.due():
        outbox.sent(message)
    assert outbox.due() == []
    outbox.report(first.key(), "Local: Message timed out")
    outbox.report(second.key(), None)
    assert outbox.due() == [first]
    assert outbox.undelivered == 1
    assert outbox.last_error == "Local: Message timed out"


def test_a_publish_waits_out_a_broker_outage_without_an_attempt_limit(broker: Broker) -> None:
    broker.away_flushes = 50  # far more attempts than the three that once failed the job
    failures: list[TransientError] = []
    messages = [progress(0, 5), progress(1, 7)]
    assert publisher().publish(messages, sleep=lambda _: None, on_failure=failures.append)
    assert len(failures) == 50
    assert "2 control messages not yet acknowledged" in str(failures[0])
    # Queued once: librdkafka re-sends a queued message itself, nothing is produced twice.
    assert broker.log == [m.key() for m in messages]
    assert broker.acknowledged == broker.log


def test_only_the_messages_the_producer_gave_up_on_are_produced_again(broker: Broker) -> None:
    lost, kept = progress(0, 5), progress(1, 7)
    broker.lose = {lost.key()}
    failures: list[TransientError] = []
    status = ApplyTableStatus("public.t", errored=True, parked=3, error="bad", updated_at=1)
    assert publisher().publish(
        [lost, kept, status], sleep=lambda _: None, on_failure=failures.append
    )
    assert broker.log == [lost.key(), kept.key(), status.key(), lost.key()]
    assert sorted(broker.acknowledged) == sorted([lost.key(), kept.key(), status.key()])
    assert len(failures) == 1
    assert "Message timed out" in str(failures[0])


def test_a_stop_ends_the_wait_without_an_error(broker: Broker) -> None:
    broker.away_flushes = 1_000_000
    attempts: list[TransientError] = []
    done = publisher().publish(
        [progress(0, 5)],
        should_stop=lambda: len(attempts) >= 3,
        sleep=lambda _: None,
        on_failure=attempts.append,
    )
    assert done is False
    assert len(attempts) == 3


def test_a_missing_control_topic_is_raised_at_once(broker: Broker) -> None:
    broker.topics = set()
    with pytest.raises(ConfigError, match="does not exist"):
        publisher().publish([progress(0, 5)], sleep=lambda _: pytest.fail("retried"))


def test_nothing_to_publish_touches_nothing(broker: Broker) -> None:
    broker.topics = set()  # not even the metadata is read
    assert publisher().publish([])
    assert broker.log == []


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_job_is_not_ready_while_a_publish_fails_past_the_grace_and_ready_after(
    broker: Broker,
) -> None:
    """The wiring of apply/app.py: each failed attempt is a transient failure of the
    job's health; a batch whose publish got through marks it connected again."""
    clock = Clock()
    health = Health(not_ready_after_s=30.0, clock=clock)
    health.connected()
    seen: list[str | None] = []

    def failed(exc: TransientError) -> None:
        health.transient_failure(f"publishing applied progress: {exc}")
        seen.append(health.readiness())

    def sleep(seconds: float) -> None:
        clock.now += 10.0  # each attempt and its backoff: ten seconds of outage

    broker.away_flushes = 6
    assert publisher().publish([progress(0, 5)], sleep=sleep, on_failure=failed)
    assert seen[:4] == [None, None, None, None], "ready within the grace (a broker restart)"
    assert seen[4] is not None
    assert seen[4].startswith("retrying a transient failure for 40s: publishing applied")
    health.connected()
    assert health.readiness() is None
