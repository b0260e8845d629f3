"""A local Spark standalone cluster on loopback: one master and N workers, each a JVM of
the Spark distribution the pyspark wheel ships.

The wheel is a whole Spark distribution (``bin/``, ``jars/``), so ``SPARK_HOME`` is the
installed ``pyspark`` package directory and nothing else is downloaded. The master and
the workers are started as plain ``java -cp "<pyspark>/jars/*" <main class>`` processes,
like the Kafka broker (:mod:`deploy.local.kafka`), with the same helpers
(:mod:`deploy.local.process`): each in a session of its own with its log and pid file
under ``root``. A worker starts its executors as child processes, in the worker's
process group, so stopping a worker's group stops its executors with it.

Invariants:

- Everything binds to 127.0.0.1 (``--host`` and ``SPARK_LOCAL_IP``, which executors
  inherit from their worker): a test cluster is never reachable from elsewhere.
- Every port is free when chosen (master RPC and web UI, each worker's RPC and web UI);
  executors and the driver take theirs from the system.
- Ready means the master's web UI JSON (``/json/``) lists ``workers`` ALIVE workers, not
  merely open ports: only then does a submitted application get executors. A start that
  does not get there in time stops what it started and fails with the logs' tails.
- Workers' work directories (executor logs, the jars an application ships) live under
  ``root/worker-<n>/work``.

Use :func:`running_cluster` in tests; it always stops the cluster.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.local.errors import MissingPrerequisite, ServiceNotReady
from deploy.local.kafka import find_java
from deploy.local.process import alive, free_port, read_pid, spawn, stop, tail, wait_until

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DAEMON_HEAP = "256m"
"""Heap of the master and worker daemons themselves (Spark's default is 1g each); they
only keep track of applications, executors do the work."""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark wheel."""
    try:
        import pyspark  # noqa: PLC0415 - only the Spark side has pyspark installed
    except ImportError:
        raise MissingPrerequisite(
            "pyspark is needed to start a Spark cluster: install the project's "
            "dependencies (`make bootstrap`)"
        ) from None
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "jars").is_dir():
        raise MissingPrerequisite(f"the pyspark package at {home} has no jars/ directory")
    return home


def scala_version(jar_names: list[str]) -> str:
    """The Scala binary version the distribution is built for, from its ``spark-core_<v>``
    jar. A worker builds its executors' class path with Spark's launcher library, which
    needs ``SPARK_SCALA_VERSION`` when the distribution has no ``RELEASE`` file (the
    wheel has none; ``bin/load-spark-env.sh`` sets it for the shell scripts)."""
    for name in jar_names:
        found = re.fullmatch(r"spark-core_(\d+\.\d+)-.+\.jar", name)
        if found:
            return found.group(1)
    raise MissingPrerequisite("no spark-core_<scala version> jar among the distribution's jars")


def daemon_argv(java: str, home: Path, main_class: str, arguments: list[str]) -> list[str]:
    """The command line of a master or worker daemon."""
    return [
        java,
        f"-Xmx{DAEMON_HEAP}",
        "-cp",
        f"{home / 'jars'}/*",
        main_class,
        *arguments,
    ]


def master_arguments(port: int, ui_port: int) -> list[str]:
    return ["--host", HOST, "--port", str(port), "--webui-port", str(ui_port)]


def worker_arguments(
    master_url: str, *, port: int, ui_port: int, cores: int, memory: str, work_dir: Path
) -> list[str]:
    return [
        "--host",
        HOST,
        "--port",
        str(port),
        "--webui-port",
        str(ui_port),
        "--cores",
        str(cores),
        "--memory",
        memory,
        "--work-dir",
        str(work_dir),
        master_url,
    ]


def alive_workers(status: Mapping[str, Any]) -> int:
    """How many workers the master's ``/json/`` status lists as ALIVE (a worker that
    died and re-registered shows up once DEAD and once ALIVE)."""
    workers = status.get("workers", [])
    return sum(1 for worker in workers if worker.get("state") == "ALIVE")


@dataclass(frozen=True, slots=True)
class Worker:
    """One worker daemon: its directory (log, pid, work dir) and its two ports."""

    index: int
    root: Path
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)

    @property
    def log_file(self) -> Path:
        return self.root / "worker.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "worker.pid"

    @property
    def work_dir(self) -> Path:
        return self.root / "work"


