"""Capture and ONE transaction of a million row changes: memory stays bounded, and, with
``--live``, how soon after its commit the last record is in Kafka, today and streamed.

Usage: ``.venv/bin/python -m bench.capture_large_transaction [--rows N] [--bound B]``
and ``.venv/bin/python -m bench.capture_large_transaction --live [--rows N] [--bound B]
[--work-mem SIZE]``

On the local stack, in a fresh schema: a table shaped like pgbench's ``accounts``
(``aid int`` primary key, ``bid int``, ``abalance int``, ``filler char(84)``), a
publication and a pgoutput slot, then a single ``INSERT ... SELECT generate_series(1,
N)`` transaction. Capture runs in a child process (``max_in_flight_records`` = B,
``acks=all``, no initial snapshot) while this process stands in for the apply job, as in
:mod:`bench.capture_drain`: every second it writes, on the control topic, each
change-topic partition as applied up to its high watermark. Capture releases in-flight
records as they are applied, before the transaction's Commit arrives; were it to release
only whole transactions, reading would pause for good at B records and the run would
time out.

**Drain** (the default). The transaction is written with nothing reading the slot; then
capture drains it (``stop_at`` = its end). Without streaming PostgreSQL sends a
transaction only once it has committed, so all N changes arrive between one Begin and
one Commit; the walsender spills them to disk, not capture. Reported: wall time, rows/s,
CPU, peak RSS (``VmHWM`` of the child, sampled every 0.1 s), and the records in the
topic, which must be exactly N.

**Live** (``--live``, docs/streaming.md "Bench plan"). Capture streams the slot *while*
the transaction is written, twice in the same run, each time in a fresh schema: today's
path, then with ``CAPTURE_STREAMING``. Reported per run: the write's time; **commit to
last record**, from COMMIT returning to the Kafka timestamp of the transaction's last
record (the latest of its partitions' last records: when capture produced it); the
slot's ``spill_txns``/``spill_bytes`` and ``stream_txns``/``stream_bytes`` from
``pg_stat_replication_slots``; capture's peak RSS; the spool's peak size on disk (the
child's open files in its spool directory, sampled every 0.1 s); the records, exactly N;
then the ratios streaming/today. The server streams a transaction once it outgrows
``logical_decoding_work_mem`` (64 MB by default: a few hundred thousand rows of this table);
``--work-mem`` sets it for capture's walsender alone, through a role of the run's own,
to see streaming with fewer rows. One ``INSERT ... SELECT`` writes WAL faster than a
walsender decodes it (200,000 rows in 0.2 s), so at its COMMIT most of the transaction
is not decoded yet, streamed or not, and both modes spend the time after it decoding;
``--write-s S`` spreads the writing over about S seconds (a batch job's transaction),
which is the case streaming is for.

Everything created is dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic, TopicPartition
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench.capture_drain import (
    DRAIN_TIMEOUT_S,
    PARTITIONS,
    PROJECT_ROOT,
    SAMPLE_INTERVAL_S,
    WORKLOAD_APP,
    AppliedFeeder,
    Names,
    PeakRss,
    Usage,
    WalSenderCpu,
    _delete_topics,
    _drop_postgres_objects,
    _high_watermark,
    _records_in,
    _run_measured,
    _workload_dsn,
)
from capture.service import CaptureService
from capture.settings import CaptureSettings
from deploy.local import stack
from runtime import gc_tuning
from schemas.lsn import Lsn, format_lsn, parse_lsn

TABLE = "accounts"
TARGET_RSS_MB = 250.0
TARGET_COMMIT_TO_LAST_RATIO = 0.2
"""Streaming's commit-to-last-record time against today's, at most (docs/streaming.md)."""


def _prepare(admin: psycopg.Connection[tuple[object, ...]], dsn: str, names: Names) -> None:
    """Schema, table, publication and slot, before the transaction is written."""
    schema = sql.Identifier(names.schema)
    with psycopg.connect(_workload_dsn(dsn, names)) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.{} (aid int PRIMARY KEY, bid int, abalance int, filler char(84))"
            ).format(schema, sql.Identifier(TABLE))
        )
    admin.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(names.publication), sql.Identifier(names.schema, TABLE)
        )
    )
    admin.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [names.capture_slot])


_STATEMENT_ROWS = 10_000
"""Rows per INSERT when the transaction's writing is spread over time (``--write-s``)."""


