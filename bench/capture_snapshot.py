"""Capture's initial snapshot of a big table against a plain COPY of the same table.

Usage: ``.venv/bin/python -m bench.capture_snapshot [--rows N] [--workers N [N ...]]
[--pace kafka|lake [...]] [--producer compiled|confluent [...]] [--applied-every S]
[--kill-at F] [--python-rows]``

``--producer``: the producers to run with (``compiled_producer``), each with every
``--pace`` and ``--workers`` value; ``confluent`` is confluent-kafka's producer.

``--python-rows``: capture with ``compiled_rows=false`` (every row encoded by the Python
path, as without the compiled row encoder), to compare the two run against run.

``--pace``: ``snapshot_pace`` values to run, each with every ``--workers`` value (the
first run is the one the others are compared with). ``--applied-every``: how often the
apply stand-in reports what it applied (1 s by default; a real apply job commits a
micro-batch every few seconds at best, so paced by the lake a snapshot cannot read more
than ``max_in_flight_records`` rows per interval).

On the local stack, in a fresh schema: a table shaped like pgbench's ``accounts`` (``aid
int`` primary key, ``bid int``, ``abalance int``, ``filler char(84)``) filled with N
rows, and nothing else. Then, in the same run:

- **baseline**: ``COPY (SELECT aid, bid, abalance, filler FROM accounts) TO STDOUT`` read
  to its end by psycopg in this process and thrown away -- what reading the rows costs
  before anything is done with them, the floor under any snapshot;
- **capture**: ``python -m capture``'s service in a child process with
  ``snapshot_mode=initial`` (it creates the publication and the slot, takes the exported
  snapshot, parses every row with the stream's parsers, encodes it and produces it with
  ``acks=all``), stopping by itself once the table is streaming (``stop_at``: the WAL
  position after the load), with ``--workers`` snapshot workers. Wall time, CPU and peak
  RSS are the child's; its CPU includes its snapshot worker processes (it reaps them,
  and ``wait4`` counts reaped descendants), its peak RSS does not. This process
  stands in for the apply job as in :mod:`bench.capture_drain` (applied offsets on the
  control topic every ``--applied-every`` seconds): snapshot rows count against the
  in-flight bound until delivered, or with ``--pace lake`` until applied.

The topic must hold exactly N records afterwards. Everything created is dropped.

Beside capture's own CPU, the Kafka broker's and the PostgreSQL cluster's during the
run are read from ``/proc`` (the cluster's includes backends that exited, through the
postmaster's reaped-children times). Their sum per row gives the rate the machine's
cores allow at that cost: on a small machine where the services share the cores with
capture, that, not capture, bounds what more workers can add.

``--kill-at F`` adds a **resume** run, with the last ``--workers`` value, on a table of
its own: the capture child is killed with SIGKILL once the change topic holds F x N
records, then started again on the same slot and control topic, and runs to the end.
Every row reaches the topic once, plus the rows of the chunks read again after the kill
(docs/capture.md, "Resuming a snapshot"); so the rows read twice are the records in the
topic minus N, compared with the issue's bound, workers x ``snapshot_chunk_rows``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from bench.capture_drain import (
    DRAIN_TIMEOUT_S,
    PROJECT_ROOT,
    WORKLOAD_APP,
    AppliedFeeder,
    Names,
    Usage,
    _delete_topics,
    _drop_postgres_objects,
    _proc_cpu_seconds,
    _records_in,
    _run_measured,
    _workload_dsn,
)
from capture.admin import table_statuses
from capture.rows import native as native_rows
from capture.settings import CaptureSettings
from deploy.local import stack
from deploy.local.process import read_pid
from schemas.control import SnapshotResume
from schemas.lsn import Lsn, format_lsn, parse_lsn

TABLE = "accounts"
COLUMNS = ("aid", "bid", "abalance", "filler")


def _load(dsn: str, names: Names, rows: int) -> None:
    with psycopg.connect(_workload_dsn(dsn, names)) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(names.schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (aid int PRIMARY KEY, bid int, abalance int, filler char(84))"
            ).format(sql.Identifier(names.schema, TABLE))
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT a, (a - 1) / 100000 + 1, a %% 5000, '' "
                "FROM generate_series(1, %s) a"
            ).format(sql.Identifier(names.schema, TABLE)),
            [rows],
        )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(names.schema, TABLE)))


def _copy_baseline(dsn: str, names: Names) -> tuple[float, int]:
    """Seconds to read the table with COPY, and the rows read."""
    query = sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in COLUMNS),
        sql.Identifier(names.schema, TABLE),
    )
    rows = 0
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        with conn.cursor().copy(query) as copy:
            for chunk in copy:
                rows += bytes(chunk).count(b"\n")
        return time.perf_counter() - started, rows


def _tick_wal(dsn: str, stop: threading.Event) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.wait(1.0):
            conn.execute("SELECT pg_logical_emit_message(false, %s, '')", [WORKLOAD_APP])


def _delete_change_topic(bootstrap: str, names: Names) -> None:
    (topic,) = names.change_topics((TABLE,))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    with contextlib.suppress(KafkaException):  # not created when the run failed early
        admin.delete_topics([topic], operation_timeout=30)[topic].result(60)


def _settings(
    dsn: str,
    bootstrap: str,
    names: Names,
    workers: int,
    compiled_rows: bool,
    pace: str = "kafka",
    producer: str = "compiled",
) -> CaptureSettings:
    settings = names.capture_settings(
        dsn, bootstrap, [TABLE], partitions=3, snapshot_mode="initial"
    )
    return settings.model_copy(
        update={
            "snapshot_workers": workers,
            "compiled_rows": compiled_rows,
            "snapshot_pace": pace,
            "compiled_producer": producer == "compiled",
        }
    )


@dataclass(frozen=True, slots=True)
class Run:
    workers: int
    pace: str
    producer: str
    copy_s: float
    copied: int
    usage: Usage
    records: int
    broker_cpu_s: float | None
    """The Kafka broker's CPU during capture's run (None: its process was not found)."""
    postgres_cpu_s: float | None
    """The PostgreSQL cluster's: every server process, the COPY backends included."""


