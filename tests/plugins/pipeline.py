"""The whole pipeline as real processes, on a stack of its own, for the fault tests.

``python -m capture`` and ``python -m apply`` run as child processes (each in its own
process group, so a kill -9 takes the apply driver and its JVM together), configured only
through their environment, exactly as a user runs them. The stack (PostgreSQL + Kafka) is
started for the test module under a temporary root, so a test may stop, kill or restart a
broker or the database without touching the services other tests share.

The workload is pgbench (the PostgreSQL server's own benchmark), run against a database
of the test's own, so its fixed table names never collide with another test's.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from apply.settings import ApplySettings, LakeSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture.settings import CaptureSettings, PostgresSettings
from capture.settings import KafkaSettings as CaptureKafka
from deploy.local import stack
from deploy.local.postgres import find_bindir
from deploy.local.process import free_port, read_pid
from deploy.local.service_process import ServiceProcess
from schemas.lsn import Lsn, parse_lsn
from tests.plugins.tcp_proxy import TcpProxy
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]

PGBENCH_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.StackState]:
    """A PostgreSQL and a Kafka for this module alone (they get stopped and killed)."""
    root = tmp_path_factory.mktemp("own-stack")
    state = stack.up(root, env_file=None)
    try:
        yield state
    finally:
        stack.down(root, wipe=True)


@dataclass(frozen=True)
class ProxiedStack:
    """A stack of the module's own whose broker is reachable only through ``kafka_proxy``:
    the broker advertises the proxy's port, so a client that bootstraps anywhere still
    connects through it, and cutting the proxy cuts every Kafka client off."""

    state: stack.StackState
    kafka_proxy: TcpProxy

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_proxy.address


@pytest.fixture(scope="module")
def proxied_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxiedStack]:
    """A PostgreSQL and a Kafka for this module alone, Kafka behind a proxy the test cuts."""
    import shutil  # noqa: PLC0415

    root = tmp_path_factory.mktemp("proxied-stack")
    kafka_port = free_port()
    with TcpProxy("127.0.0.1", kafka_port, kafka_frames=True) as proxy:
        # The proxy forwards before the broker starts: its readiness probe goes through it.
        state = stack.up(
            root, env_file=None, kafka_port=kafka_port, kafka_advertised_port=proxy.port
        )
        try:
            yield ProxiedStack(state, proxy)
        finally:
            # Not down(wipe=True), which also deletes the shared stack's env file.
            stack.down(root)
            shutil.rmtree(state.postgres_root, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)


def dsn_through(dsn: str, proxy: TcpProxy) -> str:
    """``dsn`` with its host and port replaced by the proxy's."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["host"] = "127.0.0.1"
    info["port"] = str(proxy.port)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items() if v is not None})


@dataclass
class Service(ServiceProcess):
    """One service process (:class:`~deploy.local.service_process.ServiceProcess`, as the
    demo and the benchmarks run it): started, killed, restarted; each start marked in
    ``log``, so :meth:`metrics_url` reads only the current run's lines."""

    kills: int = 0

    def start(self) -> None:
        assert not self.running(), f"{self.name} runs"
        with self.log.open("ab") as out:
            out.write(f"\n==== start {self.name} at {time.strftime('%X')}\n".encode())
        super().start()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """kill -9 of the whole process group (the apply driver takes its JVM along)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self.kills += 1

    def terminate(self, timeout_s: float = 90) -> int:
        """SIGTERM, the way an orchestrator stops it; the exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
                raise AssertionError(f"{self.name} ignored SIGTERM for {timeout_s} s") from None
        return self.process.returncode

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def metrics_url(self, timeout_s: float = 120) -> str:
        """Where the running process serves /metrics, /healthz and /readyz: it listens on
        a port the system chose (``*_METRICS__PORT=0``, so parallel pipelines never
        clash) and logs the address at start; only the current run's line counts."""
        found: list[str] = []

        def logged() -> bool:
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            current_run = text.rsplit(f"==== start {self.name} at", 1)[-1]
            found[:] = _METRICS_URL.findall(current_run)
            return bool(found)

        wait_for(logged, f"{self.name} to log its metrics address", timeout_s)
        return found[-1]


_METRICS_URL = re.compile(r"metrics and health at (http://[0-9.:\[\]a-f]+)")


