"""Capture drain speed against pg_recvlogical draining the same WAL backlog.

Usage: ``.venv/bin/python -m bench.capture_drain [--rows N] [--profile] [--python-rows]
[--debezium]``

On the local stack (``deploy.local.stack.up()``), in a fresh schema:

1. pgbench-like tables (``accounts`` with a ``char(84)`` filler, ``tellers``,
   ``branches``, ``history`` with a bigserial key) are loaded, then a publication over
   them and two pgoutput slots are created one after the other, with no write between:
   both slots start at the same point of the same WAL.
2. A backlog of at least N row changes is written while nothing reads the slots: half
   from ``pgbench`` (2 clients; 9 in 10 transactions are TPC-B-like: three updates and
   a ``history`` insert; 1 in 10 deletes the oldest ``history`` row), the rest from
   transactions of 1000 rows each (600 ``accounts`` updates, 300 ``history`` inserts, 100
   ``history`` deletes). Row changes are counted exactly from ``pg_stat_user_tables``
   once the writers' statistics are flushed, and cross-checked against the row counts
   of the 1000-row transactions. The end of the backlog is the WAL insert position
   right after the last commit.
3. Baseline: ``pg_recvlogical --endpos`` drains one slot (``proto_version=1``, the
   publication) into ``/dev/null``.
4. Ours: the capture service drains the other slot in a child process
   (``CaptureService(..., stop_at=end)``), producing with ``acks=all`` to the local
   Kafka, without an initial snapshot (the preloaded rows are not part of the
   backlog). The apply job is not running, so this process stands in for it: every
   second it reports each change-topic partition as applied up to its high watermark
   on the control topic. Without that, produced records never leave the in-flight
   book, and reading pauses for good at ``max_in_flight_records``.
5. The change topics must hold exactly one record per row change.

Wall time and user + system CPU of each child come from ``os.wait4``, its peak RSS from
``VmHWM`` in ``/proc``, sampled every 0.1 s; they cover that process alone. Not
included, and printed separately: the walsender that decodes the WAL for each drain (its
CPU sampled from ``/proc`` every 0.1 s) and, for capture, the Kafka broker's JVM. On a
machine with few cores those compete with the measured process. ``--profile`` runs the
capture child under cProfile and prints the functions with the most cumulative time; its
timings are then not comparable. ``--python-rows`` runs capture with
``compiled_rows=false`` (every row encoded by the Python path, as without the compiled
row encoder), for comparing the two paths run against run; ``--confluent-producer``
likewise with ``compiled_producer=false`` (confluent-kafka's producer), and
``--python-loop`` with ``compiled_stream=false`` (every frame through the Python loop,
without the compiled stream). ``--debezium`` adds a third
slot, created with the others, and drains it afterwards with Debezium's PostgreSQL
connector in Kafka Connect (:mod:`bench.debezium_drain`): its start-up and steady drain
are reported apart, and capture's rows per CPU second are compared with its steady ones.

Everything created (slots, publication, schema, topics) is dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import pstats
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic, TopicPartition
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench import debezium_drain
from capture.rows import native as native_rows
from capture.service import CaptureService
from capture.settings import CaptureSettings, KafkaSettings, PostgresSettings
from deploy.local import stack
from deploy.local.postgres import find_bindir
from deploy.local.process import read_pid
from runtime import gc_tuning
from schemas.control import AppliedProgress
from schemas.lsn import Lsn, format_lsn, parse_lsn
from schemas.naming import schema_topic, table_topic

Connection = psycopg.Connection[tuple[object, ...]]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TABLES = ("accounts", "tellers", "branches", "history")
PARTITIONS = 3
WORKLOAD_APP = "bench_capture_drain_workload"

# pgbench scale 2: 200 000 accounts, 20 tellers, 2 branches.
SCALE = 2
ACCOUNTS, TELLERS, BRANCHES = 100_000 * SCALE, 10 * SCALE, SCALE
PRELOADED_HISTORY = 50_000

TPCB_WEIGHT, DELETE_WEIGHT = 9, 1
TPCB_CHANGES = 4
PGBENCH_CLIENTS = 2
BATCH_UPDATES, BATCH_INSERTS, BATCH_DELETES = 600, 300, 100
BATCH_CHANGES = BATCH_UPDATES + BATCH_INSERTS + BATCH_DELETES

APPLIED_INTERVAL_S = 1.0
SAMPLE_INTERVAL_S = 0.1
DRAIN_TIMEOUT_S = 1800.0
# Issue 13's targets for the drain on this machine kind (2 cores shared with the
# walsender and the broker).
TARGET_RATIO = 0.5
TARGET_CPU_US_PER_CHANGE = 10.0
TARGET_RSS_MB = 250.0
TARGET_VS_DEBEZIUM = 3.0
"""Issue 13: capture's rows per CPU second at least 3x Debezium's steady ones."""

TPCB_SCRIPT = """\
\\set aid random(1, :naccounts)
\\set bid random(1, :nbranches)
\\set tid random(1, :ntellers)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE accounts SET abalance = abalance + :delta WHERE aid = :aid;
UPDATE tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, now());
END;
"""
DELETE_SCRIPT = """\
DELETE FROM history
WHERE hid = (SELECT hid FROM history ORDER BY hid LIMIT 1 FOR UPDATE SKIP LOCKED);
"""


@dataclass(frozen=True, slots=True)
class Names:
    """Everything this run creates, named after one random schema name."""

    schema: str

    @classmethod
    def unique(cls) -> Names:
        return cls(f"bench_drain_{secrets.token_hex(4)}")

    @property
    def publication(self) -> str:
        return self.schema

    @property
    def capture_slot(self) -> str:
        return f"{self.schema}_capture"

    @property
    def baseline_slot(self) -> str:
        return f"{self.schema}_recvlogical"

    @property
    def debezium_slot(self) -> str:
        return f"{self.schema}_debezium"

    @property
    def control_topic(self) -> str:
        return f"{self.schema}._control"

    @property
    def schema_topic(self) -> str:
        return schema_topic(self.schema)

    def change_topics(self, tables: Sequence[str] = TABLES) -> dict[str, str]:
        """Change topic -> ``schema.table``."""
        return {table_topic(self.schema, self.schema, t): f"{self.schema}.{t}" for t in tables}

    def all_topics(self) -> list[str]:
        debezium = debezium_drain.topics(f"{self.schema}_dbz", self.schema, TABLES)
        return [*self.change_topics(), self.control_topic, self.schema_topic, *debezium]

    def capture_settings(
        self,
        dsn: str,
        bootstrap: str,
        tables: Sequence[str],
        *,
        partitions: int,
        snapshot_mode: Literal["initial", "never"],
        max_in_flight_records: int | None = None,
    ) -> CaptureSettings:
        """The capture's settings for this run's slot, publication and topics, capturing
        ``tables`` of the run's schema."""
        settings = CaptureSettings(
            postgres=PostgresSettings(
                dsn=dsn,
                slot=self.capture_slot,
                publication=self.publication,
                tables=[f"{self.schema}.{t}" for t in tables],
            ),
            kafka=KafkaSettings(
                bootstrap_servers=bootstrap,
                topic_prefix=self.schema,
                control_topic=self.control_topic,
                schema_topic=self.schema_topic,
                partitions=partitions,
            ),
            snapshot_mode=snapshot_mode,
        )
        if max_in_flight_records is None:
            return settings
        return settings.model_copy(update={"max_in_flight_records": max_in_flight_records})


