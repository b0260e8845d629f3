"""On the real broker: the compiled producer (capture/publish/native_producer.py) writes what
confluent-kafka's would -- keys, values, headers, partitions -- reports where each
record went, and reports failures, a full queue, a refused property and an unreachable
broker as confluent-kafka's producer does."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from capture.publish import native_producer
from capture.publish.native_producer import Delivery, NativeProducer
from tests.plugins.services import Services

pytestmark = pytest.mark.skipif(
    native_producer.library() is None, reason="capture_native is not built here"
)


def _topic(services: Services, name: str, partitions: int, **config: str) -> str:
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(30)
    return name


def _read(
    services: Services, topic: str, partitions: int, count: int
) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    """(partition, offset, key, value, headers) of the topic's first ``count`` records."""
    consumer = Consumer({"bootstrap.servers": services.kafka_bootstrap_servers, "group.id": topic})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    read: list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = []
    try:
        while len(read) < count:
            messages = consumer.consume(count - len(read), timeout=10)
            assert messages, f"the topic holds {len(read)} records, {count} expected"
            for m in messages:
                assert m.error() is None, m.error()
                partition, offset = m.partition(), m.offset()
                assert partition is not None
                assert offset is not None
                headers = m.headers() or []
                assert isinstance(headers, list)
                pairs = [(name, value) for name, value in headers if not isinstance(value, str)]
                read.append((partition, offset, m.key(), m.value(), pairs))
    finally:
        consumer.close()
    return sorted(read)


def _producer(services: Services, conf: dict[str, str] | None = None) -> NativeProducer:
    return NativeProducer(
        {
            "bootstrap.servers": services.kafka_bootstrap_servers,
            "enable.idempotence": True,
            **(conf or {}),
        },
        error_cb=lambda _error: None,
    )


def test_records_and_reports_are_what_was_produced(services: Services, unique_name: str) -> None:
    topic = _topic(services, f"{unique_name}.t", 3)
    producer = _producer(services)
    reports: list[tuple[str, KafkaError | None, str | None, int | None, int | None]] = []

    def report(name: str) -> native_producer.Report:
        def delivered(err: KafkaError | None, msg: Delivery) -> None:
            reports.append((name, err, msg.topic(), msg.partition(), msg.offset()))

        return delivered

    headers: list[tuple[str, str | bytes | None]] = [("a", b"1"), ("b", "two"), ("c", None)]
    producer.produce(topic, b"v1", b"k1", 2, headers=headers, on_delivery=report("first"))
    producer.produce(topic, None, b"k2", 2, headers=[("op", b"d")])  # a tombstone, no report
    keys = [b"x", b"y", b"z"]
    producer.produce_batch(
        topic, [1, 1, 1], keys, [b"1", b"2", b"3"], [("h", b"v")], {0: report("x"), 2: report("z")}
    )
    assert producer.flush(30) == 0
    assert producer.unreported_failure is None
    assert sorted(reports, key=lambda r: r[0]) == [
        ("first", None, topic, 2, 0),
        ("x", None, topic, 1, 0),
        ("z", None, topic, 1, 2),
    ]
    assert _read(services, topic, 3, 5) == [
        (1, 0, b"x", b"1", [("h", b"v")]),
        (1, 1, b"y", b"2", [("h", b"v")]),
        (1, 2, b"z", b"3", [("h", b"v")]),
        (2, 0, b"k1", b"v1", [("a", b"1"), ("b", b"two"), ("c", None)]),
        (2, 1, b"k2", None, [("op", b"d")]),
    ]


def test_a_refused_record_without_a_report_is_still_seen(
    services: Services, unique_name: str
) -> None:
    """The broker refuses a record larger than the topic allows. It asked for no report,
    yet its failure is kept, naming the topic, so the publisher stops."""
    topic = _topic(services, f"{unique_name}.t", 1, **{"max.message.bytes": "1000"})
    # One record per request, uncompressed, so the big record fails on its own.
    producer = _producer(
        services, {"batch.size": "300", "linger.ms": "0", "compression.type": "none"}
    )
    failures: list[KafkaError | None] = []
    producer.produce(topic, b"x" * 3000, b"big")
    producer.produce(topic, b"small", b"ok", on_delivery=lambda err, _msg: failures.append(err))
    producer.flush(30)
    assert len(failures) == 1
    assert failures[0] is None, "the next record is written"
    assert producer.unreported_failure is not None
    assert f"delivery to {topic} [0] failed" in producer.unreported_failure


def test_a_full_queue_raises_buffer_error(services: Services, unique_name: str) -> None:
    topic = _topic(services, f"{unique_name}.t", 1)
    producer = _producer(services, {"queue.buffering.max.messages": "2", "linger.ms": "1000"})
    producer.produce(topic, b"1", b"a")
    producer.produce(topic, b"2", b"b")
    with pytest.raises(BufferError, match="Queue full"):
        producer.produce(topic, b"3", b"c")
    # A batch waits for room instead, serving reports: every record gets written.
    producer.produce_batch(topic, [0] * 5, [b"k"] * 5, [b"v"] * 5, [], {})
    assert producer.flush(30) == 0
    assert len(_read(services, topic, 1, 7)) == 7


def test_a_refused_property_raises_as_confluent_kafka_does(services: Services) -> None:
    with pytest.raises(KafkaException, match=r"batch\.num\.messages"):
        _producer(services, {"batch.num.messages": "not a number"})
    with pytest.raises(KafkaException, match=r"No such configuration property.*no\.such"):
        _producer(services, {"no.such.property": "1"})


def test_an_unreachable_broker_reaches_the_error_callback() -> None:
    errors: list[KafkaError] = []
    producer = NativeProducer(
        {"bootstrap.servers": "127.0.0.1:1", "reconnect.backoff.ms": "10"}, error_cb=errors.append
    )
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors, "no client error within 20 s"
    assert {e.code() for e in errors} & {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
    assert all("127.0.0.1:1" in e.str() or "brokers are down" in e.str() for e in errors)