C1_ONLY_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
"""The apply processes the scenarios start compile with C1 only. Each lives seconds to
minutes, and the run is bound by the two cores: C2 spent them compiling code that ran too
briefly to repay it (the pgbench scenario alone, every JVM on C1 only: 72 and 81 CPU-s
against 114 and 134, docs/testing.md). The brokers keep both compilers: two of the four
runs with C1-only brokers met the open fault of docs/testing.md ("a row missing after a
capture restart"), and no run before them did; until that fault is understood, the
brokers run as they always have. A long-running apply is better off with both, so
nothing outside the suite sets this."""


@dataclass
class Pipeline:
    """capture + apply for one database, every name derived from ``name``."""

    name: str
    dsn: str
    bootstrap: str
    tables: tuple[str, ...]
    workdir: Path
    # The DSN capture itself uses, when not ``dsn`` (through a proxy the test cuts); the
    # workload, verify and the waits use ``dsn``.
    capture_dsn: str | None = None
    # Settings of capture's own for this test, e.g. a short silence timeout.
    capture_overrides: dict[str, str] = field(default_factory=dict)
    capture: Service = field(init=False)
    apply: Service = field(init=False)

    def __post_init__(self) -> None:
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CAPTURE_", "APPLY_", "CDC_", "PYSPARK_"))
        }
        capture_env = {
            **base,
            "CAPTURE_POSTGRES__DSN": self.capture_dsn or self.dsn,
            "CAPTURE_POSTGRES__SLOT": self.name,
            "CAPTURE_POSTGRES__PUBLICATION": self.name,
            "CAPTURE_POSTGRES__TABLES": json.dumps(list(self.tables)),
            "CAPTURE_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "CAPTURE_KAFKA__TOPIC_PREFIX": self.name,
            "CAPTURE_KAFKA__CONTROL_TOPIC": f"{self.name}._control",
            "CAPTURE_KAFKA__SCHEMA_TOPIC": f"{self.name}._schemas",
            "CAPTURE_KAFKA__PARTITIONS": "2",
            "CAPTURE_STATUS_INTERVAL_S": "0.5",
            "CAPTURE_SPOOL_DIR": str(self.workdir / "spool"),
            "CAPTURE_METRICS__PORT": "0",
            **self.capture_overrides,
        }
        apply_env = {
            **base,
            "APPLY_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "APPLY_KAFKA__TOPIC_PREFIX": self.name,
            "APPLY_KAFKA__CONTROL_TOPIC": f"{self.name}._control",
            "APPLY_KAFKA__SCHEMA_TOPIC": f"{self.name}._schemas",
            "APPLY_LAKE__ROOT": str(self.lake_root),
            "APPLY_LAKE__CHECKPOINT_ROOT": str(self.workdir / "checkpoints"),
            "APPLY_TRIGGER__INTERVAL": "1 second",
            "APPLY_SPARK__MASTER": "local[2]",
            "APPLY_SPARK__CONF": json.dumps(
                {
                    "spark.driver.memory": "1g",
                    "spark.sql.shuffle.partitions": "2",
                    "spark.ui.enabled": "false",
                }
            ),
            "APPLY_TABLE_PARALLELISM": "2",
            "APPLY_METRICS__PORT": "0",
            "JAVA_TOOL_OPTIONS": C1_ONLY_JVM_OPTIONS,
        }
        self.capture = Service(
            "capture", [sys.executable, "-m", "capture"], capture_env, self.workdir / "capture.log"
        )
        self.apply = Service(
            "apply", [sys.executable, "-m", "apply"], apply_env, self.workdir / "apply.log"
        )

    @property
    def lake_root(self) -> Path:
        return self.workdir / "lake"

    def table_path(self, table: str) -> str:
        schema, name = table.split(".", 1)
        return str(self.lake_root / schema / name)

    def settings(self) -> tuple[CaptureSettings, ApplySettings]:
        """The services' settings as their environment gives them, for in-process tools
        such as verify."""
        capture = CaptureSettings(
            postgres=PostgresSettings(
                dsn=self.dsn, slot=self.name, publication=self.name, tables=list(self.tables)
            ),
            kafka=CaptureKafka(
                bootstrap_servers=self.bootstrap,
                topic_prefix=self.name,
                control_topic=f"{self.name}._control",
                schema_topic=f"{self.name}._schemas",
            ),
        )
        apply = ApplySettings(
            kafka=ApplyKafka(
                bootstrap_servers=self.bootstrap,
                topic_prefix=self.name,
                control_topic=f"{self.name}._control",
                schema_topic=f"{self.name}._schemas",
            ),
            lake=LakeSettings(
                root=str(self.lake_root), checkpoint_root=str(self.workdir / "checkpoints")
            ),
        )
        return capture, apply

    def logs(self) -> str:
        return f"--- capture log:\n{self.capture.tail()}\n--- apply log:\n{self.apply.tail()}"

    def stop(self) -> None:
        """Stop apply, then capture, as an orchestrator would; each must exit with status
        0. Both are stopped even when apply fails to (its failure is raised after
        capture's stop, so no process outlives the test)."""
        failures: list[AssertionError] = []
        for service in (self.apply, self.capture):
            if service.running():
                try:
                    status = service.terminate()
                    assert status == 0, (
                        f"{service.name} exited {status} on SIGTERM:\n{service.tail()}"
                    )
                except AssertionError as exc:
                    failures.append(exc)
        if failures:
            raise failures[0]


