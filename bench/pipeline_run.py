"""The whole pipeline under pgbench, on a stack of its own: what the pipeline benchmarks
(:mod:`bench.freshness`, :mod:`bench.sustainable_rate`) share.

A run starts its own PostgreSQL and Kafka under a temporary directory (never the
developer's stack), loads pgbench's tables (``pgbench -i``; ``pgbench_history`` has no
key and gets ``REPLICA IDENTITY FULL``, the documented rule for keyless tables) and its
scenario's other tables (:mod:`bench.scenario`), then starts capture and apply as
processes, exactly as an operator would (``python -m capture``, ``python -m apply``), and
waits for the initial snapshot to be in the lake.

Apply runs with the benchmark's settings (``--trigger``, 2 seconds unless a benchmark says
otherwise; Spark ``local[2]`` with 2 shuffle partitions), or with its own defaults: the
trigger alone with ``--trigger default``, everything in a scenario that asks for it
(:attr:`bench.scenario.Scenario.apply_defaults`).

What it measures, and how:

- **CPU and memory of a service**: the sum of ``utime + stime`` over the service's
  process tree (apply is a Python driver plus its JVM) from ``/proc``, sampled every
  second while the process lives; peak RSS is each process's ``VmHWM``, summed over the
  tree.
- **Lag**: bytes between ``pg_current_wal_lsn()`` and the slot's
  ``confirmed_flush_lsn``, which moves only once the lake has applied (the slot follows
  apply).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from apply.settings import TriggerSettings
from bench.scenario import PGBENCH_TABLES, Scenario, create_and_seed
from deploy.local import stack
from deploy.local.postgres import find_bindir
from deploy.local.service_process import ServiceProcess

PREFIX = "bench"
SLOT = "bench_slot"
TABLES = PGBENCH_TABLES
DEFAULT_TRIGGER = "default"
"""The ``--trigger`` that leaves apply's own trigger interval (APPLY_TRIGGER__INTERVAL unset)."""


def say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def pgbench_binary() -> str:
    found = find_bindir() / "pgbench"
    if found.exists():
        return str(found)
    on_path = shutil.which("pgbench")
    if on_path is None:
        raise SystemExit("pgbench not found: install Debian's postgresql-contrib / postgresql")
    return on_path


def machine() -> str:
    """The machine a figure was measured on, for the report."""
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{kb / 1024**2:.0f} GiB"
    return f"{os.cpu_count()} cores ({cpu}), {memory} RAM"


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def process_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used so far (utime + stime, ``/proc``); OSError
    once it is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat; after ")" they are 11 and 12.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class ProcessTree:
    """CPU seconds and peak RSS of a process and its descendants, sampled."""

    root_pid: int
    cpu_s: dict[int, float] = field(default_factory=dict)
    peak_rss: dict[int, int] = field(default_factory=dict)

    def sample(self) -> None:
        for pid in self._pids():
            with contextlib.suppress(OSError, ValueError, IndexError):
                self.cpu_s[pid] = process_cpu_s(pid)
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_rss[pid] = int(line.split()[1]) * 1024

    @property
    def total_cpu_s(self) -> float:
        return sum(self.cpu_s.values())

    @property
    def total_peak_rss(self) -> int:
        return sum(self.peak_rss.values())

    def _pids(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
        found, todo = [], [self.root_pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, []))
        return found


@dataclass
class Service(ServiceProcess):
    """A service process whose CPU and memory are sampled (:class:`ProcessTree`)."""

    tree: ProcessTree | None = None

    def start(self) -> None:
        super().start()
        assert self.process is not None
        self.tree = ProcessTree(self.process.pid)