def _write_transaction(
    dsn: str, names: Names, rows: int, spread_s: float = 0.0
) -> tuple[Lsn, float]:
    """One transaction inserting ``rows`` rows; returns the end of its commit record and
    when COMMIT returned (Unix time). With ``spread_s``, the rows go in statements of
    ``_STATEMENT_ROWS``, paced to take about that long (a batch job's transaction, which
    the server can stream while it runs); else in one statement, which writes WAL faster
    than a walsender decodes it."""
    insert = sql.SQL(
        "INSERT INTO {} SELECT a, (a - 1) / 100000 + 1, a %% 5000, '' "
        "FROM generate_series(%s::int, %s::int) a"
    ).format(sql.Identifier(TABLE))
    with psycopg.connect(_workload_dsn(dsn, names), autocommit=True) as conn:
        with conn.transaction():
            step = _STATEMENT_ROWS if spread_s > 0 else rows
            started = time.monotonic()
            inserted = 0
            for first in range(1, rows + 1, step):
                last = min(rows, first + step - 1)
                inserted += conn.execute(insert, [first, last]).rowcount
                # On schedule: the share of spread_s the rows written so far stand for.
                ahead = started + spread_s * last / rows - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        committed_at = time.time()
        if inserted != rows:
            raise RuntimeError(f"inserted {inserted} rows, wanted {rows}")
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        # One more record past the end, so the server's decoding position can pass it.
        conn.execute("SELECT pg_logical_emit_message(false, %s, '')", [WORKLOAD_APP])
    return parse_lsn(str(row[0])), committed_at


def _settings(dsn: str, bootstrap: str, names: Names, bound: int) -> CaptureSettings:
    return names.capture_settings(
        dsn,
        bootstrap,
        [TABLE],
        partitions=PARTITIONS,
        snapshot_mode="never",
        max_in_flight_records=bound,
    )


def _drain(dsn: str, bootstrap: str, names: Names, end: Lsn, bound: int) -> tuple[Usage, float]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [NewTopic(names.control_topic, 1, 1, config={"cleanup.policy": "compact"})]
    )[names.control_topic].result(30)
    settings = _settings(dsn, bootstrap, names, bound)
    feeder = AppliedFeeder(bootstrap, names, (TABLE,))
    walsender = WalSenderCpu(dsn, names.capture_slot)
    feeder.start()
    walsender.start()
    try:
        usage = _run_measured(
            "capture",
            [
                sys.executable,
                "-m",
                "bench.capture_drain",
                f"--capture-settings={settings.model_dump_json()}",
                f"--stop-at={format_lsn(end)}",
            ],
        )
    finally:
        feeder.close()
    return usage, walsender.finish() or 0.0


# -- live: capture runs while the transaction is written --------------------------------


@dataclass(frozen=True, slots=True)
class LiveRun:
    """One live run's numbers (``--live``)."""

    mode: str
    write_s: float
    """From the INSERT's start to COMMIT returning."""
    commit_to_last_s: float
    """From COMMIT returning to the Kafka timestamp of the transaction's last record."""
    slot: SlotStats
    peak_rss_bytes: int
    spool_peak_bytes: int
    records: int
    returncode: int


@dataclass(frozen=True, slots=True)
class SlotStats:
    """The slot's row of ``pg_stat_replication_slots``: what the server spilled to its disk
    and what it streamed."""

    spill_txns: int
    spill_bytes: int
    stream_txns: int
    stream_bytes: int

    @classmethod
    def read(cls, admin: psycopg.Connection[tuple[object, ...]], slot: str) -> SlotStats:
        row = admin.execute(
            "SELECT spill_txns, spill_bytes, stream_txns, stream_bytes "
            "FROM pg_stat_replication_slots WHERE slot_name = %s",
            [slot],
        ).fetchone()
        if row is None:
            return cls(0, 0, 0, 0)
        spill_txns, spill_bytes, stream_txns, stream_bytes = (int(str(v)) for v in row)
        return cls(spill_txns, spill_bytes, stream_txns, stream_bytes)