@dataclass(frozen=True, slots=True)
class Prepared:
    names: Names
    stop_at: Lsn


@contextlib.contextmanager
def _prepared(
    dsn: str, bootstrap: str, rows: int, applied_every_s: float = 1.0
) -> Iterator[Prepared]:
    """A loaded table, the control topic, the apply stand-in and the WAL ticker; all of it
    dropped or stopped at the end."""
    names = Names.unique()
    print(f"schema {names.schema}: loading {rows} rows...")
    with (
        psycopg.connect(dsn, autocommit=True) as admin,
        contextlib.ExitStack() as cleanup,
    ):
        cleanup.callback(_delete_topics, bootstrap, names)
        cleanup.callback(_delete_change_topic, bootstrap, names)
        cleanup.callback(_drop_postgres_objects, admin, names)
        cleanup.callback(
            admin.execute,
            sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(names.publication)),
        )
        _load(dsn, names, rows)
        row = admin.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        stop_at = parse_lsn(str(row[0]))
        # On an idle database the server has nothing to report: WAL written while the
        # child runs moves its decoding position past stop_at, so the child can stop.
        # And an apply stand-in: without applied offsets on the control topic the slot
        # would never move (and a snapshot paced by the lake would pause for good).
        kafka_admin = AdminClient({"bootstrap.servers": bootstrap})
        kafka_admin.create_topics(
            [NewTopic(names.control_topic, 1, 1, config={"cleanup.policy": "compact"})]
        )[names.control_topic].result(30)
        feeder = AppliedFeeder(bootstrap, names, (TABLE,), applied_every_s)
        feeder.start()
        cleanup.callback(feeder.close)
        ticking = threading.Event()
        ticker = threading.Thread(target=_tick_wal, args=(dsn, ticking), daemon=True)
        ticker.start()
        cleanup.callback(ticking.set)
        yield Prepared(names, stop_at)


def _capture_argv(settings: CaptureSettings, stop_at: Lsn) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.capture_drain",
        f"--capture-settings={settings.model_dump_json()}",
        f"--stop-at={format_lsn(stop_at)}",
    ]


