"""apply.batch.held_batch against a real broker: the records of a batch's offset ranges, read
in the driver, are exactly the ones in those ranges, tombstones included; a batch over
the bound, whose offsets the log cannot give, or that begins a partition retention has
trimmed, is left to Spark."""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from apply.batch.held_batch import HeldBatchReader, batch_ranges
from tests.plugins.services import Services


def offsets_entry(offsets: dict[str, dict[str, int]]) -> str:
    return 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n' + json.dumps(offsets)


def test_the_driver_reads_exactly_the_batchs_records(
    services: Services, unique_name: str, tmp_path: Path
) -> None:
    bootstrap = services.kafka_bootstrap_servers
    topics = [f"{unique_name}.a", f"{unique_name}.b"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 2, 1) for t in topics]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    sent: dict[tuple[str, int], list[bytes | None]] = {}
    for topic in topics:
        for partition in (0, 1):
            values: list[bytes | None] = [
                f"{topic}/{partition}/{i}".encode() if i % 4 else None for i in range(10)
            ]
            for value in values:
                producer.produce(topic, value, b"k", partition=partition)
            sent[(topic, partition)] = values
    assert producer.flush(30) == 0

    a, b = topics
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "5").write_text(offsets_entry({a: {"0": 0, "1": 0}, b: {"0": 0}}))
    (checkpoint / "offsets" / "6").write_text(
        offsets_entry({a: {"0": 2, "1": 10}, b: {"0": 0, "1": 5}})
    )
    (checkpoint / "offsets" / "7").write_text(
        offsets_entry({a: {"0": 7, "1": 10}, b: {"0": 3, "1": 10}})
    )
    reader = HeldBatchReader({"bootstrap.servers": bootstrap, "group.id": unique_name})
    try:
        ranges = batch_ranges(str(checkpoint), 7)
        assert ranges is not None
        held = reader.read(ranges, limit=13)
        expected = [
            (topic, partition, offset, sent[(topic, partition)][offset])
            for topic, partition, start, end in ((a, 0, 2, 7), (b, 0, 0, 3), (b, 1, 5, 10))
            for offset in range(start, end)
        ]
        assert held is not None
        assert sorted(held, key=lambda r: (r[0], r[1], r[2])) == expected
        assert any(value is None for *_, value in held)
        # The same batch again (Spark replays it after a crash): the same records.
        assert sorted(reader.read(ranges, limit=13) or []) == sorted(held)
        # One record over the bound, or a batch the log does not give: Spark's.
        assert reader.read(ranges, limit=12) is None
        assert batch_ranges(str(checkpoint), 4) is None

        # Batch 6 read b's partition 1 from its earliest offset, as Spark reads a partition
        # new to the query (and a query's first batch, every partition): 0 here.
        first = batch_ranges(str(checkpoint), 6)
        assert first is not None
        held = reader.read(first, limit=17)
        assert held is not None
        expected = [
            (topic, partition, offset, sent[(topic, partition)][offset])
            for topic, partition, end in ((a, 0, 2), (a, 1, 10), (b, 1, 5))
            for offset in range(end)
        ]
        assert sorted(held, key=lambda r: (r[0], r[1], r[2])) == expected
        # Once retention has trimmed such a partition, where Spark began is unknown: Spark's.
        trimmed = admin.delete_records([TopicPartition(b, 1, 2)])
        for future in trimmed.values():
            future.result(30)
        assert reader.read(first, limit=17) is None
    finally:
        reader.close()