@dataclass(frozen=True, slots=True)
class Backlog:
    changes: int
    transactions: int
    start: Lsn
    end: Lsn


@dataclass(frozen=True, slots=True)
class Usage:
    """What one child process cost, from ``os.wait4``."""

    wall_s: float
    cpu_s: float
    max_rss_bytes: int
    returncode: int


# -- setup ----------------------------------------------------------------------------------


def _workload_dsn(dsn: str, names: Names) -> str:
    return make_conninfo(
        dsn, options=f"-c search_path={names.schema}", application_name=WORKLOAD_APP
    )


def _create_tables(dsn: str, names: Names) -> None:
    schema = sql.Identifier(names.schema)
    with psycopg.connect(_workload_dsn(dsn, names)) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        for table in (
            "branches (bid int PRIMARY KEY, bbalance int, filler char(88))",
            "tellers (tid int PRIMARY KEY, bid int, tbalance int, filler char(84))",
            "accounts (aid int PRIMARY KEY, bid int, abalance int, filler char(84))",
            "history (hid bigserial PRIMARY KEY, tid int, bid int, aid int, delta int, "
            "mtime timestamptz, filler char(22))",
        ):
            conn.execute(sql.SQL("CREATE TABLE {}.").format(schema) + sql.SQL(table))
        for query, count in (
            ("INSERT INTO branches SELECT b, 0, '' FROM generate_series(1, %s) b", BRANCHES),
            (
                "INSERT INTO tellers SELECT t, (t - 1) / 10 + 1, 0, '' "
                "FROM generate_series(1, %s) t",
                TELLERS,
            ),
            (
                "INSERT INTO accounts SELECT a, (a - 1) / 100000 + 1, 0, '' "
                "FROM generate_series(1, %s) a",
                ACCOUNTS,
            ),
        ):
            conn.execute(query, [count])
        conn.execute(
            "INSERT INTO history (tid, bid, aid, delta, mtime) "
            "SELECT h %% %s + 1, h %% %s + 1, h %% %s + 1, 0, now() "
            "FROM generate_series(1, %s) h",
            [TELLERS, BRANCHES, ACCOUNTS, PRELOADED_HISTORY],
        )


