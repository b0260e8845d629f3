"""A small micro-batch's records read from Kafka in the driver, with no Spark job.

Reading a batch through Spark's Kafka source is a job with a task per topic-partition:
eleven tables of three partitions are 33 tasks, about 4 s on two cores for a batch of
500 records (docs/benchmarks.md), more than the whole batch's writes from the driver
(:mod:`apply.lake.driver_merge`). The records themselves are a few hundred kilobytes.

So when the batch's offset ranges are known and small, the driver reads them itself with
one librdkafka consumer. Spark stays the engine of the query: its Kafka source decides
each batch's offsets, writes them to the checkpoint's offset log *before* the batch runs
(``<checkpoint>/offsets/<batch id>``: a version line, a metadata line, then one line
per source, the Kafka source's ``{"topic": {"partition": next offset}}``), and commits
the batch after ``foreachBatch`` returns. Batch ``n`` reads from the offsets of batch
``n - 1`` to its own, so the two files give the exact ranges Spark would read
(:func:`batch_ranges`), and :meth:`HeldBatchReader.read` fetches exactly those records:
``(topic, partition, offset, value)``, a tombstone's value None, as the source gives
them.

A partition the previous entry does not hold (every partition of the query's first
batch, a table's topic new since the last batch) Spark reads from its earliest offset,
which no log records. The driver reads it too when that offset is 0: a partition's
earliest offset only ever grows, so if it is 0 now it was 0 when Spark planned the
batch. A partition retention has trimmed is left to Spark. A restarted job's first
batch often meets one (a table that had no rows yet), and a snapshot's first batch is
all of them: read by Spark, those were the slowest batches of a start (docs/benchmarks.md).

Anything unusual leaves the batch to Spark (None): a new partition whose earliest offset
is not 0, an offset log that is not local or not in the expected form, more than
``limit`` records, or records that do not arrive within the timeout (retention took
them, a broker is away: Spark's read then fails or waits as it always did).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from apply.lake.delta_log import local_path
from runtime.kafka_client import KafkaConf

log = logging.getLogger(__name__)

HeldRecord = tuple[str, int, int, bytes | None]
"""``(topic, partition, offset, value)``; value None for a tombstone."""

OFFSET_LOG_VERSION = "v1"


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """The offsets ``[start, end)`` of one partition a batch reads."""

    topic: str
    partition: int
    start: int | None
    """None: the partition's earliest offset, where Spark reads a partition new to the
    query from (module docstring)."""
    end: int


def parse_offset_log(text: str) -> dict[str, dict[int, int]] | None:
    """The Kafka source's offsets in one entry of Spark's offset log; None when the
    entry is not one version-1 entry of a single source."""
    lines = [line for line in text.split("\n") if line.strip()]
    if len(lines) != 3 or lines[0] != OFFSET_LOG_VERSION:
        return None
    try:
        offsets = json.loads(lines[2])
        return {
            str(topic): {int(partition): int(offset) for partition, offset in parts.items()}
            for topic, parts in offsets.items()
        }
    except (ValueError, AttributeError, TypeError):
        return None


def batch_ranges(checkpoint: str, batch_id: int) -> tuple[OffsetRange, ...] | None:
    """The ranges batch ``batch_id`` of the query checkpointed at ``checkpoint`` reads
    (module docstring), non-empty ones only; None when they cannot be known here."""
    root = local_path(checkpoint)
    if root is None or batch_id < 0:
        return None
    offsets = Path(root) / "offsets"
    try:
        end = parse_offset_log((offsets / str(batch_id)).read_text("utf-8"))
        # The first batch reads every partition from its earliest offset.
        start = (
            {}
            if batch_id == 0
            else parse_offset_log((offsets / str(batch_id - 1)).read_text("utf-8"))
        )
    except OSError:
        return None
    if end is None or start is None:
        return None
    ranges = []
    for topic, partitions in sorted(end.items()):
        for partition, until in sorted(partitions.items()):
            since = start.get(topic, {}).get(partition)
            if until > (0 if since is None else since):
                ranges.append(OffsetRange(topic, partition, since, until))
    return tuple(ranges)


class HeldBatchReader:
    """One consumer the job's batches read their small batches with, one at a time (the
    lanes' queries share it). Assigned by hand: nothing is committed under its group."""

    def __init__(self, conf: KafkaConf, *, timeout_s: float = 30.0) -> None:
        self._conf = conf | {
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None

    def read(self, ranges: tuple[OffsetRange, ...], limit: int) -> list[HeldRecord] | None:
        """The records of a batch's ``ranges`` (:func:`batch_ranges`), or None when the
        batch is Spark's to read: more than ``limit`` records, or a read that fails
        (module docstring)."""
        if sum(r.end - (r.start or 0) for r in ranges) > limit:
            return None
        if not ranges:
            return []
        with self._lock:
            if self._consumer is None:
                self._consumer = Consumer(self._conf)
            known = _from_earliest(self._consumer, ranges, self._timeout_s)
            if known is None:
                return None
            return _fetch(self._consumer, known, self._timeout_s)

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def _from_earliest(
    consumer: Consumer, ranges: tuple[OffsetRange, ...], timeout_s: float
) -> tuple[OffsetRange, ...] | None:
    """``ranges`` with each partition read from its earliest offset starting at 0; None
    when one of them has an earliest offset past 0, or the broker does not say (Spark
    reads the batch: module docstring)."""
    known = []
    for offset_range in ranges:
        if offset_range.start is None:
            where = TopicPartition(offset_range.topic, offset_range.partition)
            try:
                earliest, _ = consumer.get_watermark_offsets(where, timeout=timeout_s)
            except KafkaException as exc:
                log.warning(
                    "a new partition's earliest offset is unknown (%s): Spark reads the batch", exc
                )
                return None
            if earliest != 0:
                log.info(
                    "%s [%d] begins at offset %d, not 0: Spark reads the batch",
                    offset_range.topic,
                    offset_range.partition,
                    earliest,
                )
                return None
            known.append(replace(offset_range, start=0))
        else:
            known.append(offset_range)
    return tuple(known)


def _fetch(
    consumer: Consumer, ranges: tuple[OffsetRange, ...], timeout_s: float
) -> list[HeldRecord] | None:
    ends: Mapping[tuple[str, int], int] = {(r.topic, r.partition): r.end for r in ranges}
    pending = set(ends)
    consumer.assign([TopicPartition(r.topic, r.partition, r.start or 0) for r in ranges])
    records: list[HeldRecord] = []
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            if time.monotonic() > deadline:
                log.warning(
                    "a batch's records did not arrive in %.0fs: Spark reads them", timeout_s
                )
                return None
            for message in consumer.consume(1000, timeout=0.2):
                where = (str(message.topic()), int(message.partition() or 0))
                error = message.error()
                offset = int(message.offset() or 0)
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if where in pending and offset >= ends[where]:
                            pending.discard(where)
                        continue
                    log.warning("reading a batch's records failed (%s): Spark reads them", error)
                    return None
                end = ends.get(where)
                if end is None or offset >= end:
                    pending.discard(where)
                    continue
                records.append((where[0], where[1], offset, message.value()))
                if offset >= end - 1:
                    pending.discard(where)
    finally:
        consumer.unassign()
    return records


__all__ = [
    "HeldBatchReader",
    "HeldRecord",
    "OffsetRange",
    "batch_ranges",
    "parse_offset_log",
]
