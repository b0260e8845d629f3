"""Apply speed (MERGE per micro-batch) against a plain Delta append of the same rows.

Usage: ``.venv/bin/python -m bench.apply_merge [--changes N] [--keys K] [--batch B]
[--distribution uniform|skewed|insert-heavy] [--profile] [--conf KEY=VALUE ...]``

On the local stack (``deploy.local.stack.up()``), with a fresh topic prefix
``bench_apply_<hex>``:

1. **Workload**, made by the contract's own encoder (:class:`~schemas.change_record.
   ChangeEncoder`, headers and schema-topic records as the capture writes them) for a
   keyed table shaped like ``pgbench_accounts`` (``aid`` int primary key, ``bid`` int,
   ``abalance`` int, ``filler`` char(84)), on the change topic
   ``<prefix>.bench.accounts`` (3 partitions, partitioned by key like the capture's
   producer) and the schema topic ``<prefix>._schemas``:

   - a snapshot of K rows (``READ`` records at the consistent point), applied by the job
     before the measurement: the table the changes go to already holds K rows;
   - then N row changes in transactions of :data:`TX_CHANGES`, with one of three key
     distributions (``--distribution``, :data:`MIXES`):

     - ``uniform`` (default): 85 % updates of a uniformly random live key (pgbench's
       access pattern; ``abalance`` moves by a random delta), 10 % inserts of new keys,
       5 % deletes of a random live key;
     - ``skewed``: the same mix, but 90 % of the updates and deletes go to the newest
       10 % of the keys (recent rows are hot), the rest uniformly to the older ones;
     - ``insert-heavy``: 80 % inserts, 15 % updates and 5 % deletes of uniformly random
       live keys.

     Deletes carry the key only, as with ``REPLICA IDENTITY DEFAULT``. No tombstones
     (the capture's default) and no unchanged TOAST values.

   Generating and producing are not measured.
2. **Apply** (measured): :class:`apply.app.ApplyJob` -- the code ``python -m apply``
   runs -- with the ``available_now`` trigger and ``maxOffsetsPerTrigger`` = B, in the
   same checkpoint as the snapshot load, so it starts at the first change. Wall time is
   that of ``ApplyJob.run`` (schema catalog read and start-up included).
3. **Baseline** (measured, same Spark session, right after): a plain Structured
   Streaming query over the same records -- Kafka source from the first change,
   ``from_avro`` with the writer schema, the row fields and position selected --
   appended to a fresh Delta table (``outputMode("append")``, ``available_now``, the
   same ``maxOffsetsPerTrigger``).

Batch durations come from the queries' progress events (``batchDuration``); CPU time is
that of the Spark JVM (local tasks included) and of this process, from ``/proc``. The MERGE
commits' ``operationMetrics`` (``DESCRIBE HISTORY``) give rows copied: the target rows
Delta rewrote unchanged because they shared a file with a changed row. The run fails
unless the lake table ends up with exactly the rows the workload leaves (count, key
sum, balance sum) and the baseline table holds one row per change.

Everything runs in one local Spark session with the apply job's default configuration
(``apply.engine.spark_session``); ``--conf`` adds settings on top, to compare them.
``--profile`` writes Spark's event log (kept afterwards) and prints the Spark jobs of
each measured run, grouped by description. Topics and the scratch directory are
deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import re
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic, TopicPartition

from apply.app import ApplyJob
from apply.engine.spark_jars import configured_jars
from apply.engine.spark_session import build_session
from apply.lake.tables import TableId, table_path
from apply.settings import ApplySettings, LakeSettings, SparkSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture.publish.publisher import producer_conf
from capture.settings import KafkaSettings as CaptureKafka
from deploy.local import stack
from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    TableSchemas,
    build_table_schemas,
)
from schemas.headers import change_headers
from schemas.lsn import Lsn
from schemas.naming import schema_topic, table_topic
from schemas.operation import Operation
from schemas.schema_topic import TABLE_KEY_SCHEMA_MESSAGE, table_schema_messages
from schemas.single_object import HEADER_SIZE

SCHEMA, TABLE = "bench", "accounts"
PARTITIONS = 3
TX_CHANGES = 10
ACCOUNTS_PER_BRANCH = 100_000
FILLER = " " * 84
SEED = 20261122


class Distribution(StrEnum):
    """Which rows the changes go to (module docstring, Workload)."""

    UNIFORM = "uniform"
    SKEWED = "skewed"
    INSERT_HEAVY = "insert-heavy"


@dataclass(frozen=True, slots=True)
class Mix:
    """Shares of updates and inserts (the rest are deletes), and where updates and
    deletes land: ``hot_changes`` of them on the newest ``hot_keys`` of the key range,
    the rest uniformly on the older keys; uniformly on every live key when
    ``hot_keys`` is 0."""

    update: float
    insert: float
    hot_keys: float = 0.0
    hot_changes: float = 0.0
    target: float = 0.5
    """apply/append rate the run must reach (issue #12's targets)."""

    @property
    def delete(self) -> float:
        return 1.0 - self.update - self.insert


MIXES: dict[Distribution, Mix] = {
    # pgbench's access pattern: every row equally likely.
    Distribution.UNIFORM: Mix(update=0.85, insert=0.10, target=0.5),
    # 90 % of the updates and deletes on the newest 10 % of the keys: recent rows are hot.
    Distribution.SKEWED: Mix(update=0.85, insert=0.10, hot_keys=0.10, hot_changes=0.90, target=0.7),
    # An event or order table: mostly new rows, a few corrections of any row.
    Distribution.INSERT_HEAVY: Mix(update=0.15, insert=0.80, target=0.9),
}
DEFAULT_BATCH = 100_000
START_LSN = 0x1_0000_0000
START_TS = 1_795_000_000_000_000  # 2026-11-18, µs since 1970 UTC
PROGRESS_WAIT_S = 30.0

ACCOUNTS = TableDescription(
    SCHEMA,
    TABLE,
    (
        Column("aid", ct.INT, nullable=False, key=True),
        Column("bid", ct.INT),
        Column("abalance", ct.INT),
        Column("filler", ct.STRING),
    ),
)


# -- workload (pure) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expected:
    """What the lake table must hold once every change is applied."""

    rows: int
    key_sum: int
    balance_sum: int


@dataclass
class Workload:
    """A deterministic pgbench_accounts-like change stream and the state it leaves.

    Keys are ``aid`` 1..K from the snapshot, then K+1, K+2... as inserts come. Positions
    grow strictly: the snapshot at the consistent point with ordinals 0..K-1, then
    transactions of :data:`TX_CHANGES` changes, each with a higher commit LSN.
    """

    keys: int
    seed: int = SEED
    distribution: Distribution = Distribution.UNIFORM
    _balances: list[int | None] = field(init=False, repr=False)
    _live: int = field(init=False, default=0)
    _rng: random.Random = field(init=False, repr=False)
    _lsn: int = field(init=False, default=START_LSN)
    _ts: int = field(init=False, default=START_TS)
    _xid: int = field(init=False, default=1000)
    counts: dict[Operation, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.keys < 1:
            raise ValueError("the table needs at least one key")
        self._balances = [None]  # aid 0 does not exist
        self._rng = random.Random(self.seed)

    @staticmethod
    def row(aid: int, balance: int) -> dict[str, Any]:
        return {
            "aid": aid,
            "bid": (aid - 1) // ACCOUNTS_PER_BRANCH + 1,
            "abalance": balance,
            "filler": FILLER,
        }

    def snapshot(self) -> Iterator[Change]:
        """K ``READ`` records at the consistent point: the table before the changes."""
        if len(self._balances) > 1:
            raise RuntimeError("the snapshot comes first, and once")
        lsn, self._lsn = self._lsn, self._lsn + 0x100
        for ordinal in range(self.keys):
            aid = ordinal + 1
            self._balances.append(0)
            self._live += 1
            self._count(Operation.READ)
            yield Change(
                Operation.READ, Lsn(lsn), Lsn(lsn), 0, self._ts, ordinal, after=self.row(aid, 0)
            )

    def changes(self, count: int) -> Iterator[Change]:
        """``count`` row changes with the mix of the module docstring."""
        rng, balances = self._rng, self._balances
        mix = MIXES[self.distribution]
        produced = 0
        while produced < count:
            size = min(TX_CHANGES, count - produced)
            begin = self._lsn
            commit = begin + 0x80 * (size + 1)
            self._lsn = commit + 0x40
            self._ts += 250
            self._xid += 1
            for ordinal in range(size):
                change_lsn = Lsn(begin + 0x80 * (ordinal + 1))
                draw = rng.random()
                if self._live == 0 or mix.update <= draw < mix.update + mix.insert:
                    aid = len(balances)
                    balances.append(0)
                    self._live += 1
                    op, before, after = Operation.INSERT, None, self.row(aid, 0)
                else:
                    aid = self._live_key(mix)
                    if draw < mix.update:
                        balance = (balances[aid] or 0) + rng.randint(-5000, 5000)
                        balances[aid] = balance
                        op, before, after = Operation.UPDATE, None, self.row(aid, balance)
                    else:
                        balances[aid] = None
                        self._live -= 1
                        op, before, after = Operation.DELETE, {"aid": aid}, None
                self._count(op)
                yield Change(
                    op,
                    Lsn(commit),
                    change_lsn,
                    self._xid,
                    self._ts,
                    ordinal,
                    before=before,
                    after=after,
                    before_key_only=op is Operation.DELETE,
                )
            produced += size

    def _live_key(self, mix: Mix) -> int:
        """A live key, drawn as ``mix`` says. Deletes are a small share, so a few draws
        find a live key; a key range emptied by deletes (tiny tables) falls back to
        every key, and to a scan when draws keep missing."""
        balances, rng = self._balances, self._rng
        end = len(balances)  # keys are 1 .. end - 1, the newest last
        low, high = 1, end
        if mix.hot_keys > 0:
            cut = end - max(1, int((end - 1) * mix.hot_keys))  # hot keys: cut .. end - 1
            hot = cut <= 1 or rng.random() < mix.hot_changes
            low, high = (cut, end) if hot else (1, cut)
        for _ in range(64):
            aid = rng.randrange(low, high)
            if balances[aid] is not None:
                return aid
        for _ in range(64):
            aid = rng.randrange(1, end)
            if balances[aid] is not None:
                return aid
        return next(aid for aid in range(1, end) if balances[aid] is not None)

    def _count(self, op: Operation) -> None:
        self.counts[op] = self.counts.get(op, 0) + 1

    def expected(self) -> Expected:
        live = [(aid, b) for aid, b in enumerate(self._balances) if b is not None]
        return Expected(
            rows=len(live),
            key_sum=sum(aid for aid, _ in live),
            balance_sum=sum(b for _, b in live),
        )


# -- Kafka ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Names:
    """Everything this run creates on Kafka, named after one random prefix."""

    prefix: str

    @classmethod
    def unique(cls) -> Names:
        return cls(f"bench_apply_{secrets.token_hex(4)}")

    @property
    def change_topic(self) -> str:
        return table_topic(self.prefix, SCHEMA, TABLE)

    @property
    def schema_topic(self) -> str:
        return schema_topic(self.prefix)

    @property
    def control_topic(self) -> str:
        return f"{self.prefix}._control"

    def all_topics(self) -> list[str]:
        return [self.change_topic, self.schema_topic, self.control_topic]


def _create_topics(bootstrap: str, names: Names) -> None:
    compacted = {"cleanup.policy": "compact"}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(names.change_topic, PARTITIONS, 1),
            NewTopic(names.schema_topic, 1, 1, config=compacted),
            NewTopic(names.control_topic, 1, 1, config=compacted),
        ]
    )
    for future in futures.values():
        future.result(30)


