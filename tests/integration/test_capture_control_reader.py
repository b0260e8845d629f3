"""On the real broker: the control reader replaces a consumer that has been silent, and
the new one goes on exactly where the old one was (capture/publish/publisher.py,
``ControlReader``). A consumer that stops fetching after a broker restart is a
librdkafka bug that cannot be triggered on demand, so the silence here is a quiet topic:
what is checked is the replacement, not its trigger."""

from __future__ import annotations

import time

from confluent_kafka import Producer

from capture.in_flight import ProgressBook
from capture.publish.control import ControlReader
from capture.publish.publisher import Topics
from schemas.control import AppliedProgress, ServerIdentity, SlotCheckpoint
from schemas.lsn import Lsn
from tests.plugins.capture import capture_settings
from tests.plugins.services import Services


class _Recording(ProgressBook):
    """A book that also keeps every applied offset it is told of, in order."""

    def __init__(self) -> None:
        super().__init__(Lsn(0))
        self.told: list[tuple[str, int, int]] = []

    def applied(self, topic: str, partition: int, next_offset: int) -> None:
        self.told.append((topic, partition, next_offset))
        super().applied(topic, partition, next_offset)


def _publish(bootstrap: str, topic: str, next_offset: int) -> None:
    message = AppliedProgress("cdc.public.t", 0, next_offset, None, None, "public.t", None, None)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, message.value(), message.key())
    assert producer.flush(30) == 0


def _poll_until(reader: ControlReader, book: _Recording, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(book.told) < count:
        assert time.monotonic() < deadline, book.told
        reader.poll(book)
        time.sleep(0.05)


def test_a_silent_consumer_is_replaced_where_it_was(services: Services, unique_name: str) -> None:
    settings = capture_settings(services, unique_name, [])
    topic = settings.kafka.control_topic
    reader = ControlReader(settings.kafka, Topics(settings.kafka), silence_s=1.0)
    try:
        _publish(services.kafka_bootstrap_servers, topic, 5)
        state = reader.load(unique_name)
        assert state.applied == {("cdc.public.t", 0): 5}
        book = _Recording()
        _publish(services.kafka_bootstrap_servers, topic, 7)
        _poll_until(reader, book, 1)
        reopened = reader.reopened

        # Silence: nothing arrives for longer than the interval.
        deadline = time.monotonic() + 10
        while reader.reopened == reopened:
            assert time.monotonic() < deadline, "the silent consumer was never replaced"
            reader.poll(book)
            time.sleep(0.1)

        _publish(services.kafka_bootstrap_servers, topic, 9)
        _poll_until(reader, book, 2)
        time.sleep(0.5)
        reader.poll(book)
        # The new consumer started after the last message read: nothing read again.
        assert book.told == [("cdc.public.t", 0, 7), ("cdc.public.t", 0, 9)]
    finally:
        reader.close()


def test_load_returns_the_checkpoints_server_and_the_newest_applied_positions(
    services: Services, unique_name: str
) -> None:
    settings = capture_settings(services, unique_name, [])
    topic = settings.kafka.control_topic
    reader = ControlReader(settings.kafka, Topics(settings.kafka))
    try:
        producer = Producer({"bootstrap.servers": services.kafka_bootstrap_servers})
        older = SlotCheckpoint(unique_name, Lsn(0x10))  # as a version before the server
        newer = SlotCheckpoint(unique_name, Lsn(0x20), ServerIdentity(7_301_234_567, 2))
        other_slot = SlotCheckpoint("another_slot", Lsn(0x99), ServerIdentity(1, 1))
        for message in (
            older,
            newer,
            other_slot,
            AppliedProgress("cdc.public.t", 0, 5, Lsn(0x18), 1, "public.t", Lsn(0x18), 1),
            AppliedProgress("cdc.public.t", 1, 3, Lsn(0x30), 0, "public.t", Lsn(0x30), 1),
            AppliedProgress("other.public.t", 0, 3, Lsn(0x90), 0, "public.t", Lsn(0x90), 1),
        ):
            producer.produce(topic, message.value(), message.key())
        assert producer.flush(30) == 0

        state = reader.load(unique_name)
        assert state.checkpoint == Lsn(0x20)
        assert state.server == ServerIdentity(7_301_234_567, 2)
        assert state.newest_position("cdc") == Lsn(0x30)
    finally:
        reader.close()