def _create_publication_and_slots(admin: Connection, names: Names, debezium: bool = False) -> Lsn:
    """The publication, then the slots back to back (a third for Debezium if asked);
    returns where the slots start."""
    admin.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(names.publication),
            sql.SQL(", ").join(sql.Identifier(names.schema, t) for t in TABLES),
        )
    )
    starts = []
    slots = [names.capture_slot, names.baseline_slot]
    for slot in [*slots, names.debezium_slot] if debezium else slots:
        row = admin.execute(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", [slot]
        ).fetchone()
        assert row is not None
        starts.append(parse_lsn(str(row[0])))
    return Lsn(max(starts))


# -- the backlog ----------------------------------------------------------------------------


def _row_changes(admin: Connection, names: Names) -> int:
    row = admin.execute(
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
        "FROM pg_stat_user_tables WHERE schemaname = %s",
        [names.schema],
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def _settled_row_changes(admin: Connection, names: Names) -> int:
    """Row changes once every workload session is gone and its statistics are flushed
    (a backend flushes them as it exits): two equal reads in a row."""
    deadline = time.monotonic() + 60
    previous = None
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [WORKLOAD_APP]
        ).fetchone()
        current = _row_changes(admin, names)
        if row is not None and row[0] == 0 and current == previous:
            return current
        previous = current
        time.sleep(0.5)
    raise RuntimeError("table statistics did not settle within 60 s")