class SpoolSize(threading.Thread):
    """The most bytes a running child held open in ``directory``, sampled until it
    exits. The spools are unnamed files (gone with the process), seen only through the
    child's open descriptors."""

    def __init__(self, pid: int, directory: Path) -> None:
        super().__init__(daemon=True)
        self._fds = Path(f"/proc/{pid}/fd")
        self._directory = str(directory)
        self.peak = 0

    def run(self) -> None:
        while (sample := self._sample()) is not None:
            self.peak = max(self.peak, sample)
            time.sleep(SAMPLE_INTERVAL_S)

    def _sample(self) -> int | None:
        try:
            fds = list(self._fds.iterdir())
        except OSError:
            return None  # the child is gone
        # By file, not by descriptor: a replay reads its spool through a descriptor of
        # its own (native/src/spool_replay.rs).
        sizes: dict[tuple[int, int], int] = {}
        for fd in fds:
            with contextlib.suppress(OSError):
                if str(fd.readlink()).startswith(self._directory):
                    stat = fd.stat()
                    sizes[(stat.st_dev, stat.st_ino)] = stat.st_size
        return sum(sizes.values())


def _decoding_role(
    admin: psycopg.Connection[tuple[object, ...]], names: Names, work_mem: str
) -> str:
    """A superuser role of the run's own whose sessions (capture's walsender among them)
    decode with ``logical_decoding_work_mem = work_mem``: a replication connection takes
    no session option from capture's DSN, and the server's setting is left alone."""
    role = f"{names.schema}_capture"
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(role)))
    admin.execute(
        sql.SQL("ALTER ROLE {} SET logical_decoding_work_mem = {}").format(
            sql.Identifier(role), sql.Literal(work_mem)
        )
    )
    return role


def _drop_role(admin: psycopg.Connection[tuple[object, ...]], role: str) -> None:
    admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _last_record_time(bootstrap: str, names: Names, rows: int, timeout_s: float) -> float:
    """Once the change topic holds ``rows`` records: the latest timestamp (Unix time) of
    the last record of each partition, the moment the transaction's last record was
    produced."""
    topic = next(iter(names.change_topics((TABLE,))))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{names.schema}-last"})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            ends = {p: _high_watermark(consumer, topic, p) or 0 for p in range(PARTITIONS)}
            if sum(ends.values()) >= rows:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic} holds {sum(ends.values())} of {rows} records")
            time.sleep(0.2)
        latest = 0.0
        for partition, end in ends.items():
            if end == 0:
                continue
            consumer.assign([TopicPartition(topic, partition, end - 1)])
            message = consumer.poll(30)
            if message is None or message.error() is not None:
                raise RuntimeError(f"cannot read the last record of {topic}[{partition}]")
            _, millis = message.timestamp()
            latest = max(latest, millis / 1000)
        return latest
    finally:
        consumer.close()


