"""Which partition of its topic a change record's key goes to.

The producer is configured with ``partitioner=murmur2_random``, the Java client's
default for a record with a key: ``(murmur2(key) & 0x7fffffff) % partitions``. For
snapshot batches capture computes that partition itself and produces each record to it
explicitly, because it needs to know, when producing, which of a batch's records share a
partition: it then asks for the delivery reports of only the first and the last record
of each partition's run and checks the run is whole from their offsets
(``ChangePublisher.publish_batch``), instead of taking a report per record.

Invariants:

- Same partition as the partitioner. A key gets the partition the producer's
  partitioner would give it, so a snapshot record and a later streamed change of the
  same key land in one partition, where their order holds.
  ``tests/integration/test_capture_partitioning.py`` checks this against librdkafka on
  the real broker, and the unit tests against Kafka's own murmur2 vectors.
- Explicit partitions beside the partitioner. A topic gets snapshot records with an
  explicit partition and streamed changes through the partitioner. librdkafka queues
  the latter apart only until it knows the topic's partitions (its INTRODUCTION.md,
  "Partitioner considerations"), so in a partition both keep their produce order once
  it does. A snapshot batch follows either nothing of its topic (a table's first
  snapshot holds its streamed changes back until it is in Kafka) or changes produced
  long before (a resync, whose snapshot is taken at a later point: apply drops those
  older changes as replays, or its per-key dedup keeps the newer snapshot row).
- Partitions are counted once per topic and process (``Topics.partitions``). Adding
  partitions to a change topic moves keys between partitions for every keyed
  producer; capture uses the new count after its next start.
- The compiled ``capture_native.key_partitions`` and :func:`partition_of` give the same
  answer; without the extension the Python one serves (slower, never different).
"""

from __future__ import annotations

from collections.abc import Callable

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` as an unsigned 32-bit value (the Java client's
    ``Utils.murmur2``: 32-bit arithmetic that wraps, the tail mixed little-endian)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for at in range(0, whole, 4):
        k = int.from_bytes(data[at : at + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length - whole
    if tail >= 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the producer's partitioner gives ``key`` among ``partitions``."""
    if partitions < 1:
        raise ValueError("a topic has at least one partition")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def _python_key_partitions(keys: list[bytes], partitions: int, /) -> list[int]:
    return [partition_of(key, partitions) for key in keys]


KeyPartitions = Callable[[list[bytes], int], list[int]]
"""``key_partitions(keys, partitions)``: the partition of each key of a batch."""

try:
    from capture_native import key_partitions as _compiled
except ImportError:  # not built here: the Python twin gives the same partitions
    key_partitions: KeyPartitions = _python_key_partitions
else:
    key_partitions = _compiled