def _run_pgbench(dsn: str, names: Names, bindir: Path, changes: int) -> int:
    """Run pgbench for about ``changes`` row changes; returns its transaction count."""
    per_transaction = (TPCB_WEIGHT * TPCB_CHANGES + DELETE_WEIGHT) / (TPCB_WEIGHT + DELETE_WEIGHT)
    per_client = max(1, math.ceil(changes / per_transaction / PGBENCH_CLIENTS))
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as scripts:
        tpcb, delete = Path(scripts) / "tpcb.sql", Path(scripts) / "delete.sql"
        tpcb.write_text(TPCB_SCRIPT)
        delete.write_text(DELETE_SCRIPT)
        result = subprocess.run(
            [
                str(bindir / "pgbench"),
                "--no-vacuum",
                f"--client={PGBENCH_CLIENTS}",
                f"--jobs={PGBENCH_CLIENTS}",
                f"--transactions={per_client}",
                f"--define=naccounts={ACCOUNTS}",
                f"--define=ntellers={TELLERS}",
                f"--define=nbranches={BRANCHES}",
                f"--file={tpcb}@{TPCB_WEIGHT}",
                f"--file={delete}@{DELETE_WEIGHT}",
                _workload_dsn(dsn, names),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(f"pgbench failed ({result.returncode}):\n{result.stderr}")
    return per_client * PGBENCH_CLIENTS


def _run_batches(dsn: str, names: Names, batches: int) -> tuple[int, Lsn]:
    """``batches`` transactions of BATCH_CHANGES rows; returns the rows they changed and
    the end of the last one's commit record."""
    changed = 0
    with psycopg.connect(_workload_dsn(dsn, names), autocommit=True) as conn:
        for batch in range(batches):
            first = 1 + batch * BATCH_UPDATES % (ACCOUNTS - BATCH_UPDATES)
            with conn.transaction():
                for query, params in (
                    (
                        "UPDATE accounts SET abalance = abalance + 1 WHERE aid BETWEEN %s AND %s",
                        [first, first + BATCH_UPDATES - 1],
                    ),
                    (
                        "INSERT INTO history (tid, bid, aid, delta, mtime) "
                        "SELECT i %% %s + 1, i %% %s + 1, i %% %s + 1, 1, now() "
                        "FROM generate_series(1, %s) i",
                        [TELLERS, BRANCHES, ACCOUNTS, BATCH_INSERTS],
                    ),
                    (
                        "DELETE FROM history "
                        "WHERE hid IN (SELECT hid FROM history ORDER BY hid LIMIT %s)",
                        [BATCH_DELETES],
                    ),
                ):
                    changed += conn.execute(query, params).rowcount
        # Where the next WAL record goes: right after the commit just made.
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        # One more record past the end, so the server's decoding position can pass it.
        conn.execute("SELECT pg_logical_emit_message(false, %s, '')", [WORKLOAD_APP])
    return changed, parse_lsn(str(row[0]))


def _write_backlog(
    admin: Connection,
    dsn: str,
    names: Names,
    bindir: Path,
    rows: int,
    start: Lsn,
) -> Backlog:
    before = _settled_row_changes(admin, names)
    transactions = _run_pgbench(dsn, names, bindir, rows // 2)
    after_pgbench = _settled_row_changes(admin, names)
    batches = max(1, math.ceil((rows - (after_pgbench - before)) / BATCH_CHANGES))
    batch_changes, end = _run_batches(dsn, names, batches)
    total = _settled_row_changes(admin, names) - before
    if total - (after_pgbench - before) != batch_changes:
        raise RuntimeError(
            f"table statistics count {total - (after_pgbench - before)} row changes for the "
            f"batches, which changed {batch_changes}: the count cannot be trusted"
        )
    return Backlog(total, transactions + batches, start, end)


# -- measuring ------------------------------------------------------------------------------


def _proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process from ``/proc/<pid>/stat``; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # Fields after the command name, which is in parentheses and may hold anything.
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class WalSenderCpu(threading.Thread):
    """CPU seconds of the walsender streaming ``slot``, sampled until it exits."""

    def __init__(self, dsn: str, slot: str) -> None:
        super().__init__(daemon=True)
        self._dsn = dsn
        self._slot = slot
        self._finish = threading.Event()
        self.seconds: float | None = None

    def run(self) -> None:
        pid = None
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while pid is None and not self._finish.is_set():
                row = conn.execute(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    [self._slot],
                ).fetchone()
                pid = None if row is None else row[0]
                if pid is None:
                    time.sleep(0.02)
        while isinstance(pid, int):
            seconds = _proc_cpu_seconds(pid)
            if seconds is None:
                return
            self.seconds = seconds
            if self._finish.wait(SAMPLE_INTERVAL_S):
                # The drain is over: one last sample, taken once the walsender is gone or
                # has had a moment to finish.
                time.sleep(SAMPLE_INTERVAL_S)
                self.seconds = _proc_cpu_seconds(pid) or self.seconds
                return

    def finish(self) -> float | None:
        self._finish.set()
        self.join(10)
        return self.seconds


class AppliedFeeder(threading.Thread):
    """Stands in for the apply job: every ``interval_s`` (APPLIED_INTERVAL_S), reports
    each change-topic partition as applied up to its high watermark, as apply does after
    a Delta commit."""

    def __init__(
        self,
        bootstrap: str,
        names: Names,
        tables: Sequence[str] = TABLES,
        interval_s: float = APPLIED_INTERVAL_S,
    ) -> None:
        super().__init__(daemon=True)
        self._names = names
        self._interval_s = interval_s
        self._tables = tables
        self._done = threading.Event()
        conf = {"bootstrap.servers": bootstrap}
        self._consumer = Consumer({**conf, "group.id": f"{names.schema}-feeder"})
        self._producer = Producer({**conf, "acks": "all"})
        self._reported: dict[tuple[str, int], int] = {}

    def run(self) -> None:
        topics = self._names.change_topics(self._tables)
        existing: dict[str, str] = {}
        while not self._done.wait(self._interval_s):
            if len(existing) < len(topics):
                # Watermarks only of topics the broker lists: after a query for a topic
                # that does not exist yet, the client kept failing for that topic for
                # minutes after capture had created it.
                listed = self._consumer.list_topics(timeout=10).topics
                existing |= {
                    t: table
                    for t, table in topics.items()
                    if t in listed and listed[t].error is None
                }
            for topic, table in existing.items():
                for partition in range(PARTITIONS):
                    high = _high_watermark(self._consumer, topic, partition)
                    if high is None or high <= self._reported.get((topic, partition), 0):
                        continue
                    progress = AppliedProgress(
                        topic, partition, high, None, None, table, None, None
                    )
                    self._producer.produce(
                        self._names.control_topic, progress.value(), progress.key()
                    )
                    self._reported[(topic, partition)] = high
            self._producer.poll(0)

    def close(self) -> None:
        self._done.set()
        self.join(30)
        self._producer.flush(10)
        self._consumer.close()


def _high_watermark(consumer: Consumer, topic: str, partition: int) -> int | None:
    try:
        _, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10, cached=False
        )
    except KafkaException:
        return None  # not created yet
    return int(high)


def _peak_rss_bytes(pid: int) -> int | None:
    """``VmHWM`` of a process: the peak RSS of its current program; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


class PeakRss(threading.Thread):
    """Peak RSS of a running child, sampled until it exits.

    ``ru_maxrss`` from ``wait4`` would not do: it keeps the high-water mark of the memory
    the child had before ``exec``, which is this (parent) process's.
    """

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self._pid = pid
        self.peak = 0

    def run(self) -> None:
        while (sample := _peak_rss_bytes(self._pid)) is not None:
            self.peak = max(self.peak, sample)
            time.sleep(SAMPLE_INTERVAL_S)


def _run_measured(what: str, argv: list[str]) -> Usage:
    """Run ``argv`` to completion; wall time, CPU and peak RSS of that process alone."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, cwd=PROJECT_ROOT)
    peak = PeakRss(proc.pid)
    peak.start()
    # A drain that stalls (e.g. paused by backpressure for good) must not hang the run.
    watchdog = threading.Timer(DRAIN_TIMEOUT_S, proc.kill)
    watchdog.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        watchdog.cancel()
    wall = time.perf_counter() - started
    peak.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if wall >= DRAIN_TIMEOUT_S:
        print(f"{what} did not finish within {DRAIN_TIMEOUT_S:.0f} s and was killed")
    return Usage(wall, usage.ru_utime + usage.ru_stime, peak.peak, proc.returncode)


def _drain_with_pg_recvlogical(
    dsn: str, names: Names, bindir: Path, backlog: Backlog
) -> tuple[Usage, float | None]:
    walsender = WalSenderCpu(dsn, names.baseline_slot)
    walsender.start()
    usage = _run_measured(
        "pg_recvlogical",
        [
            str(bindir / "pg_recvlogical"),
            f"--dbname={dsn}",
            f"--slot={names.baseline_slot}",
            "--start",
            "--no-loop",
            "--option=proto_version=1",
            f"--option=publication_names={names.publication}",
            f"--endpos={format_lsn(backlog.end)}",
            "--file=/dev/null",
        ],
    )
    return usage, walsender.finish()


def _capture_settings(
    dsn: str,
    bootstrap: str,
    names: Names,
    compiled_rows: bool = True,
    producer: dict[str, str] | None = None,
    compiled_producer: bool = True,
    compiled_stream: bool = True,
) -> CaptureSettings:
    # The backlog is the measured work: rows that existed before the slot are not part
    # of it, so no initial snapshot.
    settings = names.capture_settings(
        dsn, bootstrap, TABLES, partitions=PARTITIONS, snapshot_mode="never"
    )
    kafka = settings.kafka.model_copy(update={"producer": producer or {}})
    return settings.model_copy(
        update={
            "compiled_rows": compiled_rows,
            "kafka": kafka,
            "compiled_producer": compiled_producer,
            "compiled_stream": compiled_stream,
        }
    )


def _drain_with_capture(
    dsn: str,
    bootstrap: str,
    kafka_pid: int | None,
    names: Names,
    backlog: Backlog,
    profile: Path | None,
    compiled_rows: bool = True,
    producer: dict[str, str] | None = None,
    compiled_producer: bool = True,
    compiled_stream: bool = True,
) -> tuple[Usage, float | None, float | None]:
    """Returns the child's usage, the walsender's CPU and the Kafka broker's CPU."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # Created here so the stand-in for apply can report before capture's first record.
    admin.create_topics(
        [NewTopic(names.control_topic, 1, 1, config={"cleanup.policy": "compact"})]
    )[names.control_topic].result(30)
    settings = _capture_settings(
        dsn, bootstrap, names, compiled_rows, producer, compiled_producer, compiled_stream
    )
    profiler = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    argv = [
        sys.executable,
        *profiler,
        "-m",
        "bench.capture_drain",
        f"--capture-settings={settings.model_dump_json()}",
        f"--stop-at={format_lsn(backlog.end)}",
    ]
    feeder = AppliedFeeder(bootstrap, names)
    walsender = WalSenderCpu(dsn, names.capture_slot)
    broker_before = None if kafka_pid is None else _proc_cpu_seconds(kafka_pid)
    feeder.start()
    walsender.start()
    try:
        usage = _run_measured("capture", argv)
    finally:
        feeder.close()
    broker_after = None if kafka_pid is None else _proc_cpu_seconds(kafka_pid)
    broker = None
    if broker_before is not None and broker_after is not None:
        broker = broker_after - broker_before
    return usage, walsender.finish(), broker


def capture_child(settings_json: str, stop_at: str) -> None:
    """The measured capture process: drain the slot up to ``stop_at`` and exit."""
    logging.basicConfig(level=logging.WARNING, format="capture: %(levelname)s %(message)s")
    settings = CaptureSettings.model_validate_json(settings_json)
    threads = ThreadCpu()
    threads.start()
    service = CaptureService(settings, threading.Event(), stop_at=parse_lsn(stop_at))
    gc_tuning.tune_for_streaming()  # as ``python -m capture`` does before it runs
    try:
        service.run()
    finally:
        threads.stop()
        print(f"capture CPU by thread: {threads.summary()}", file=sys.stderr)


class ThreadCpu(threading.Thread):
    """User + system CPU of each thread of this process, sampled from /proc every 0.2 s
    (a thread's total is gone from /proc once it exits, so the last sample stands):
    where capture's CPU goes between its Python thread and librdkafka's."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self._seconds: dict[tuple[int, str], float] = {}
        self._done = threading.Event()
        self._ticks = os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        while not self._done.wait(0.2):
            self._sample()

    def stop(self) -> None:
        self._done.set()
        self.join()
        self._sample()

    def _sample(self) -> None:
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError):
                stat = (task / "stat").read_text()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                # utime and stime are fields 14 and 15 of stat(5), 12 and 13 after comm.
                seconds = (int(fields[11]) + int(fields[12])) / self._ticks
                self._seconds[(int(task.name), name)] = seconds

    def summary(self) -> str:
        main_tid = os.getpid()
        by_kind: dict[str, float] = {}
        for (tid, name), seconds in self._seconds.items():
            kind = "python main" if tid == main_tid else name.split("#")[0].split("/")[0]
            by_kind[kind] = by_kind.get(kind, 0.0) + seconds
        ranked = sorted(by_kind.items(), key=lambda item: -item[1])
        return ", ".join(f"{kind} {seconds:.1f} s" for kind, seconds in ranked if seconds >= 0.05)


def _records_in(bootstrap: str, names: Names, tables: Sequence[str] = TABLES) -> int:
    return _records_in_topics(bootstrap, names, list(names.change_topics(tables)))


def _records_in_topics(bootstrap: str, names: Names, topics: Sequence[str]) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{names.schema}-count"})
    try:
        return sum(
            _high_watermark(consumer, topic, partition) or 0
            for topic in topics
            for partition in range(PARTITIONS)
        )
    finally:
        consumer.close()


# -- cleanup --------------------------------------------------------------------------------


def _drop_postgres_objects(admin: Connection, names: Names) -> None:
    for slot in (names.capture_slot, names.baseline_slot, names.debezium_slot):
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    [slot],
                )
                break
            except psycopg.errors.ObjectInUse:
                # The walsender of a finished drain may take a moment to exit.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    admin.execute(
        sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(names.publication))
    )
    admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(names.schema)))


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


