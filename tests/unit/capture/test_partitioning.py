"""The partition capture computes for a key: Kafka's murmur2, compiled and in Python.

That librdkafka's ``murmur2_random`` partitioner agrees is checked on the real broker
(tests/integration/test_capture_partitioning.py)."""

from __future__ import annotations

import random

import pytest

from capture.in_flight import RecordTicket
from capture.publish.partitioning import key_partitions, murmur2, partition_of
from capture.publish.publisher import BrokenRunError, PartitionRun
from capture.rows import native as native_rows

# Apache Kafka's own vectors (UtilsTest.testMurmur2), as the Java client's signed ints.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS.items())
def test_murmur2_gives_the_java_clients_hash(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected & 0xFFFFFFFF


def test_a_key_goes_to_its_positive_hash_modulo_the_partitions() -> None:
    # "21" hashes to -973932308: 0x7fffffff & that is 1173551340.
    assert [partition_of(b"21", n) for n in (1, 7, 1000)] == [0, 1173551340 % 7, 340]


def test_a_topic_without_partitions_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        partition_of(b"k", 0)
    with pytest.raises(ValueError, match="at least one partition"):
        key_partitions([b"k"], 0)


@pytest.mark.skipif(not native_rows.AVAILABLE, reason="capture_native is not built here")
def test_the_compiled_partitions_are_the_python_ones() -> None:
    generator = random.Random(13)
    keys = [generator.randbytes(generator.randrange(0, 40)) for _ in range(5000)]
    keys += list(KAFKA_VECTORS)
    for partitions in (1, 3, 12, (1 << 31) - 1):
        assert key_partitions(keys, partitions) == [partition_of(k, partitions) for k in keys]


def test_a_run_is_booked_once_both_reports_show_consecutive_offsets() -> None:
    run = PartitionRun(RecordTicket(-1, 300, records=3))
    assert run.reported(first=False, offset=12) is None, "the last came first: wait for it"
    assert run.reported(first=True, offset=10) == (10, 12)


@pytest.mark.parametrize(("first", "last"), [(10, 11), (10, 13), (12, 10)])
def test_a_run_whose_reports_do_not_span_its_records_is_broken(first: int, last: int) -> None:
    """Fewer offsets than records: some were lost. More: another producer wrote in
    between, and a lost record could hide behind its record."""
    run = PartitionRun(RecordTicket(-1, 300, records=3))
    run.reported(first=True, offset=first)
    span = last - first + 1
    with pytest.raises(BrokenRunError, match=rf"3 records .* across {span} offsets \({first} to"):
        run.reported(first=False, offset=last)
