"""Smoke: a real Kafka broker round trip with confluent-kafka (idempotent, acks=all)."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.plugins.services import Services


def test_produce_idempotent_and_consume_back(services: Services, unique_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap_servers})
    admin.create_topics([NewTopic(unique_name, 2, 1)])[unique_name].result(30)

    producer = Producer(
        {
            "bootstrap.servers": services.kafka_bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
        }
    )
    delivered: list[tuple[int | None, int | None]] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset()))

    sent = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(50)}
    for key, value in sent.items():
        producer.produce(unique_name, value, key, headers={"lsn": b"0/1"}, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert len(delivered) == 50
    assert {p for p, _ in delivered} <= {0, 1}

    consumer = Consumer(
        {
            "bootstrap.servers": services.kafka_bootstrap_servers,
            "group.id": unique_name,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([unique_name])
    received: dict[bytes, bytes] = {}
    try:
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is None:
                if len(received) == len(sent):
                    break
                continue
            assert msg.error() is None, msg.error()
            assert msg.headers() == [("lsn", b"0/1")]
            got_key, got_value = msg.key(), msg.value()
            assert got_key is not None
            assert got_value is not None
            received[got_key] = got_value
    finally:
        consumer.close()
    assert received == sent