# -- report ---------------------------------------------------------------------------------


def _print_profile(path: Path) -> None:
    stats = pstats.Stats(str(path))
    print("\ncapture child under cProfile, by cumulative time:")
    stats.sort_stats("cumulative").print_stats(30)
    print("by own time:")
    stats.sort_stats("tottime").print_stats(20)


def _report(
    backlog: Backlog,
    baseline: tuple[Usage, float | None],
    ours: tuple[Usage, float | None, float | None],
    records: int,
    profiled: bool,
) -> bool:
    """Print the results; returns whether the run is valid (drains and counts succeeded)."""
    rows = backlog.changes
    (base, base_walsender), (capture, capture_walsender, broker) = baseline, ours

    def seconds(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1f}"

    print(
        f"\nbacklog: {rows} row changes in {backlog.transactions} transactions, "
        f"{(backlog.end - backlog.start) / 1e6:.0f} MB of WAL "
        f"({format_lsn(backlog.start)} .. {format_lsn(backlog.end)})"
    )
    header = (
        f"{'drain':26} {'wall s':>7} {'rows/s':>9} {'vs base':>8} {'CPU s':>6} "
        f"{'CPU us/chg':>10} {'peak RSS MB':>11} {'walsender CPU s':>15}"
    )
    print(header)
    base_rate, capture_rate = rows / base.wall_s, rows / capture.wall_s
    for name, usage, rate, walsender in (
        ("pg_recvlogical (baseline)", base, base_rate, base_walsender),
        ("capture", capture, capture_rate, capture_walsender),
    ):
        print(
            f"{name:26} {usage.wall_s:7.1f} {rate:9.0f} {rate / base_rate:7.2f}x "
            f"{usage.cpu_s:6.1f} {usage.cpu_s / rows * 1e6:10.1f} "
            f"{usage.max_rss_bytes / 1e6:11.1f} {seconds(walsender):>15}"
        )
    print(f"Kafka broker CPU during capture (not in the capture row): {seconds(broker)} s")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    valid = base.returncode == 0 and capture.returncode == 0 and records == rows
    print(
        f"records in the change topics: {records} "
        f"({'one per row change' if records == rows else f'EXPECTED {rows}'})"
    )
    if base.returncode != 0:
        print(f"pg_recvlogical FAILED with exit code {base.returncode}")
    if capture.returncode != 0:
        print(f"capture FAILED with exit code {capture.returncode}")
    if profiled:
        print("capture ran under cProfile: its time, CPU and ratio are not comparable")
        return valid
    ratio, rss_mb = capture_rate / base_rate, capture.max_rss_bytes / 1e6
    print(
        f"target capture/pg_recvlogical >= {TARGET_RATIO}: "
        f"{'met' if ratio >= TARGET_RATIO else 'NOT met'} ({ratio:.2f})"
    )
    cpu_us = capture.cpu_s / rows * 1e6
    print(
        f"target capture CPU per change <= {TARGET_CPU_US_PER_CHANGE:.0f} us: "
        f"{'met' if cpu_us <= TARGET_CPU_US_PER_CHANGE else 'NOT met'} ({cpu_us:.1f} us)"
    )
    print(
        f"target capture peak RSS <= {TARGET_RSS_MB:.0f} MB: "
        f"{'met' if rss_mb <= TARGET_RSS_MB else 'NOT met'} ({rss_mb:.0f} MB)"
    )
    return valid