def _cluster_cpu_seconds(postmaster: int) -> float | None:
    """CPU of a PostgreSQL cluster so far: the postmaster's own, that of the children it
    has reaped (``cutime``/``cstime``: backends that exited), and that of its live
    children. The difference of two readings is what the cluster spent between them."""
    try:
        stat = Path(f"/proc/{postmaster}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat.rpartition(")")[2].split()
    # utime, stime, cutime, cstime: fields 14 to 17 of stat(5), 12 to 15 after comm.
    ticks = sum(int(f) for f in fields[11:15])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            child = (proc / "stat").read_text().rpartition(")")[2].split()
            if int(child[1]) == postmaster:  # ppid: field 4, 2 after comm
                ticks += int(child[11]) + int(child[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _spent(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _measure(
    dsn: str,
    bootstrap: str,
    rows: int,
    workers: int,
    compiled_rows: bool,
    pids: tuple[int | None, int | None],
    pace: str = "kafka",
    applied_every_s: float = 1.0,
    producer: str = "compiled",
) -> Run:
    """One table loaded, read by the COPY baseline, then snapshotted by capture with
    ``workers`` snapshot workers; everything created is dropped. ``pids``: the Kafka
    broker's and the postmaster's, whose CPU during capture's run is recorded."""
    kafka_pid, postmaster = pids
    with _prepared(dsn, bootstrap, rows, applied_every_s) as prepared:
        names = prepared.names
        print("baseline: COPY to nowhere...")
        copy_s, copied = _copy_baseline(dsn, names)
        print(
            f"capture: initial snapshot to Kafka, {workers} snapshot workers, {pace} pace, "
            f"{producer} producer..."
        )
        settings = _settings(dsn, bootstrap, names, workers, compiled_rows, pace, producer)
        broker = None if kafka_pid is None else _proc_cpu_seconds(kafka_pid)
        cluster = None if postmaster is None else _cluster_cpu_seconds(postmaster)
        usage = _run_measured("capture", _capture_argv(settings, prepared.stop_at))
        broker = _spent(broker, None if kafka_pid is None else _proc_cpu_seconds(kafka_pid))
        cluster = _spent(cluster, None if postmaster is None else _cluster_cpu_seconds(postmaster))
        records = _records_in(bootstrap, names, (TABLE,))
    return Run(workers, pace, producer, copy_s, copied, usage, records, broker, cluster)


@dataclass(frozen=True, slots=True)
class Resumed:
    workers: int
    chunk_rows: int
    before_kill: int
    """Records in the change topic right after the kill."""
    resume: SnapshotResume | None
    """The resume point the control topic held at the kill."""
    usage: Usage
    """The resumed run's."""
    records: int
    """Records in the change topic at the end."""


def _resume(
    dsn: str, bootstrap: str, rows: int, workers: int, kill_at: float, compiled_rows: bool
) -> Resumed:
    """A snapshot killed with SIGKILL once the topic holds ``kill_at`` x ``rows`` records,
    then resumed to the end (module docstring)."""
    with _prepared(dsn, bootstrap, rows) as prepared:
        names = prepared.names
        settings = _settings(dsn, bootstrap, names, workers, compiled_rows)
        argv = _capture_argv(settings, prepared.stop_at)
        print(f"capture: snapshot with {workers} workers, killed at {kill_at:.0%} of the rows...")
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, cwd=PROJECT_ROOT)
        try:
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while _records_in(bootstrap, names, (TABLE,)) < kill_at * rows:
                if child.poll() is not None:
                    raise SystemExit(f"capture ended ({child.returncode}) before the kill")
                if time.monotonic() > deadline:
                    raise SystemExit("the snapshot never reached the kill point")
                time.sleep(0.2)
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(60)
        before_kill = _records_in(bootstrap, names, (TABLE,))
        status = next((t for t in table_statuses(settings) if t.table.endswith(f".{TABLE}")), None)
        resume = None if status is None else status.resume
        print(f"killed with {before_kill} records in the topic; resume point {resume}; resuming...")
        usage = _run_measured("capture, resumed", argv)
        records = _records_in(bootstrap, names, (TABLE,))
    return Resumed(workers, settings.snapshot_chunk_rows, before_kill, resume, usage, records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1],
        metavar="N",
        help="snapshot workers (CAPTURE_SNAPSHOT_WORKERS); several values run one after "
        "the other, each on a table of its own, compared with the first",
    )
    parser.add_argument(
        "--pace",
        nargs="+",
        choices=["kafka", "lake"],
        default=["kafka"],
        help="snapshot_pace values; each runs with every --workers value",
    )
    parser.add_argument(
        "--applied-every",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between the apply stand-in's reports of applied offsets",
    )
    parser.add_argument(
        "--kill-at",
        type=float,
        default=None,
        metavar="F",
        help="also kill a snapshot with SIGKILL at this fraction of the rows and resume it, "
        "with the last --workers value (e.g. 0.5)",
    )
    parser.add_argument(
        "--producer",
        nargs="+",
        choices=("compiled", "confluent"),
        default=["compiled"],
        help="compiled_producer values (confluent: confluent-kafka's producer); each runs "
        "with every --pace and --workers value",
    )
    parser.add_argument(
        "--python-rows",
        action="store_true",
        help="capture with compiled_rows=false: every row encoded by the Python path",
    )
    args = parser.parse_args()
    if args.kill_at is not None and not 0 < args.kill_at < 1:
        parser.error("--kill-at is a fraction of the rows, between 0 and 1")
    state = stack.up()
    dsn, bootstrap = state.postgres.dsn, state.kafka.bootstrap_servers
    compiled = not args.python_rows
    if compiled and not native_rows.AVAILABLE:
        print("capture_native is not built (make native): rows take the Python path")
    print(f"rows encoded by the {'compiled row encoder' if compiled else 'Python path'}")
    pids = (read_pid(state.kafka.pid_file), state.postgres.postmaster_pid())
    runs = [
        _measure(dsn, bootstrap, args.rows, w, compiled, pids, pace, args.applied_every, producer)
        for producer in args.producer
        for pace in args.pace
        for w in args.workers
    ]
    resumed = (
        None
        if args.kill_at is None
        else _resume(dsn, bootstrap, args.rows, args.workers[-1], args.kill_at, compiled)
    )
    print(
        f"\n{'run':<38}{'wall s':>8}{'rows/s':>10}{'vs base':>9}{'vs first':>9}"
        f"{'CPU us/row':>11}{'peak RSS MB':>12}"
    )
    first_rate = args.rows / runs[0].usage.wall_s
    for run in runs:
        base_rate, rate = run.copied / run.copy_s, args.rows / run.usage.wall_s
        print(f"{'COPY to nowhere (base)':<38}{run.copy_s:>8.1f}{base_rate:>10.0f}{'1.00x':>9}")
        label = f"capture, {run.workers} worker{'s' if run.workers > 1 else ''}, {run.pace}"
        if len(args.producer) > 1:
            label += f", {run.producer}"
        print(
            f"{label:<38}{run.usage.wall_s:>8.1f}{rate:>10.0f}{rate / base_rate:>8.2f}x"
            f"{rate / first_rate:>8.2f}x{run.usage.cpu_s / args.rows * 1e6:>11.1f}"
            f"{run.usage.max_rss_bytes / 1e6:>12.1f}"
        )
    print(
        f"apply stand-in every {args.applied_every:g} s; load average at the end: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    _print_machine_share(runs, args.rows)
    failed = False
    for run in runs:
        print(
            f"{run.workers} workers, {run.pace} pace: {run.records} records in the change topic "
            f"(expected {args.rows})"
        )
        if run.usage.returncode != 0 or run.records != args.rows or run.copied != args.rows:
            print(
                f"FAILED: exit code {run.usage.returncode}, {run.records} records, "
                f"{run.copied} copied"
            )
            failed = True
    if resumed is not None:
        reread = resumed.records - args.rows
        bound = resumed.workers * resumed.chunk_rows
        print(
            f"\nresume after kill -9: {resumed.workers} workers, chunks of about "
            f"{resumed.chunk_rows} rows; {resumed.before_kill} records in the topic at the "
            f"kill, resume point {resumed.resume}; resumed run {resumed.usage.wall_s:.1f} s "
            f"wall, {resumed.usage.cpu_s:.1f} s CPU"
        )
        verdict = "met" if 0 <= reread <= bound else "NOT met"
        print(
            f"rows read twice: {reread} (records {resumed.records} - rows {args.rows}); "
            f"target <= workers x chunk rows = {bound}: {verdict}"
        )
        if resumed.usage.returncode != 0 or resumed.records < args.rows:
            print(
                f"FAILED: resumed run exit code {resumed.usage.returncode}, "
                f"{resumed.records} records"
            )
            failed = True
    if failed:
        sys.exit(1)


def _print_machine_share(runs: list[Run], rows: int) -> None:
    """Where the machine's CPU went per row, capture's and the services' beside it, and
    the rate the cores would allow at that cost: when capture, the broker and the server
    together already fill every core, more workers cannot add rows per second."""
    cores = os.cpu_count() or 1
    print(
        f"\nCPU per row, us: capture (with its workers), Kafka broker, PostgreSQL; "
        f"the rate {cores} cores allow at that cost, and the share of it reached"
    )
    for run in runs:
        if run.broker_cpu_s is None or run.postgres_cpu_s is None:
            print(
                f"{run.workers} workers, {run.pace}: the broker's or the server's process "
                "was not found"
            )
            continue
        capture_us = run.usage.cpu_s / rows * 1e6
        broker_us = run.broker_cpu_s / rows * 1e6
        server_us = run.postgres_cpu_s / rows * 1e6
        total_us = capture_us + broker_us + server_us
        ceiling = cores / total_us * 1e6
        rate = rows / run.usage.wall_s
        print(
            f"{run.workers} workers, {run.pace}: {capture_us:.1f} + {broker_us:.1f} + "
            f"{server_us:.1f} = "
            f"{total_us:.1f} us/row; {cores} cores allow {ceiling:,.0f} rows/s; reached "
            f"{rate:,.0f} ({rate / ceiling:.0%})"
        )


if __name__ == "__main__":
    main()