@dataclass
class PipelineRun:
    """A stack, its scenario's tables, and (once :meth:`start_pipeline` ran) the services."""

    root: Path
    state: stack.StackState
    trigger: str
    """Apply's trigger interval, or :data:`DEFAULT_TRIGGER`."""
    scenario: Scenario = Scenario.PGBENCH
    services: list[Service] = field(default_factory=list)
    env_overrides: dict[str, str] = field(default_factory=dict)
    """Settings of the services on top of :meth:`service_env`'s (a benchmark's knob)."""

    @property
    def trigger_interval(self) -> str:
        """The interval apply triggers at: :attr:`trigger`, or apply's own default."""
        return TriggerSettings().interval if self.trigger == DEFAULT_TRIGGER else self.trigger

    @property
    def dsn(self) -> str:
        return self.state.postgres.dsn.rsplit("/", 1)[0] + "/bench"

    @property
    def bootstrap(self) -> str:
        return self.state.kafka.bootstrap_servers

    @property
    def lake(self) -> Path:
        return self.root / "lake"

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.dsn, autocommit=True)

    def init_pgbench(self, scale: int) -> None:
        with psycopg.connect(self.state.postgres.dsn, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS bench")
            conn.execute("CREATE DATABASE bench")
            # The local stack runs with synchronous_commit=off, under which a commit
            # reaches the walsender only at the WAL writer's next round (up to
            # wal_writer_delay, 200 ms): every commit-to-Kafka figure would carry it.
            # Production's default is on; the benchmark uses it too.
            conn.execute("ALTER DATABASE bench SET synchronous_commit = on")
        subprocess.run(
            [pgbench_binary(), "-i", "-q", "-s", str(scale), self.dsn],
            check=True,
            capture_output=True,
        )
        with self.connect() as conn:
            conn.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL")
            create_and_seed(conn, self.scenario)

    def service_env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("CAPTURE_", "APPLY_"))}
        tuned: dict[str, str] = {}
        if self.trigger != DEFAULT_TRIGGER:
            tuned["APPLY_TRIGGER__INTERVAL"] = self.trigger
        if not self.scenario.apply_defaults:
            tuned["APPLY_SPARK__MASTER"] = "local[2]"
            tuned["APPLY_SPARK__CONF"] = json.dumps(
                {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
            )
        return {
            **base,
            "CAPTURE_POSTGRES__DSN": self.dsn,
            "CAPTURE_POSTGRES__SLOT": SLOT,
            "CAPTURE_POSTGRES__PUBLICATION": SLOT,
            "CAPTURE_POSTGRES__TABLES": json.dumps([f"public.{t}" for t in self.scenario.tables]),
            "CAPTURE_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "CAPTURE_KAFKA__TOPIC_PREFIX": PREFIX,
            "CAPTURE_KAFKA__CONTROL_TOPIC": f"{PREFIX}._control",
            "CAPTURE_KAFKA__SCHEMA_TOPIC": f"{PREFIX}._schemas",
            "CAPTURE_STATUS_INTERVAL_S": "1",
            "CAPTURE_METRICS__ENABLED": "false",
            "APPLY_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "APPLY_KAFKA__TOPIC_PREFIX": PREFIX,
            "APPLY_KAFKA__CONTROL_TOPIC": f"{PREFIX}._control",
            "APPLY_KAFKA__SCHEMA_TOPIC": f"{PREFIX}._schemas",
            "APPLY_LAKE__ROOT": str(self.lake),
            "APPLY_LAKE__CHECKPOINT_ROOT": str(self.root / "checkpoints"),
            **tuned,
            # Not a setting of the measured path: a metrics port could clash on a shared host.
            "APPLY_METRICS__ENABLED": "false",
            **self.env_overrides,
        }

    def start_pipeline(self) -> tuple[Service, Service]:
        env = self.service_env()
        capture = Service(
            "capture", [sys.executable, "-m", "capture"], env, self.root / "capture.log"
        )
        apply = Service("apply", [sys.executable, "-m", "apply"], env, self.root / "apply.log")
        for service in (capture, apply):
            service.start()
            self.services.append(service)
        return capture, apply

    def lag_bytes(self) -> int | None:
        """WAL between now and the slot's confirmed position (None: no slot yet)."""
        with self.connect() as conn:
            row = conn.execute(
                "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = %s",
                [SLOT],
            ).fetchone()
        return None if row is None or row[0] is None else int(str(row[0]))

    def confirmed_at_least(self, lsn: int) -> bool:
        with self.connect() as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s",
                [SLOT],
            ).fetchone()
        return row is not None and row[0] is not None and int(str(row[0])) >= lsn

    def wal_mark(self) -> int:
        """A WAL record written now (a non-transactional logical message, which pgoutput
        does not send): the position after it.

        The slot can be confirmed past it only once capture holds nothing back, its
        snapshots applied included. ``pg_current_wal_lsn()`` is no such mark: right
        after the slot is created it can still equal the slot's own starting position
        (the WAL written since may not be written out yet), and a wait on it ended at
        once, before the initial snapshot was in the lake."""
        with self.connect() as conn:
            row = conn.execute(
                "SELECT pg_logical_emit_message(false, 'cdc-bench', 'mark') - '0/0'"
            ).fetchone()
        assert row is not None
        return int(str(row[0]))

    def wait_caught_up(self, timeout_s: float) -> float:
        """Wait until the slot is confirmed past a WAL mark written now
        (:meth:`wal_mark`); the seconds taken."""
        started = time.monotonic()
        target = self.wal_mark()
        while not self.confirmed_at_least(target):
            self.check_services()
            if time.monotonic() - started > timeout_s:
                raise SystemExit(
                    f"bench: the pipeline did not catch up within {timeout_s:.0f} s; logs in "
                    f"{self.root}"
                )
            time.sleep(0.5)
        return time.monotonic() - started

    def check_services(self) -> None:
        for service in self.services:
            service.check()

    def wait_while_running(
        self, process: subprocess.Popen[bytes], tick: Callable[[], None] | None = None
    ) -> None:
        """Wait for ``process`` (a pgbench) to end, checking the services every second."""
        while process.poll() is None:
            self.check_services()
            if tick is not None:
                tick()
            time.sleep(1)

    def sample_services(self) -> None:
        for service in self.services:
            if service.tree is not None and service.process and service.process.poll() is None:
                service.tree.sample()

    def stop_services(self) -> None:
        # apply first, then capture: capture's stop then has nothing new to wait for.
        for service in reversed(self.services):
            service.stop()