def _live(dsn: str, bootstrap: str, args: argparse.Namespace, streaming: bool) -> LiveRun:
    """Capture streams the slot while the transaction is written: today's path, or with
    ``CAPTURE_STREAMING``; everything the run made is dropped after it."""
    mode = "streaming" if streaming else "today"
    names = Names.unique()
    with (
        psycopg.connect(dsn, autocommit=True) as admin,
        contextlib.ExitStack() as cleanup,
        tempfile.TemporaryDirectory(prefix="bench-spool-") as spool,
    ):
        cleanup.callback(_delete_topics, bootstrap, names)
        cleanup.callback(_drop_postgres_objects, admin, names)
        _prepare(admin, dsn, names)
        capture_dsn = dsn
        if args.work_mem is not None:
            role = _decoding_role(admin, names, args.work_mem)
            cleanup.callback(_drop_role, admin, role)
            capture_dsn = make_conninfo(dsn, user=role)
        admin_client = AdminClient({"bootstrap.servers": bootstrap})
        admin_client.create_topics(
            [NewTopic(names.control_topic, 1, 1, config={"cleanup.policy": "compact"})]
        )[names.control_topic].result(30)
        settings = _settings(capture_dsn, bootstrap, names, args.bound)
        settings = settings.model_copy(
            update={
                "streaming": streaming,
                "spool_dir": Path(spool),
                # The bound in records decides, not the one in bytes (256 MiB, some 1.5M
                # records of this table): a record is well under 1 KiB.
                "max_in_flight_bytes": max(settings.max_in_flight_bytes, args.bound * 1024),
            }
        )
        feeder = AppliedFeeder(bootstrap, names, (TABLE,))
        feeder.start()
        cleanup.callback(feeder.close)
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.capture_large_transaction",
                f"--capture-settings={settings.model_dump_json()}",
            ],
            stdin=subprocess.DEVNULL,
            cwd=PROJECT_ROOT,
        )
        peak, spooled = PeakRss(child.pid), SpoolSize(child.pid, Path(spool))
        peak.start()
        spooled.start()
        try:
            _wait_streaming(admin, names.capture_slot, child)
            print(
                f"{mode}: capture streams the slot; writing {args.rows} rows in one "
                f"transaction (over {args.write_s:g} s)"
            )
            started = time.time()
            _, committed_at = _write_transaction(dsn, names, args.rows, args.write_s)
            last = _last_record_time(bootstrap, names, args.rows, DRAIN_TIMEOUT_S)
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(120)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            peak.join()
            spooled.join()
        slot = SlotStats.read(admin, names.capture_slot)
        records = _records_in(bootstrap, names, (TABLE,))
    return LiveRun(
        mode,
        committed_at - started,
        last - committed_at,
        slot,
        peak.peak,
        spooled.peak,
        records,
        child.returncode,
    )


def _wait_streaming(
    admin: psycopg.Connection[tuple[object, ...]], slot: str, child: subprocess.Popen[bytes]
) -> None:
    """Until the capture child's walsender streams (past its slot's consistent point)."""
    deadline = time.monotonic() + 120
    while True:
        row = admin.execute(
            "SELECT r.state FROM pg_replication_slots s "
            "JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = %s",
            [slot],
        ).fetchone()
        if row is not None and row[0] in ("catchup", "streaming"):
            return
        if child.poll() is not None:
            raise RuntimeError(f"capture exited with {child.returncode} before streaming")
        if time.monotonic() > deadline:
            raise RuntimeError("capture never started streaming")
        time.sleep(0.1)


def _live_child(settings_json: str) -> None:
    """The capture process of a live run: streams until SIGTERM, then stops gracefully."""
    logging.basicConfig(level=logging.WARNING, format="capture: %(levelname)s %(message)s")
    settings = CaptureSettings.model_validate_json(settings_json)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    gc_tuning.tune_for_streaming()  # as ``python -m capture`` does before it runs
    CaptureService(settings, stop).run()


