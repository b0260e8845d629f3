"""On the real broker: capture's partitions are librdkafka's, and a snapshot batch or a
burst of streamed transactions, produced with delivery reports for the first and last
record of each partition's run only, is booked whole and lands in its keys' partitions
in order, or, when a record of a run is lost, not booked at all."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from capture.change_stream import OutgoingRecord
from capture.errors import TransientError
from capture.partitioning import key_partitions
from capture.progress import ProgressBook
from capture.publisher import ChangePublisher, Topics, producer_conf
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


def test_a_snapshot_batch_is_booked_whole_from_two_reports_per_partition(
    services: Services, unique_name: str
) -> None:
    settings = _settings(services, unique_name)
    topic = f"{unique_name}.public.accounts"
    book = ProgressBook(Lsn(16))
    topics = Topics(settings)
    publisher = ChangePublisher(settings, book, topics, start=Lsn(16))
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


def test_a_record_lost_inside_a_run_fails_the_publisher_and_books_nothing(
    services: Services, unique_name: str
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
    publisher = ChangePublisher(settings, book, Topics(settings), start=Lsn(16))
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


def _landed(
    bootstrap: str, group: str, topics: list[str], records: int
) -> dict[tuple[str, int], list[bytes]]:
    """The keys in each partition of ``topics``, in offset order, once ``records`` are read."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    landed: dict[tuple[str, int], list[bytes]] = {}
    try:
        consumer.assign([TopicPartition(t, p, 0) for t in topics for p in range(PARTITIONS)])
        read = 0
        while read < records:
            messages = consumer.consume(1000, timeout=10)
            assert messages, f"the topics hold {read} records, fewer than {records}"
            for message in messages:
                assert message.error() is None, message.error()
                topic, partition, key = message.topic(), message.partition(), message.key()
                assert topic is not None
                assert partition is not None
                assert key is not None
                landed.setdefault((topic, partition), []).append(key)
                read += 1
    finally:
        consumer.close()
    return landed


def test_a_burst_of_streamed_transactions_goes_out_in_runs_and_confirms_one_by_one(
    services: Services, unique_name: str
) -> None:
    """60 transactions of 7 records over two topics, published and then sent as one
    burst: each record lands in its key's partition in publish order, and applying every
    partition up to a transaction's last record confirms exactly that transaction."""
    settings = _settings(services, unique_name)
    topics = [f"{unique_name}.public.a", f"{unique_name}.public.b"]
    book = ProgressBook(Lsn(16))
    publisher = ChangePublisher(settings, book, Topics(settings), start=Lsn(16))
    generator = random.Random(11)
    published: list[tuple[str, bytes, int]] = []  # topic, key, transaction
    ends: list[Lsn] = []
    for transaction in range(60):
        commit = Lsn(1000 + 100 * transaction)
        book.begin(commit)
        for _ in range(7):
            topic, key = generator.choice(topics), generator.randbytes(8)
            publisher.publish(OutgoingRecord(topic, key, b"v", [("pgdelta.op", b"c")], "t"))
            published.append((topic, key, transaction))
        ends.append(Lsn(commit + 50))
        book.commit(ends[-1])
    assert book.in_flight_records == 420, "booked when published"
    publisher.flush()
    assert book.confirmable == 16, "delivered, not applied"

    partitions = {
        topic: key_partitions([k for t, k, _ in published if t == topic], PARTITIONS)
        for topic in topics
    }
    expected: dict[tuple[str, int], list[bytes]] = {}
    owners: dict[tuple[str, int], list[int]] = {}
    seen = dict.fromkeys(topics, 0)
    for topic, key, transaction in published:
        partition = partitions[topic][seen[topic]]
        seen[topic] += 1
        expected.setdefault((topic, partition), []).append(key)
        owners.setdefault((topic, partition), []).append(transaction)
    assert _landed(services.kafka_bootstrap_servers, unique_name, topics, 420) == expected

    for last in (0, 29, 58, 59):
        for (topic, partition), transactions in owners.items():
            book.applied(topic, partition, sum(1 for t in transactions if t <= last))
        assert book.confirmable == ends[last]
    assert (book.in_flight_records, book.in_flight_bytes) == (0, 0)


def test_a_record_lost_inside_a_streamed_run_fails_the_publisher_and_confirms_nothing(
    services: Services, unique_name: str
) -> None:
    """As for a snapshot batch, with a run that spans three transactions: the refused
    record in the middle fails the run, so none of the three is ever confirmed (the
    restart streams them again from the slot)."""
    topic = f"{unique_name}.public.accounts"
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "1000"})])[
        topic
    ].result(30)
    settings = _settings(services, unique_name).model_copy(
        update={"producer": {"batch.size": "300", "linger.ms": "0", "compression.type": "none"}}
    )
    book = ProgressBook(Lsn(16))
    publisher = ChangePublisher(settings, book, Topics(settings), start=Lsn(16))
    values = [b"x" * 100, random.Random(3).randbytes(3000), b"y" * 100]
    for number, (key, value) in enumerate(zip([b"a", b"b", b"c"], values, strict=True)):
        book.begin(Lsn(100 * (number + 1)))
        publisher.publish(OutgoingRecord(topic, key, value, [("pgdelta.op", b"c")], "t"))
        book.commit(Lsn(100 * (number + 1) + 50))
    with pytest.raises(TransientError, match=r"3 records .* across 2 offsets \(0 to 1\)"):
        publisher.flush()
    book.applied(topic, 0, 2)
    assert book.confirmable == 16, "no transaction of the broken run is confirmed"
    assert book.in_flight_records == 3