def slot_confirmed(conn: Connection, slot: str) -> Lsn | None:
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        [slot],
    ).fetchone()
    return None if row is None or row[0] is None else parse_lsn(str(row[0]))


def current_wal(conn: Connection) -> Lsn:
    """Where the WAL ends, committed transactions included: the insert position. Under
    ``synchronous_commit=off`` (the local stack) the flush position can still be short
    of a commit just made, and a wait on it would end before that commit arrived."""
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))


def wait_caught_up(pipeline: Pipeline, timeout_s: float = 300) -> Lsn:
    """Wait until the slot is confirmed past the WAL written so far; capture confirms an
    LSN only once apply has the changes before it in Delta, so the lake then holds
    every change committed before this call."""
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        target = current_wal(conn)

        def caught_up() -> bool:
            confirmed = slot_confirmed(conn, pipeline.name)
            return confirmed is not None and confirmed >= target

        try:
            wait_for(caught_up, f"the slot to pass {target}", timeout_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{pipeline.logs()}") from None
    return target


def _key_columns(conn: Connection, table: str) -> list[str]:
    """The primary key's columns, or every column of a table without one."""
    schema, name = table.split(".")
    relation = f'"{schema}"."{name}"'
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
        [relation],
    ).fetchall()
    if not rows:
        rows = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            [relation],
        ).fetchall()
    return [str(r[0]) for r in rows]


def assert_lake_equals_source(spark: Any, pipeline: Pipeline) -> None:
    """verify reports every table equal, and no key is twice in Delta."""
    from pyspark.sql import functions as sf  # noqa: PLC0415

    from pipeline.verify.report import format_human  # noqa: PLC0415
    from pipeline.verify.rounds import verify_tables  # noqa: PLC0415

    capture_settings, apply_settings = pipeline.settings()
    report = verify_tables(capture_settings, apply_settings, spark, list(pipeline.tables))
    assert report.ok, f"{format_human(report)}\n{pipeline.logs()}"
    assert sorted(t.table for t in report.tables) == sorted(pipeline.tables)
    for table in pipeline.tables:
        with psycopg.connect(pipeline.dsn) as conn:
            keys = _key_columns(conn, table)
        lake = spark.read.format("delta").load(pipeline.table_path(table))
        duplicates = lake.groupBy(*keys).count().filter(sf.col("count") > 1).count()
        assert duplicates == 0, f"{table}: {duplicates} keys appear more than once in Delta"


# The fault scenarios' workload; `make soak` runs the long form through the environment.
KILLS = int(os.environ.get("CDC_SOAK_KILLS", "2"))
SECONDS = int(os.environ.get("CDC_SOAK_SECONDS", "40"))
RATE = "40"  # transactions per second: 4 changes each, well within apply's pace here


def pgbench_pipeline(state: stack.StackState, name: str, workdir: Path) -> Pipeline:
    """capture and apply, not started yet, for a new database with pgbench's tables."""
    dsn = create_database(state.postgres.dsn, name)
    pgbench(dsn, "-i", "-s", "1", "-q")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE public.pgbench_history REPLICA IDENTITY FULL")
    return Pipeline(
        name=name,
        dsn=dsn,
        bootstrap=state.kafka.bootstrap_servers,
        tables=tuple(f"public.{t}" for t in PGBENCH_TABLES),
        workdir=workdir,
    )


def finish_workload(spark: Any, pipeline: Pipeline, bench: Any) -> None:
    assert bench.wait(SECONDS + 120) == 0, (pipeline.workdir / "pgbench.log").read_text()
    assert pipeline.capture.running(), pipeline.logs()
    assert pipeline.apply.running(), pipeline.logs()
    wait_caught_up(pipeline)
    assert_lake_equals_source(spark, pipeline)


def start_workload(pipeline: Pipeline, seconds: int) -> Any:
    return start_pgbench(
        pipeline.dsn,
        "-n",
        "-c",
        "2",
        "-j",
        "1",
        "-T",
        str(seconds),
        "-R",
        RATE,
        log=pipeline.workdir / "pgbench.log",
    )