def _report_debezium(backlog: Backlog, capture: Usage, peer: debezium_drain.DebeziumRun) -> bool:
    """Print Debezium's row and the per-CPU-second comparison; whether it was valid."""
    rows = backlog.changes
    print(
        f"\n{'drain':26} {'start-up s':>10} {'steady s':>9} {'rows/s':>9} "
        f"{'start-up CPU s':>14} {'steady CPU s':>12} {'CPU us/chg':>10}"
    )
    print(
        f"{'Debezium (steady)':26} {peer.startup_s:10.1f} {peer.steady_s:9.1f} "
        f"{rows / peer.steady_s:9.0f} {peer.startup_cpu_s:14.1f} {peer.steady_cpu_s:12.1f} "
        f"{peer.steady_cpu_s / rows * 1e6:10.1f}"
    )
    print(
        f"{'capture (whole run)':26} {'':>10} {capture.wall_s:9.1f} {rows / capture.wall_s:9.0f} "
        f"{'':>14} {capture.cpu_s:12.1f} {capture.cpu_s / rows * 1e6:10.1f}"
    )
    per_cpu = peer.steady_cpu_s / capture.cpu_s
    verdict = "met" if per_cpu >= TARGET_VS_DEBEZIUM else "NOT met"
    print(
        f"capture rows per CPU second vs Debezium's steady rows per CPU second: {per_cpu:.2f}x "
        f"(target >= {TARGET_VS_DEBEZIUM}: {verdict}); "
        f"wall rate {peer.steady_s / capture.wall_s:.2f}x"
    )
    valid = peer.records == rows
    print(
        f"records in Debezium's topics: {peer.records} "
        f"({'one per row change' if valid else f'EXPECTED {rows}'})"
    )
    return valid


