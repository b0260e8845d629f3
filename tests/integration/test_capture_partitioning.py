"""On the real broker: capture's partitions are librdkafka's, and a snapshot batch,
produced with delivery reports for the first and last record of each partition's run
only, is booked whole and lands in its keys' partitions in order, or, when a record of
a run is lost, not booked at all."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from capture.errors import TransientError
from capture.in_flight import ProgressBook
from capture.publish.partitioning import key_partitions
from capture.publish.publisher import ChangePublisher, Topics, producer_conf
from capture.settings import KafkaSettings
from schemas.lsn import Lsn
from tests.plugins.services import Services

PARTITIONS = 5


def _settings(services: Services, name: str) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=services.kafka_bootstrap_servers,
        topic_prefix=name,
        control_topic=f"{name}._control",
        schema_topic=f"{name}._schemas",
        partitions=PARTITIONS,
    )


def test_capture_computes_the_partition_librdkafkas_partitioner_chooses(
    services: Services, unique_name: str
) -> None:
    """Records produced with no partition, by capture's producer settings: the
    partition each delivery reports is the one capture computes for its key."""
    settings = _settings(services, unique_name)
    topic = f"{unique_name}.keys"
    Topics(settings).ensure(topic)
    generator = random.Random(7)
    keys = [generator.randbytes(generator.randrange(1, 30)) for _ in range(1000)]
    chosen: dict[bytes, int] = {}

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        key, partition = msg.key(), msg.partition()
        assert key is not None
        assert partition is not None
        chosen[key] = partition

    producer = Producer(producer_conf(settings))
    for key in keys:
        producer.produce(topic, b"v", key, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert len(chosen) == len(set(keys))
    assert key_partitions(keys, PARTITIONS) == [chosen[key] for key in keys]
    assert len(set(chosen.values())) == PARTITIONS, "the keys spread over every partition"


COMPILED = pytest.mark.parametrize(
    "compiled", [True, False], ids=["compiled producer", "confluent-kafka producer"]
)


@COMPILED
def test_a_snapshot_batch_is_booked_whole_from_two_reports_per_partition(
    services: Services, unique_name: str, compiled: bool
) -> None:
    settings = _settings(services, unique_name)
    topic = f"{unique_name}.public.accounts"
    book = ProgressBook(Lsn(16))
    topics = Topics(settings)
    publisher = ChangePublisher(settings, book, topics, start=Lsn(16), compiled=compiled)
    pin = book.pin()
    headers = [("pgdelta.op", b"r")]
    batches = [[f"k{b}-{i}".encode() for i in range(n)] for b, n in enumerate((500, 1, 37))]
    for keys in batches:
        values = [b"value of " + key for key in keys]
        publisher.publish_batch(topic, "public.accounts", headers, keys, values, pin=pin)
    book.seal(pin)
    publisher.flush()
    produced = sum(len(keys) for keys in batches)
    assert (book.in_flight_records, book.in_flight_bytes) == (0, 0), "all delivered"
    assert book.pinned, "delivered, not applied yet"

    consumer = Consumer(
        {
            "bootstrap.servers": services.kafka_bootstrap_servers,
            "group.id": unique_name,
            "enable.auto.commit": False,
        }
    )
    ends: dict[int, int] = {}
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        for partition in range(PARTITIONS):
            watermarks = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10
            )
            assert watermarks is not None
            ends[partition] = watermarks[1]
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        while sum(len(keys) for keys in by_partition.values()) < produced:
            messages = consumer.consume(1000, timeout=10)
            assert messages, "the topic holds fewer records than were produced"
            for message in messages:
                assert message.error() is None, message.error()
                key, landed = message.key(), message.partition()
                assert key is not None
                assert landed is not None
                by_partition[landed].append(key)
    finally:
        consumer.close()
    every_key = [key for keys in batches for key in keys]
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for key, partition in zip(every_key, key_partitions(every_key, PARTITIONS), strict=True):
        expected[partition].append(key)
    assert by_partition == expected, "each key in its partition, in produce order"

    # Applying a partition up to all but its last record keeps the pin; applying all of
    # them releases it.
    for partition in range(PARTITIONS):
        book.applied(topic, partition, ends[partition] - 1)
    assert book.pinned
    for partition in range(PARTITIONS):
        book.applied(topic, partition, ends[partition])
    assert not book.pinned


@COMPILED
def test_a_record_lost_inside_a_run_fails_the_publisher_and_books_nothing(
    services: Services, unique_name: str, compiled: bool
) -> None:
    """The broker refuses the middle record of a run (larger than the topic allows) and
    the producer writes the last one after it: the last record's report alone would
    vouch for a record that is not in the log. The run's two offsets show the gap."""
    topic = f"{unique_name}.public.accounts"
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "1000"})])[
        topic
    ].result(30)
    # One record per request, uncompressed, so the big record fails on its own.
    settings = _settings(services, unique_name).model_copy(
        update={"producer": {"batch.size": "300", "linger.ms": "0", "compression.type": "none"}}
    )
    book = ProgressBook(Lsn(16))
    publisher = ChangePublisher(settings, book, Topics(settings), start=Lsn(16), compiled=compiled)
    pin = book.pin()
    values = [b"x" * 100, random.Random(3).randbytes(3000), b"y" * 100]
    publisher.publish_batch(
        topic, "public.accounts", [("pgdelta.op", b"r")], [b"a", b"b", b"c"], values, pin=pin
    )
    with pytest.raises(TransientError, match=r"3 records .* across 2 offsets \(0 to 1\)"):
        publisher.flush()
    book.seal(pin)
    book.applied(topic, 0, 2)
    assert book.in_flight_records == 3, "nothing of the run was booked as delivered"
    assert book.pinned, "the slot keeps waiting for the snapshot"