def _report_live(rows: int, runs: list[LiveRun]) -> bool:
    """Print the runs side by side and the ratios streaming/today; True when each run
    published exactly ``rows`` records and exited cleanly."""
    print(f"\none transaction of {rows} rows, capture running while it is written:")
    print(
        f"{'mode':<10} {'write s':>8} {'commit->last s':>15} {'spill txns':>10} "
        f"{'spill MB':>9} {'stream txns':>11} {'stream MB':>10} {'peak RSS MB':>12} "
        f"{'spool MB':>9} {'records':>9}"
    )
    for run in runs:
        slot = run.slot
        print(
            f"{run.mode:<10} {run.write_s:>8.1f} {run.commit_to_last_s:>15.2f} "
            f"{slot.spill_txns:>10} {slot.spill_bytes / 1e6:>9.1f} {slot.stream_txns:>11} "
            f"{slot.stream_bytes / 1e6:>10.1f} {run.peak_rss_bytes / 1e6:>12.1f} "
            f"{run.spool_peak_bytes / 1e6:>9.1f} {run.records:>9}"
        )
    by_mode = {run.mode: run for run in runs}
    today, streaming = by_mode.get("today"), by_mode.get("streaming")
    if today is not None and streaming is not None:

        def ratio(ours: float, theirs: float) -> str:
            return f"{ours / theirs:.2f}x" if theirs > 0 else "n/a"

        commit = ratio(streaming.commit_to_last_s, today.commit_to_last_s)
        print(
            f"streaming/today: commit to last record {commit} "
            f"(target <= {TARGET_COMMIT_TO_LAST_RATIO}x), peak RSS "
            f"{ratio(streaming.peak_rss_bytes, today.peak_rss_bytes)}, write "
            f"{ratio(streaming.write_s, today.write_s)}"
        )
        if streaming.slot.spill_txns:
            print(
                f"streaming: the server still spilled {streaming.slot.spill_txns} "
                f"transaction(s), {streaming.slot.spill_bytes} bytes"
            )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ok = True
    for run in runs:
        if run.records != rows or run.returncode != 0:
            print(f"FAILED ({run.mode}): exit code {run.returncode}, {run.records} records")
            ok = False
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the transaction")
    parser.add_argument(
        "--bound", type=int, default=100_000, help="max_in_flight_records of the capture run"
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="capture runs while the transaction is written: today's path, then streaming",
    )
    parser.add_argument(
        "--work-mem",
        help="with --live: logical_decoding_work_mem of capture's walsender (e.g. 64kB)",
    )
    parser.add_argument(
        "--write-s",
        type=float,
        default=0.0,
        help=(
            "with --live: spread the transaction's writing over about this many seconds, "
            f"in INSERTs of {_STATEMENT_ROWS} rows (0: one INSERT)"
        ),
    )
    parser.add_argument("--capture-settings", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.capture_settings is not None:
        _live_child(args.capture_settings)
        return
    state = stack.up()
    dsn, bootstrap = state.postgres.dsn, state.kafka.bootstrap_servers
    if args.live:
        runs = [_live(dsn, bootstrap, args, streaming) for streaming in (False, True)]
        if not _report_live(args.rows, runs):
            sys.exit(1)
        return
    _drain_one(dsn, bootstrap, args)


def _drain_one(dsn: str, bootstrap: str, args: argparse.Namespace) -> None:
    """The default mode: the transaction written, then drained (module docstring)."""
    names = Names.unique()
    print(f"schema {names.schema}: one transaction of {args.rows} inserts...")
    with (
        psycopg.connect(dsn, autocommit=True) as admin,
        contextlib.ExitStack() as cleanup,
    ):
        cleanup.callback(_delete_topics, bootstrap, names)
        cleanup.callback(_drop_postgres_objects, admin, names)
        _prepare(admin, dsn, names)
        end, _ = _write_transaction(dsn, names, args.rows)
        print(f"draining it with capture (max_in_flight_records={args.bound})...")
        usage, walsender = _drain(dsn, bootstrap, names, end, args.bound)
        records = _records_in(bootstrap, names, (TABLE,))
    rate = args.rows / usage.wall_s
    rss_mb = usage.max_rss_bytes / 1e6
    print(
        f"\nwall {usage.wall_s:.1f} s, {rate:.0f} rows/s, CPU {usage.cpu_s:.1f} s "
        f"({usage.cpu_s / args.rows * 1e6:.1f} us per change), peak RSS {rss_mb:.1f} MB, "
        f"walsender CPU {walsender:.1f} s"
    )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"records in the change topic: {records} "
        f"({'one per row change' if records == args.rows else f'EXPECTED {args.rows}'})"
    )
    print(
        f"target capture peak RSS <= {TARGET_RSS_MB:.0f} MB: "
        f"{'met' if rss_mb <= TARGET_RSS_MB else 'NOT met'} ({rss_mb:.0f} MB)"
    )
    if usage.returncode != 0 or records != args.rows:
        print(f"FAILED: exit code {usage.returncode}, {records} records")
        sys.exit(1)


if __name__ == "__main__":
    main()