def _producer_properties(pairs: Sequence[str]) -> dict[str, str]:
    properties: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--producer takes PROPERTY=VALUE, not {pair!r}")
        properties[name] = value
    return properties


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--rows", type=int, default=1_000_000, help="row changes in the backlog (at least)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="run the capture child under cProfile"
    )
    parser.add_argument(
        "--python-rows",
        action="store_true",
        help="capture with compiled_rows=false: every row encoded by the Python path",
    )
    parser.add_argument(
        "--confluent-producer",
        action="store_true",
        help="capture with compiled_producer=false: confluent-kafka's producer",
    )
    parser.add_argument(
        "--python-loop",
        action="store_true",
        help="capture with compiled_stream=false: every frame through the Python loop",
    )
    parser.add_argument(
        "--debezium",
        action="store_true",
        help="also drain the backlog with Debezium's connector (bench/debezium_drain.py)",
    )
    parser.add_argument(
        "--producer",
        action="append",
        default=[],
        metavar="PROPERTY=VALUE",
        help="a librdkafka property for capture's producer (kafka.producer), repeatable",
    )
    parser.add_argument("--capture-settings", help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.capture_settings is not None:
        capture_child(args.capture_settings, args.stop_at)
        return

    state = stack.up()
    dsn, bootstrap = state.postgres.dsn, state.kafka.bootstrap_servers
    bindir = find_bindir()
    names = Names.unique()
    print(f"schema {names.schema}, {os.cpu_count()} CPUs, writing the backlog...")
    with (
        psycopg.connect(dsn, autocommit=True) as admin,
        contextlib.ExitStack() as cleanup,
        tempfile.TemporaryDirectory(prefix="bench-drain-") as scratch,
    ):
        cleanup.callback(_delete_topics, bootstrap, names)
        cleanup.callback(_drop_postgres_objects, admin, names)
        _create_tables(dsn, names)
        start = _create_publication_and_slots(admin, names, args.debezium)
        backlog = _write_backlog(admin, dsn, names, bindir, args.rows, start)
        print(f"draining {backlog.changes} row changes with pg_recvlogical...")
        baseline = _drain_with_pg_recvlogical(dsn, names, bindir, backlog)
        encoder = "Python path" if args.python_rows else "compiled row encoder"
        if not args.python_rows and not native_rows.AVAILABLE:
            encoder = "Python path: capture_native is not built (make native)"
        print(f"draining them with capture ({encoder})...")
        profile = Path(scratch) / "capture.prof" if args.profile else None
        kafka_pid = read_pid(state.kafka.pid_file)
        ours = _drain_with_capture(
            dsn,
            bootstrap,
            kafka_pid,
            names,
            backlog,
            profile,
            not args.python_rows,
            _producer_properties(args.producer),
            not args.confluent_producer,
            not args.python_loop,
        )
        records = _records_in(bootstrap, names)
        valid = _report(backlog, baseline, ours, records, args.profile)
        if profile is not None and profile.exists():
            _print_profile(profile)
        if args.debezium:
            print("draining them with Debezium (Kafka Connect standalone)...")
            peer = debezium_drain.drain(
                dsn=dsn,
                bootstrap=bootstrap,
                slot=names.debezium_slot,
                publication=names.publication,
                schema=names.schema,
                tables=TABLES,
                partitions=PARTITIONS,
                changes=backlog.changes,
                workdir=Path(scratch) / "debezium",
                records_in=lambda topics: _records_in_topics(bootstrap, names, topics),
                cpu_seconds=_proc_cpu_seconds,
                timeout_s=DRAIN_TIMEOUT_S,
            )
            valid = _report_debezium(backlog, ours[0], peer) and valid
    if not valid:
        sys.exit(1)


if __name__ == "__main__":
    main()