BENCH_TRIGGER = "2 seconds"
"""Apply's trigger interval in a run at the benchmark's settings."""


def add_run_arguments(parser: argparse.ArgumentParser, *, tables: Scenario | None = None) -> None:
    """The options every pipeline benchmark takes. With ``tables``, the benchmark runs
    the scenarios of :mod:`bench.scenario` (``--tables``, that one by default) and
    ``--trigger``'s default is the scenario's (:func:`scenario_trigger`)."""
    parser.add_argument("--scale", type=int, default=1, help="pgbench -i scale")
    parser.add_argument(
        "--trigger",
        default=None if tables is not None else BENCH_TRIGGER,
        help=f"apply's trigger interval; {DEFAULT_TRIGGER!r}: apply's own "
        f"({TriggerSettings().interval}, APPLY_TRIGGER__INTERVAL unset); default: "
        + (
            f"{DEFAULT_TRIGGER!r} where the tables' scenario runs apply at its defaults, "
            f"else {BENCH_TRIGGER}"
            if tables is not None
            else BENCH_TRIGGER
        ),
    )
    if tables is not None:
        parser.add_argument(
            "--tables",
            type=Scenario,
            choices=list(Scenario),
            default=tables,
            metavar="{" + ",".join(s.value for s in Scenario) + "}",
            help="eleven: pgbench's tables, a probe table written every 0.2 s and six quiet "
            "tables every 2 s, apply at its own defaults; pgbench: pgbench's four tables "
            f"alone (default: {tables.value})",
        )
    parser.add_argument("--charts", type=Path, help="write PNG charts into this directory")
    parser.add_argument("--keep", action="store_true", help="keep logs and lake")


def scenario_trigger(scenario: Scenario, trigger: str | None) -> str:
    """``--trigger`` as given, else the scenario's: apply's own where the scenario runs
    apply at its defaults, else :data:`BENCH_TRIGGER`."""
    if trigger is not None:
        return trigger
    return DEFAULT_TRIGGER if scenario.apply_defaults else BENCH_TRIGGER


@contextlib.contextmanager
def pipeline_run(
    *, scale: int, trigger: str, keep: bool, scenario: Scenario = Scenario.PGBENCH
) -> Iterator[PipelineRun]:
    """A stack of its own with the scenario's tables, torn down (and deleted unless
    ``keep``)."""
    root = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    say(f"starting PostgreSQL and Kafka under {root}")
    state = stack.up(root / "stack", env_file=None)
    run = PipelineRun(root, state, trigger, scenario=scenario)
    try:
        run.init_pgbench(scale)
        yield run
    finally:
        run.stop_services()
        stack.down(root / "stack", wipe=True)
        if keep:
            say(f"logs and lake kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def pgbench(
    run: PipelineRun, *, seconds: int, rate: float | None, log: Path
) -> subprocess.Popen[bytes]:
    """``pgbench -n -c 2 -j 1 -T seconds [-R rate]`` against the run's database."""
    argv = [pgbench_binary(), "-n", "-c", "2", "-j", "1", "-T", str(seconds), "-P", "5"]
    if rate is not None:
        argv += ["-R", f"{rate:.0f}"]
    with log.open("ab") as out:
        return subprocess.Popen([*argv, run.dsn], stdout=out, stderr=subprocess.STDOUT)


def pgbench_tps(log_text: str) -> float:
    """The ``tps = ...`` figure pgbench prints at its end."""
    for line in log_text.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2])
    raise SystemExit(f"bench: pgbench printed no tps line:\n{log_text[-2000:]}")


class Sampler:
    """Calls ``sample`` every ``interval_s`` on a thread until stopped."""

    def __init__(self, sample: Callable[[], None], interval_s: float = 1.0) -> None:
        self._sample = sample
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.failure: BaseException | None = None

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.failure is not None:
            raise self.failure

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self._interval):
                self._sample()
        except BaseException as exc:  # raised by __exit__ on the main thread
            self.failure = exc
