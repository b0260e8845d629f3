"""Reading change topics back in tests: consume, decode, replay, report as applied."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from schemas.control import AppliedProgress
from schemas.reader import ContractReader
from tests.plugins.waiting import wait_for

Tables = dict[str, dict[tuple[Any, ...], dict[str, Any]]]


def end_offsets(consumer: Consumer, topic: str, timeout_s: float = 30) -> dict[int, int]:
    """Each partition's end offset now; {} while the topic does not exist. A topic
    created a moment ago may have no partition leader yet, which passes: retried."""
    metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return {}
    ends: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    for partition in metadata.partitions:
        while True:
            try:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
            else:
                ends[partition] = int(high)
                break
    return ends


def record_count(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` now (the sum of its end offsets: capture's topics start empty
    and are never compacted); 0 while it does not exist."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{time.time()}"})
    try:
        return sum(end_offsets(consumer, topic).values())
    finally:
        consumer.close()


def consume_all(
    bootstrap: str, topics: list[str], expected: int, timeout_s: float = 60
) -> list[Any]:
    """Messages of ``topics`` from the beginning, until ``expected`` arrived or time ran out."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.time()}",
            "auto.offset.reset": "earliest",
            # A topic subscribed to before it exists (capture creates a table's topic with
            # its first record, which may come after this subscription on a busy machine)
            # is otherwise found only at the next metadata refresh, 5 minutes away.
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    consumer.subscribe(topics)
    messages: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            messages.append(msg)
    finally:
        consumer.close()
    return messages


def wait_for_topic(bootstrap: str, topic: str, timeout_s: float = 60) -> None:
    """Until the broker lists ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-probe"})
    try:
        wait_for(
            lambda: topic in consumer.list_topics(timeout=10).topics,
            f"topic {topic} never appeared",
            timeout_s,
        )
    finally:
        consumer.close()


def read_to_end(bootstrap: str, topic: str, timeout_s: float = 60) -> list[Any]:
    """Every message of ``topic`` up to the end it has now, per partition in offset order.
    Done is judged by the consumer's position, not the last message's offset, so a
    transaction marker or a compacted-away record at the end cannot stall the read."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"end-{time.time()}"})
    try:
        ends = end_offsets(consumer, topic)
        assert ends, f"{topic} does not exist"
        todo = {p: end for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        messages: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                messages.append(msg)
            positions = consumer.position([TopicPartition(topic, p) for p in todo])
            for tp in positions:
                if tp.offset >= todo[tp.partition]:
                    del todo[tp.partition]
        assert not todo, f"{topic} could not be read to its end: partitions {sorted(todo)} left"
        return messages
    finally:
        consumer.close()


def schema_reader(bootstrap: str, schema_topic: str, expected: int) -> ContractReader:
    """A reader holding every schema on ``schema_topic``, once at least ``expected`` schema
    messages are there. The whole topic is read, not its first ``expected`` messages: each
    capture run publishes the schemas it meets again, so the first few may be repeats."""
    consume_all(bootstrap, [schema_topic], expected)
    reader = ContractReader(schema_topic)
    for message in read_to_end(bootstrap, schema_topic):
        reader.add_schema_message(message.key(), message.value())
    return reader


def replay(reader: ContractReader, messages: list[Any]) -> Tables:
    """Rebuild each table from its records, applied in position order."""
    changes = [(reader.decode_value(m.value()), m) for m in messages if m.value() is not None]
    changes.sort(key=lambda vm: (vm[0]["commit_lsn"], vm[0]["ordinal"]))
    tables: Tables = {}
    for value, message in changes:
        rows = tables.setdefault(message.topic(), {})
        op = value["op"]
        if op == "TRUNCATE":
            rows.clear()
            continue
        key = tuple(sorted(reader.decode_key(message.key()).items()))
        if op == "DELETE":
            rows.pop(key, None)
        else:
            after = dict(value["after"])
            for name in value["unchanged_columns"]:
                after[name] = rows[key][name]
            rows[key] = after
    return tables


def assert_positions_increase(reader: ContractReader, messages: list[Any]) -> None:
    """Every partition's records (tombstones aside) in strictly increasing position order,
    as the wire contract promises."""
    last: dict[int, tuple[int, int]] = {}
    for m in messages:
        if m.value() is None:
            continue
        value = reader.decode_value(m.value())
        position = (value["commit_lsn"], value["ordinal"])
        before = last.get(m.partition())
        assert before is None or before < position, (
            f"partition {m.partition()}: {value['op']} at {position} after {before}"
        )
        last[m.partition()] = position


def report_applied(bootstrap: str, control_topic: str, messages: Iterable[Any]) -> None:
    """Tell capture, as the apply job would, that every one of ``messages`` is applied."""
    ends: dict[tuple[str, int], int] = {}
    for m in messages:
        tp = (m.topic(), m.partition())
        ends[tp] = max(ends.get(tp, 0), m.offset() + 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    for (topic, partition), next_offset in ends.items():
        progress = AppliedProgress(topic, partition, next_offset, None, None, "t", None, None)
        producer.produce(control_topic, progress.value(), progress.key())
    assert producer.flush(10) == 0