def start_and_catch_up(pipeline: Pipeline) -> None:
    pipeline.capture.start()
    pipeline.apply.start()
    # The slot is created at the end of the WAL, so a target read before it exists would
    # be passed at once. Wait for the slot, write past its start, then wait: the snapshot
    # pins the slot, so it moves past that write only once the snapshot is in the lake.
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        wait_for(
            lambda: slot_confirmed(conn, pipeline.name) is not None,
            f"capture to create its slot\n{pipeline.logs()}",
            120,
        )
        conn.execute("SELECT pg_logical_emit_message(true, 'test', 'after slot creation')")
    wait_caught_up(pipeline, timeout_s=600)


def kill_9_during_the_workload(spark: Any, pipeline: Pipeline) -> None:
    """capture and apply each killed ``KILLS`` times at random moments of the workload
    and started again; the lake ends equal to the source."""
    seed = random.randrange(1 << 32)
    chooser = random.Random(seed)
    start_and_catch_up(pipeline)
    bench = start_workload(pipeline, SECONDS)
    victims = [pipeline.capture, pipeline.apply] * KILLS
    chooser.shuffle(victims)
    plan = [(v.name, round(chooser.uniform(1.0, SECONDS / (2 * KILLS)), 1)) for v in victims]
    print(f"kill plan (seed {seed}): {plan}")
    for service, (_, delay) in zip(victims, plan, strict=True):
        time.sleep(delay)
        service.kill()
        time.sleep(chooser.uniform(0.5, 2.0))
        service.start()
    finish_workload(spark, pipeline, bench)
    assert pipeline.capture.kills == KILLS
    assert pipeline.apply.kills == KILLS


def one_table_pipeline(
    state: stack.StackState, name: str, workdir: Path, rows: int, *, bootstrap: str | None = None
) -> Pipeline:
    """capture and apply, not started yet, for a new database with one table,
    ``public.t (id int PRIMARY KEY, v text)``, holding ``rows`` rows for its snapshot;
    they reach Kafka at ``bootstrap`` (a proxy before the stack's broker), or directly."""
    dsn = create_database(state.postgres.dsn, name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO public.t SELECT i, 'old' FROM generate_series(1, %s) i", [rows])
    return Pipeline(
        name=name,
        dsn=dsn,
        bootstrap=bootstrap or state.kafka.bootstrap_servers,
        tables=("public.t",),
        workdir=workdir,
    )


def create_database(admin_dsn: str, name: str) -> str:
    """A new database ``name`` on the server of ``admin_dsn``; its DSN."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items() if v is not None})


def pgbench(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the server's pgbench with ``args``; raise with its output when it fails."""
    result = subprocess.run(
        [str(find_bindir() / "pgbench"), *args, dsn],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert result.returncode == 0, f"pgbench {args} failed:\n{result.stdout}{result.stderr}"
    return result


def start_pgbench(dsn: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(find_bindir() / "pgbench"), *args, dsn], stdout=out, stderr=subprocess.STDOUT
        )


def kafka_pid(state: stack.StackState) -> int:
    pid = read_pid(state.kafka.pid_file)
    assert pid is not None, "the module's Kafka is not running"
    return pid


def watch_schemas(pipeline: Pipeline, schemas: list[str], refresh_s: float) -> None:
    """Have capture also take every table of ``schemas``, searching them for new tables
    every ``refresh_s`` seconds (``CAPTURE_POSTGRES__SCHEMAS``, ``CAPTURE_TABLE_REFRESH_S``);
    call before capture starts. ``pipeline.tables`` still names what verify compares."""
    assert not pipeline.capture.running(), "capture reads its environment only at start"
    pipeline.capture.env["CAPTURE_POSTGRES__SCHEMAS"] = json.dumps(schemas)
    pipeline.capture.env["CAPTURE_TABLE_REFRESH_S"] = str(refresh_s)


def wait_service_applied(pg: Connection, slot: str, apply: Service, timeout_s: float) -> None:
    """Until the slot passes the WAL written so far: capture confirms only what ``apply``
    (a process) has committed to Delta, so the lake then holds every change before. An
    apply that exits ends the wait, with its log."""
    target = current_wal(pg)

    def applied() -> bool:
        assert apply.running(), f"apply exited:\n{apply.tail()}"
        confirmed = slot_confirmed(pg, slot)
        return confirmed is not None and confirmed >= target

    try:
        wait_for(applied, f"slot {slot} to pass the WAL written so far", timeout_s=timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- apply log:\n{apply.tail()}") from None
