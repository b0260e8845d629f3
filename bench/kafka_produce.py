"""What one ``Producer.produce`` call costs the calling thread, by what it carries.

Usage: ``.venv/bin/python -m bench.kafka_produce [--records N] [--rounds R]``

Capture produces every record from one Python thread; with the compiled row encoder the
record itself is cheap, and the produce call is what is left. This measures that call
alone on the local stack's broker, with capture's producer settings
(``capture.publish.publisher.producer_conf``: idempotent, ``acks=all``, lz4, 5 ms linger), a
topic of 3 partitions, 150-byte values and 12-byte keys:

- ``plain``: key and value (the baseline);
- ``headers``: plus the four headers every change record carries (two LSNs, the
  operation, the schema fingerprint);
- ``headers + report``: plus a per-record delivery callback (a ``functools.partial``, as
  capture's publisher makes), served by ``poll(0)`` every 200 records as capture's loop
  does;
- ``compiled + report``: ``headers + report`` through the compiled producer
  (``capture.publish.native_producer.NativeProducer``, docs/capture.md, "The compiled producer");
- ``compiled batch``: the compiled producer's ``produce_batch``, 500 records a call to
  the partitions of their keys, reports for the first and last record of each
  partition's run, as a snapshot batch is produced;
- ``capture publish``: the same records through capture's own steps around the call --
  ``ChangePublisher.publish`` with the in-flight book (a transaction every 7 records,
  as pgbench's), the metrics and the delivery reports the book takes -- so what capture
  adds to the bare call is measured apart from the rest of its loop; with the compiled
  producer, and (``capture publish, confluent``) with confluent-kafka's.

CPU is the calling thread's (``RUSAGE_THREAD``), so librdkafka's own threads are not in
it: the produce calls, the callbacks, and the final ``flush``. Best of ``--rounds``
rounds, each on a topic of its own, printed as microseconds per record and against the
baseline of the same round. The topics are deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
from collections.abc import Callable
from functools import partial

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from capture.in_flight import ProgressBook
from capture.metrics import CaptureMetrics
from capture.publish import native_producer
from capture.publish.native_producer import Delivery, NativeProducer, Report
from capture.publish.partitioning import key_partitions
from capture.publish.publisher import ChangePublisher, Topics, producer_conf
from capture.records import OutgoingRecord
from capture.settings import KafkaSettings
from deploy.local import stack
from runtime import gc_tuning
from schemas.lsn import Lsn

PARTITIONS = 3
RECORD_HEADERS: list[tuple[str, bytes]] = [
    ("pgdelta.commit_lsn", b"4/6F758E60"),
    ("pgdelta.change_lsn", b"4/6F758F18"),
    ("pgdelta.op", b"u"),
    ("pgdelta.schema_fingerprint", b"9c2f8e61d0a4b7c3"),
]
HEADERS: list[tuple[str, str | bytes | None]] = list(RECORD_HEADERS)
MODES = (
    "plain",
    "headers",
    "headers + report",
    "compiled + report",
    "compiled batch",
    "capture publish",
    "capture publish, confluent",
)
BATCH = 500
TRANSACTION_RECORDS = 7


def _thread_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def _publish_round(bootstrap: str, topic: str, records: int, *, compiled: bool) -> float:
    """:func:`_round` of ``capture publish``: through a ChangePublisher of its own."""
    settings = KafkaSettings(bootstrap_servers=bootstrap)
    book = ProgressBook(Lsn(1))
    publisher = ChangePublisher(
        settings,
        book,
        Topics(settings),
        start=Lsn(1),
        metrics=CaptureMetrics(),
        compiled=compiled,
    )
    value = os.urandom(150)
    outgoing = [
        OutgoingRecord(topic, os.urandom(12), value, RECORD_HEADERS, "public.accounts")
        for _ in range(1000)
    ]
    publish = publisher.publish
    warm_up = book.pin()
    publisher.publish(outgoing[0], pin=warm_up)  # the topic's metadata, outside the timing
    publisher.flush()
    book.unpin(warm_up)
    started = _thread_cpu_s()
    lsn = 16
    for i in range(records):
        if i % TRANSACTION_RECORDS == 0:
            book.begin(Lsn(lsn))
        publish(outgoing[i % 1000])
        if i % TRANSACTION_RECORDS == TRANSACTION_RECORDS - 1:
            book.commit(Lsn(lsn + 8))
            lsn += 16
        if i % 200 == 0:
            publisher.poll(0)
    if book.in_transaction:
        book.commit(Lsn(lsn + 8))
        lsn += 16
    publisher.flush(60)
    publisher.poll(0)
    spent = _thread_cpu_s() - started
    # Every delivery reached the book: once every offset is applied, the last
    # transaction's end is confirmable and nothing is in flight.
    for partition in range(PARTITIONS):
        book.applied(topic, partition, 1 << 62)
    if book.confirmable != Lsn(lsn - 8) or book.in_flight_records != 0:
        raise SystemExit(f"deliveries missing: {book.in_flight_records} records in flight")
    return spent


def _compiled_round(bootstrap: str, topic: str, mode: str, records: int) -> float:
    """:func:`_round` of the compiled producer's modes."""
    producer = NativeProducer(
        producer_conf(KafkaSettings(bootstrap_servers=bootstrap)), error_cb=lambda _e: None
    )
    value = os.urandom(150)
    keys = [os.urandom(12) for _ in range(1000)]
    delivered = 0

    def report(_ordinal: int, err: KafkaError | None, msg: Delivery) -> None:
        nonlocal delivered
        if err is None and msg.offset() is not None:
            delivered += 1

    batch_keys = keys[:BATCH]
    batch_values = [value] * BATCH
    partitions = key_partitions(batch_keys, PARTITIONS)
    started = _thread_cpu_s()
    if mode == "compiled + report":
        for i in range(records):
            producer.produce(
                topic, value, keys[i % 1000], headers=HEADERS, on_delivery=partial(report, i)
            )
            if i % 200 == 0:
                producer.poll(0)
    else:
        for b in range(records // BATCH):
            firsts: dict[int, int] = {}
            lasts: dict[int, int] = {}
            for index, partition in enumerate(partitions):
                firsts.setdefault(partition, index)
                lasts[partition] = index
            ends = set(firsts.values()) | set(lasts.values())
            reports: dict[int, Report] = {i: partial(report, b * BATCH + i) for i in ends}
            producer.produce_batch(topic, partitions, batch_keys, batch_values, HEADERS, reports)
            producer.poll(0)
    if producer.flush(60):
        raise SystemExit("records still undelivered after 60 s")
    spent = _thread_cpu_s() - started
    expected = records if mode == "compiled + report" else None
    if expected is not None and delivered != expected:
        raise SystemExit(f"{delivered} delivery reports for {records} records")
    if producer.unreported_failure is not None:
        raise SystemExit(producer.unreported_failure)
    return spent


def _round(producer: Producer, topic: str, mode: str, records: int) -> float:
    """CPU seconds of the calling thread to produce ``records`` records and flush."""
    value = os.urandom(150)
    keys = [os.urandom(12) for _ in range(1000)]
    delivered = 0

    def report(_ordinal: int, err: KafkaError | None, msg: Message) -> None:
        nonlocal delivered
        if err is None and msg.offset() is not None:
            delivered += 1

    produce: Callable[[int], None]
    if mode == "plain":

        def produce(i: int) -> None:
            producer.produce(topic, value, keys[i % 1000])

    elif mode == "headers":

        def produce(i: int) -> None:
            producer.produce(topic, value, keys[i % 1000], headers=HEADERS)

    else:

        def produce(i: int) -> None:
            producer.produce(
                topic, value, keys[i % 1000], headers=HEADERS, on_delivery=partial(report, i)
            )
            if i % 200 == 0:
                producer.poll(0)

    started = _thread_cpu_s()
    for i in range(records):
        produce(i)
    if producer.flush(60):
        raise SystemExit("records still undelivered after 60 s")
    spent = _thread_cpu_s() - started
    if mode == "headers + report" and delivered != records:
        raise SystemExit(f"{delivered} delivery reports for {records} records")
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gc_tuning.tune_for_streaming()  # as ``python -m capture`` does before it runs
    if native_producer.library() is None:
        raise SystemExit("capture_native is not built here (make native): no compiled producer")
    state = stack.up()
    bootstrap = state.kafka.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    producer = Producer(producer_conf(KafkaSettings(bootstrap_servers=bootstrap)))
    prefix = f"bench_produce_{secrets.token_hex(4)}"
    topics: list[str] = []
    best = dict.fromkeys(MODES, float("inf"))
    try:
        for round_ in range(args.rounds):
            for mode in MODES:
                slug = mode.replace(" + ", "_").replace(", ", "_").replace(" ", "_")
                topic = f"{prefix}.{round_}.{slug}"
                admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
                topics.append(topic)
                if mode.startswith("capture publish"):
                    compiled = mode == "capture publish"
                    spent = _publish_round(bootstrap, topic, args.records, compiled=compiled)
                elif mode.startswith("compiled"):
                    spent = _compiled_round(bootstrap, topic, mode, args.records)
                else:
                    spent = _round(producer, topic, mode, args.records)
                micros = spent / args.records * 1e6
                best[mode] = min(best[mode], micros)
    finally:
        if topics:
            for future in admin.delete_topics(topics).values():
                future.result(30)
    print(f"{args.records} records per round, best of {args.rounds} rounds")
    print(f"{'produce':<28}{'us/record':>10}{'vs plain':>10}")
    for mode in MODES:
        print(f"{mode:<28}{best[mode]:>10.2f}{best[mode] / best['plain']:>9.2f}x")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