@dataclass(frozen=True, slots=True)
class LocalSparkCluster:
    """A master on ``127.0.0.1:port`` (web UI on ``ui_port``) and ``workers`` workers of
    ``worker_cores`` cores and ``worker_memory`` each, under ``root``."""

    root: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    nodes: tuple[Worker, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"a cluster needs at least 1 worker, not {self.workers}")
        nodes = tuple(Worker(n, self.root / f"worker-{n}") for n in range(1, self.workers + 1))
        object.__setattr__(self, "nodes", nodes)

    @property
    def master_url(self) -> str:
        """What ``spark-submit --master`` takes."""
        return f"spark://{HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.root / "master" / "master.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "master" / "master.pid"

    def status(self) -> dict[str, Any] | None:
        """The master's ``/json/`` status; None while it does not answer."""
        url = f"http://{HOST}:{self.ui_port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                status: dict[str, Any] = json.load(response)
                return status
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def start(self, *, timeout_s: float = 180.0) -> None:
        """Start the master, then the workers; return once all workers are ALIVE. On
        failure everything started is stopped again."""
        java = find_java()
        home = spark_home()
        # Executors inherit the worker's environment: loopback, and the distribution
        # their class path is built from (the worker reads SPARK_HOME and
        # SPARK_SCALA_VERSION for it).
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_SCALA_VERSION": scala_version([j.name for j in (home / "jars").iterdir()]),
            "SPARK_LOCAL_IP": HOST,
        }
        try:
            self._start_master(java, home, env, timeout_s)
            for worker in self.nodes:
                worker.work_dir.mkdir(parents=True, exist_ok=True)
                spawn(
                    daemon_argv(
                        java,
                        home,
                        WORKER_CLASS,
                        worker_arguments(
                            self.master_url,
                            port=worker.port,
                            ui_port=worker.ui_port,
                            cores=self.worker_cores,
                            memory=self.worker_memory,
                            work_dir=worker.work_dir,
                        ),
                    ),
                    log_file=worker.log_file,
                    pid_file=worker.pid_file,
                    env=env,
                )
            try:
                wait_until(
                    self._workers_alive,
                    what=f"{self.workers} ALIVE workers at the Spark master {self.master_url}",
                    timeout_s=timeout_s,
                    log_file=self.log_file,
                )
            except ServiceNotReady as exc:
                # The master's log says who registered; a worker's says why it did not.
                logs = "".join(
                    f"\nlast lines of worker {w.index} ({w.log_file}):\n{tail(w.log_file)}"
                    for w in self.nodes
                )
                raise ServiceNotReady(f"{exc}{logs}") from None
        except BaseException:
            self.stop()
            raise

    def _start_master(self, java: str, home: Path, env: dict[str, str], timeout_s: float) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        pid = spawn(
            daemon_argv(java, home, MASTER_CLASS, master_arguments(self.port, self.ui_port)),
            log_file=self.log_file,
            pid_file=self.pid_file,
            env=env,
        )
        wait_until(
            lambda: (self.status() or {}).get("status") == "ALIVE",
            what=f"Spark master {self.master_url}",
            timeout_s=timeout_s,
            log_file=self.log_file,
            pid=pid,
        )

    def _workers_alive(self) -> bool:
        for worker in self.nodes:
            pid = read_pid(worker.pid_file)
            if pid is None or not alive(pid):
                raise ServiceNotReady(f"Spark worker {worker.index} exited during start")
        status = self.status()
        return status is not None and alive_workers(status) >= self.workers

    def running(self) -> bool:
        pid = read_pid(self.pid_file)
        return pid is not None and alive(pid)

    def stop(self) -> None:
        """Stop the workers (and with them their executors), then the master."""
        for worker in self.nodes:
            stop(worker.pid_file, what=f"Spark worker {worker.index}")
        stop(self.pid_file, what="Spark master")


@contextmanager
def running_cluster(
    root: Path, *, workers: int = 2, worker_cores: int = 1, worker_memory: str = "1g"
) -> Iterator[LocalSparkCluster]:
    """A started cluster for the duration of the block (module docstring)."""
    cluster = LocalSparkCluster(
        root, workers=workers, worker_cores=worker_cores, worker_memory=worker_memory
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