def test_the_first_records_to_a_new_topic_all_land_in_order(
    services: Services, unique_name: str
) -> None:
    """A new producer's first batches to just-created topics, sent pipelined
    (``linger.ms`` 0, a record a millisecond): every delivery report has an offset, and
    every record is in the log in the order produced. Without :class:`Topics` waiting
    for the leaders, a quarter of new topics here refused their first batch (the leader
    not ready yet) and accepted a later one, and librdkafka reported the refused ones
    delivered without an offset, "implicitly acked by subsequent batch success"."""
    # librdkafka's per-message debug log slows its broker thread enough that a first
    # batch goes out while the leader is still coming up: without the wait, 3 runs of 4
    # failed with it and none without it.
    conf = {"linger.ms": 0, "debug": "msg"}
    settings = _settings(services, unique_name).model_copy(update={"producer": conf})
    records = 30
    sent: dict[str, list[bytes]] = {}
    without_offset: list[tuple[str, bytes]] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        offset, topic, value = msg.offset(), msg.topic(), msg.value()
        assert topic is not None
        assert value is not None
        if offset is None or offset < 0:
            without_offset.append((topic, value))

    for round_ in range(16):
        topics = Topics(settings)
        producer = Producer(producer_conf(settings))
        names = [f"{unique_name}.r{round_}t{index}" for index in range(3)]
        for name in names:
            topics.ensure(name)
            sent[name] = []
        for index in range(records):
            for name in names:
                payload = str(index).encode()
                producer.produce(name, payload, b"key", PARTITIONS - 1, on_delivery=delivered)
                sent[name].append(payload)
            producer.poll(0.001)
        assert producer.flush(30) == 0
    assert without_offset == []
    consumer = Consumer(
        {"bootstrap.servers": services.kafka_bootstrap_servers, "group.id": unique_name}
    )
    try:
        consumer.assign([TopicPartition(name, PARTITIONS - 1, 0) for name in sent])
        held: dict[str, list[bytes]] = {name: [] for name in sent}
        while sum(map(len, held.values())) < len(sent) * records:
            message = consumer.poll(10)
            assert message is not None, {name: len(values) for name, values in held.items()}
            assert message.error() is None, message.error()
            topic, value = message.topic(), message.value()
            assert topic is not None
            assert value is not None
            held[topic].append(value)
        assert held == sent
    finally:
        consumer.close()