def _delete_topics(bootstrap: str, names: Names) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(names.all_topics(), operation_timeout=30).values():
        try:
            future.result(60)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (
                isinstance(error, KafkaError) and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            ):
                raise


class ChangeProducer:
    """Produces change records the way the capture does: same producer configuration
    (idempotent, ``acks=all``, the Java client's partitioner), key, value and headers."""

    def __init__(self, bootstrap: str, names: Names, schemas: TableSchemas) -> None:
        settings = CaptureKafka(
            bootstrap_servers=bootstrap,
            topic_prefix=names.prefix,
            control_topic=names.control_topic,
            schema_topic=names.schema_topic,
        )
        self._producer = Producer(producer_conf(settings))
        self._topic = names.change_topic
        self._encoder = ChangeEncoder(schemas)
        self._fingerprint = schemas.value_fingerprint
        self.failed = 0
        for message in (TABLE_KEY_SCHEMA_MESSAGE, *table_schema_messages(schemas)):
            self._producer.produce(names.schema_topic, message.value, message.key)
        self.flush()

    def _report(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failed += 1

    def produce(self, changes: Iterator[Change]) -> int:
        produced = 0
        encoder, producer = self._encoder, self._producer
        for change in changes:
            key, value = encoder.encode_key(change), encoder.encode_value(change)
            headers: list[tuple[str, str | bytes | None]] = list(
                change_headers(change, self._fingerprint)
            )
            while True:
                try:
                    producer.produce(
                        self._topic, value, key, headers=headers, on_delivery=self._report
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
            produced += 1
            if produced % 10_000 == 0:
                producer.poll(0)
        self.flush()
        return produced

    def flush(self) -> None:
        if self._producer.flush(120) != 0 or self.failed:
            raise RuntimeError(f"{self.failed} records were not delivered to {self._topic}")


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-bench"})
    try:
        ends = {}
        for partition in range(PARTITIONS):
            _, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10, cached=False
            )
            ends[partition] = int(high)
        return ends
    finally:
        consumer.close()


# -- Spark ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchProgress:
    batch_id: int
    rows: int
    duration_s: float


class ProgressLog:
    """Micro-batch progress of every query in the session, by query name.

    A :class:`pyspark.sql.streaming.StreamingQueryListener` built on first use, so that
    pyspark loads only once a session runs.
    """

    def __init__(self) -> None:
        self.batches: dict[str, list[BatchProgress]] = {}
        self._terminated: dict[str, int] = {}
        self._changed = threading.Condition()

    def listener(self) -> Any:
        from pyspark.sql.streaming.listener import StreamingQueryListener  # noqa: PLC0415

        log = self
        names: dict[str, str] = {}

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - pyspark's names
                names[str(event.runId)] = event.name or ""

            def onQueryProgress(self, event: Any) -> None:  # noqa: N802
                progress = event.progress
                batch = BatchProgress(
                    progress.batchId, progress.numInputRows, progress.batchDuration / 1000
                )
                with log._changed:
                    log.batches.setdefault(progress.name or "", []).append(batch)

            def onQueryIdle(self, event: Any) -> None:  # noqa: N802
                pass

            def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
                name = names.get(str(event.runId), "")
                with log._changed:
                    log._terminated[name] = log._terminated.get(name, 0) + 1
                    log._changed.notify_all()

        return Listener()

    def take(self, name: str, runs_before: int) -> list[BatchProgress]:
        """The batches ``name`` reported since the last take, once its run ended."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._terminated.get(name, 0) > runs_before, PROGRESS_WAIT_S
            )
            return self.batches.pop(name, [])

    def runs(self, name: str) -> int:
        with self._changed:
            return self._terminated.get(name, 0)


APPLY_QUERY = "pgdelta-apply"
APPEND_QUERY = "bench-append"


@dataclass(frozen=True, slots=True)
class Run:
    rows: int
    wall_s: float
    cpu_s: float
    """CPU time of the Spark JVM and of this process during the run."""
    batches: list[BatchProgress]

    @property
    def rate(self) -> float:
        return self.rows / self.wall_s

    @property
    def median_batch_s(self) -> float:
        return statistics.median(b.duration_s for b in self.batches) if self.batches else 0.0


def _apply_settings(
    bootstrap: str,
    names: Names,
    scratch: Path,
    batch: int,
    event_log: Path | None,
    overrides: Mapping[str, str],
) -> ApplySettings:
    events = (
        {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(event_log),
            "spark.eventLog.compress": "false",
        }
        if event_log is not None
        else {}
    )
    return ApplySettings(
        kafka=ApplyKafka(
            bootstrap_servers=bootstrap,
            topic_prefix=names.prefix,
            control_topic=names.control_topic,
            schema_topic=names.schema_topic,
            max_offsets_per_trigger=batch,
        ),
        lake=LakeSettings(root=str(scratch / "lake"), checkpoint_root=str(scratch / "checkpoints")),
        trigger=TriggerSettings(mode="available_now"),
        spark=SparkSettings(
            app_name="bench-apply-merge",
            conf={
                "spark.driver.memory": "4g",
                "spark.sql.warehouse.dir": str(scratch / "warehouse"),
                **events,
                **overrides,
            },
        ),
    )


class CpuClock:
    """User + system CPU seconds of the Spark driver JVM (where local tasks run too) and
    of this Python process: less sensitive than wall time to other work on the machine."""

    def __init__(self, spark: Any) -> None:
        jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
        self._stat = Path(f"/proc/{jvm_pid}/stat")
        self._tick = os.sysconf("SC_CLK_TCK")

    def seconds(self) -> float:
        # Fields 14 and 15 (utime, stime), counted after the parenthesised command name.
        fields = self._stat.read_text().rsplit(")", 1)[1].split()
        own = os.times()
        return (int(fields[11]) + int(fields[12])) / self._tick + own.user + own.system


def run_apply(job: ApplyJob, progress: ProgressLog, clock: CpuClock, rows: int) -> Run:
    """One ``available_now`` run of the apply job, to the end of the topic."""
    runs = progress.runs(APPLY_QUERY)
    cpu, started = clock.seconds(), time.perf_counter()
    job.run(threading.Event())
    wall, cpu = time.perf_counter() - started, clock.seconds() - cpu
    return Run(rows, wall, cpu, progress.take(APPLY_QUERY, runs))


def run_append(
    spark: Any,
    progress: ProgressLog,
    clock: CpuClock,
    settings: ApplySettings,
    schemas: TableSchemas,
    start: Mapping[int, int],
    scratch: Path,
    rows: int,
) -> tuple[Run, str]:
    """The baseline: decode the same records, append them to a fresh Delta table."""
    from pyspark.sql import functions as sf  # noqa: PLC0415
    from pyspark.sql.avro.functions import from_avro  # noqa: PLC0415

    topic = table_topic(settings.kafka.topic_prefix, SCHEMA, TABLE)
    path = str(scratch / "append" / TABLE)
    starting = json.dumps({topic: {str(p): o for p, o in start.items()}})
    runs = progress.runs(APPEND_QUERY)
    cpu, started = clock.seconds(), time.perf_counter()
    value = sf.col("value")
    body = value.substr(sf.lit(HEADER_SIZE + 1), sf.length(value) - sf.lit(HEADER_SIZE))
    decoded = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", starting)
        .option("maxOffsetsPerTrigger", settings.kafka.max_offsets_per_trigger)
        .load()
        .where(value.isNotNull())
        .select(from_avro(body, schemas.value_schema_json).alias("v"))
    )
    image = sf.coalesce(sf.col("v.after"), sf.col("v.before"))
    query = (
        decoded.select(
            sf.col("v.op").alias("op"),
            *[image[name].alias(name) for name in schemas.field_names],
            sf.col("v.commit_lsn").alias("_cdc_commit_lsn"),
            sf.col("v.ordinal").alias("_cdc_ordinal"),
            sf.col("v.commit_ts").alias("_cdc_commit_ts"),
        )
        .writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", str(scratch / "append-checkpoint"))
        .trigger(availableNow=True)
        .queryName(APPEND_QUERY)
        .start(path)
    )
    query.awaitTermination()
    wall, cpu = time.perf_counter() - started, clock.seconds() - cpu
    if query.exception() is not None:
        raise RuntimeError(f"the append query failed: {query.exception()}")
    return Run(rows, wall, cpu, progress.take(APPEND_QUERY, runs)), path


_MERGE_METRICS = (
    "numSourceRows",
    "numTargetRowsInserted",
    "numTargetRowsUpdated",
    "numTargetRowsDeleted",
    "numTargetRowsCopied",
    "numTargetFilesAdded",
    "numTargetFilesRemoved",
    "numTargetDeletionVectorsAdded",
    "numTargetBytesAdded",
    "numTargetBytesRemoved",
)


def merge_metrics(spark: Any, path: str, after_version: int) -> tuple[int, dict[str, int]]:
    """MERGE commits after ``after_version`` and the sums of their metrics."""
    from delta.tables import DeltaTable  # noqa: PLC0415

    commits = (
        DeltaTable.forPath(spark, path)
        .history()
        .where(f"version > {after_version} AND operation = 'MERGE'")
        .select("operationMetrics")
        .collect()
    )
    totals = dict.fromkeys(_MERGE_METRICS, 0)
    for commit in commits:
        metrics = commit["operationMetrics"] or {}
        for name in _MERGE_METRICS:
            totals[name] += int(metrics.get(name, "0"))
    return len(commits), totals


def table_version(spark: Any, path: str) -> int:
    from delta.tables import DeltaTable  # noqa: PLC0415

    newest = DeltaTable.forPath(spark, path).history(1).head()
    assert newest is not None
    return int(newest["version"])


def lake_contents(spark: Any, path: str) -> Expected:
    row = (
        spark.read.format("delta")
        .load(path)
        .selectExpr("count(*) AS n", "sum(aid) AS k", "sum(abalance) AS b")
        .head()
    )
    return Expected(int(row["n"]), int(row["k"] or 0), int(row["b"] or 0))


def table_features(spark: Any, path: str) -> str:
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").head()
    features = sorted(detail["tableFeatures"] or [])
    return f"{detail['numFiles']} files, features: {', '.join(features) or 'none'}"


_JOB_IDS = re.compile(r"\b(?:id|runId|batch) = \S+|\d+")


def _job_label(description: str) -> str:
    """A job description without query ids, batch ids and other numbers."""
    return " ".join(_JOB_IDS.sub("#", description).split())[:100]


def spark_job_profile(event_log: Path, start_ms: float, end_ms: float) -> list[str]:
    """Spark jobs that started in ``[start_ms, end_ms]`` (epoch ms), by description or
    call site: total seconds, count. Time not covered by jobs is driver-side work."""
    starts: dict[int, tuple[int, str]] = {}
    totals: dict[str, list[float]] = {}
    # Spark writes one directory of rolled files per application.
    for log_file in sorted(p for p in event_log.rglob("events_*") if p.is_file()):
        for line in log_file.read_text().splitlines():
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                props = event.get("Properties") or {}
                label = props.get("spark.job.description") or props.get("callSite.short", "?")
                starts[event["Job ID"]] = (event["Submission Time"], _job_label(label))
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in starts:
                submitted, label = starts.pop(event["Job ID"])
                if start_ms <= submitted <= end_ms:
                    entry = totals.setdefault(label, [0.0, 0])
                    entry[0] += (event["Completion Time"] - submitted) / 1000
                    entry[1] += 1
    covered = sum(seconds for seconds, _ in totals.values())
    lines = [f"{'s':>7} {'jobs':>5}  job (description or call site)"]
    lines += [
        f"{seconds:7.1f} {int(count):5d}  {label}"
        for label, (seconds, count) in sorted(totals.items(), key=lambda item: -item[1][0])
    ]
    lines.append(f"{covered:7.1f} {'':5}  in jobs, of {(end_ms - start_ms) / 1000:.1f} s wall")
    return lines


# -- report ---------------------------------------------------------------------------------


def _report(
    workload: Workload,
    changes: int,
    batch: int,
    merge: Run,
    append: Run,
    commits: int,
    metrics: Mapping[str, int],
    valid: bool,
) -> None:
    counts = workload.counts
    mix = ", ".join(
        f"{counts.get(op, 0)} {op.value.lower()}s"
        for op in (Operation.UPDATE, Operation.INSERT, Operation.DELETE)
    )
    print(
        f"\n{changes} changes ({mix}, {workload.distribution.value} keys) on a table of "
        f"{workload.keys} rows, "
        f"{PARTITIONS} partitions, maxOffsetsPerTrigger {batch}, {os.cpu_count()} CPUs"
    )
    print(
        f"{'run':24} {'wall s':>7} {'rows/s':>9} {'batches':>7} {'median batch s':>14} "
        f"{'CPU s':>6} {'CPU us/row':>10}"
    )
    for name, run in (("apply (MERGE)", merge), ("append (baseline)", append)):
        print(
            f"{name:24} {run.wall_s:7.1f} {run.rate:9.0f} {len(run.batches):7d} "
            f"{run.median_batch_s:14.2f} {run.cpu_s:6.1f} {run.cpu_s / run.rows * 1e6:10.1f}"
        )
    changed = (
        metrics["numTargetRowsUpdated"]
        + metrics["numTargetRowsInserted"]
        + metrics["numTargetRowsDeleted"]
    )
    copied = metrics["numTargetRowsCopied"]
    print(
        f"MERGE commits: {commits}; source rows {metrics['numSourceRows']} "
        f"(superseded in the batch: {changes - metrics['numSourceRows']}); target rows "
        f"updated {metrics['numTargetRowsUpdated']}, inserted "
        f"{metrics['numTargetRowsInserted']}, deleted {metrics['numTargetRowsDeleted']}, "
        f"copied {copied}"
    )
    print(
        f"files added {metrics['numTargetFilesAdded']}, removed "
        f"{metrics['numTargetFilesRemoved']}, deletion vectors added "
        f"{metrics['numTargetDeletionVectorsAdded']}; bytes added "
        f"{metrics['numTargetBytesAdded'] / 1e6:.0f} MB, removed "
        f"{metrics['numTargetBytesRemoved'] / 1e6:.0f} MB"
    )
    print(f"rows copied per row changed: {copied / changed if changed else 0:.2f}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ratio = merge.rate / append.rate
    target = MIXES[workload.distribution].target
    print(f"CPU per row, append/apply: {append.cpu_s / merge.cpu_s:.2f}")
    print(
        f"target apply/append >= {target} ({workload.distribution.value} keys): "
        f"{'met' if ratio >= target else 'NOT met'} ({ratio:.2f})"
    )
    if not valid:
        print("run INVALID: the tables do not hold what the workload left (see above)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--changes", type=int, default=1_000_000, help="row changes measured")
    parser.add_argument(
        "--keys", type=int, help="rows in the table before the changes (default: --changes)"
    )
    parser.add_argument(
        "--batch", type=int, default=DEFAULT_BATCH, help="maxOffsetsPerTrigger of both runs"
    )
    parser.add_argument(
        "--distribution",
        choices=[d.value for d in Distribution],
        default=Distribution.UNIFORM.value,
        help="which rows the changes go to (module docstring)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="write Spark's event log and print the Spark jobs of each measured run",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting on top of the apply job's defaults (repeatable), as "
        "APPLY_SPARK__CONF would give it",
    )
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.conf)
    keys = args.keys or args.changes
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")

    state = stack.up()
    bootstrap = state.kafka.bootstrap_servers
    names = Names.unique()
    schemas = build_table_schemas(ACCOUNTS)
    workload = Workload(keys, distribution=Distribution(args.distribution))
    print(f"prefix {names.prefix}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    if overrides:
        print(f"Spark settings over the apply defaults: {overrides}")
    with (
        tempfile.TemporaryDirectory(prefix="bench-apply-") as scratch_dir,
        contextlib.ExitStack() as cleanup,
    ):
        scratch = Path(scratch_dir)
        cleanup.callback(_delete_topics, bootstrap, names)
        _create_topics(bootstrap, names)
        producer = ChangeProducer(bootstrap, names, schemas)
        # Kept after the run, for a closer look (e.g. Spark's history server).
        event_log = Path(tempfile.mkdtemp(prefix="bench-apply-events-")) if args.profile else None
        settings = _apply_settings(bootstrap, names, scratch, args.batch, event_log, overrides)
        spark = build_session(settings.spark, configured_jars(settings.spark))
        cleanup.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")
        progress = ProgressLog()
        spark.streams.addListener(progress.listener())
        job = ApplyJob(settings, spark)
        cleanup.callback(job.close)
        clock = CpuClock(spark)
        lake_path = table_path(settings.lake.root, TableId(SCHEMA, TABLE))

        print(f"producing a snapshot of {keys} rows and applying it (not measured)...")
        producer.produce(workload.snapshot())
        run_apply(job, progress, clock, keys)
        loaded = table_version(spark, lake_path)

        print(f"producing {args.changes} changes...")
        start = _end_offsets(bootstrap, names.change_topic)
        producer.produce(workload.changes(args.changes))
        print(f"applying them (load {os.getloadavg()[0]:.2f})...")
        windows = [time.time() * 1000]
        merge = run_apply(job, progress, clock, args.changes)
        windows.append(time.time() * 1000)
        print(f"appending them (load {os.getloadavg()[0]:.2f})...")
        append, append_path = run_append(
            spark, progress, clock, settings, schemas, start, scratch, args.changes
        )
        windows.append(time.time() * 1000)

        commits, metrics = merge_metrics(spark, lake_path, loaded)
        expected, found = workload.expected(), lake_contents(spark, lake_path)
        appended = lake_contents(spark, append_path).rows
        print(f"lake table: {table_features(spark, lake_path)}")
        valid = found == expected and appended == args.changes
        if found != expected:
            print(f"lake table holds {found}, EXPECTED {expected}")
        if appended != args.changes:
            print(f"append table holds {appended} rows, EXPECTED {args.changes}")
        _report(workload, args.changes, args.batch, merge, append, commits, metrics, valid)
        if event_log is not None:
            spark.stop()  # flushes the event log
            for name, (begin, end) in (
                ("apply", (windows[0], windows[1])),
                ("append", (windows[1], windows[2])),
            ):
                print(f"\nSpark jobs of the {name} run (event log in {event_log}):")
                print("\n".join(spark_job_profile(event_log, begin, end)))
    if not valid:
        sys.exit(1)


if __name__ == "__main__":
    main()
