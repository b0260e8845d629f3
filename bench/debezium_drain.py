"""Debezium's PostgreSQL connector draining the drain benchmark's backlog, for the
side-by-side row of :mod:`bench.capture_drain` (``--debezium``).

What runs: a standalone Kafka Connect worker (Kafka 4.1.1, jars resolved by
``deploy/jars/debezium/pom.xml``) with ``io.debezium.connector.postgresql.PostgresConnector``
on a slot of its own, created with the other two before the backlog was written:

- ``plugin.name=pgoutput`` on the benchmark's publication (``publication.autocreate.mode
  =disabled``), ``snapshot.mode=no_data``: only the backlog is streamed, as for capture;
- the JSON converter with schemas (Kafka Connect's default), ``tombstones.on.delete=false``
  so that every row change is exactly one record, as capture's change topics hold;
- the worker's producer with ``acks=all`` and idempotence, as capture's;
- its topics created beforehand with the benchmark's partition count (the local broker
  does not create topics on demand).

Measured: the Connect JVM's CPU (``/proc``) and wall time from its start to the moment its
topics hold one record per row change, split at its first record into **start-up**
(JVM, connector, slot) and the **steady** drain, which is what the issue's comparison
asks for ("start-up reported apart from the steady rate").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg.conninfo import conninfo_to_dict

from deploy.local.jars import jar_dir, resolve
from deploy.local.kafka import find_java
from deploy.local.process import spawn, stop

CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
"""


@dataclass(frozen=True, slots=True)
class DebeziumRun:
    startup_s: float
    """From the JVM's start to the first record in its topics."""
    steady_s: float
    """From the first record to the last."""
    startup_cpu_s: float
    steady_cpu_s: float
    records: int


def topics(prefix: str, schema: str, tables: Sequence[str]) -> list[str]:
    """Debezium's change topics: ``<topic.prefix>.<schema>.<table>``."""
    return [f"{prefix}.{schema}.{table}" for table in tables]


def drain(
    *,
    dsn: str,
    bootstrap: str,
    slot: str,
    publication: str,
    schema: str,
    tables: Sequence[str],
    partitions: int,
    changes: int,
    workdir: Path,
    records_in: Callable[[Sequence[str]], int],
    cpu_seconds: Callable[[int], float | None],
    timeout_s: float,
) -> DebeziumRun:
    """Run the worker until its topics hold ``changes`` records (``records_in`` counts
    them, ``cpu_seconds`` reads a process's CPU); it is stopped on return."""
    resolve("debezium")
    prefix = f"{schema}_dbz"
    names = topics(prefix, schema, tables)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1) for topic in names]).values():
        future.result(30)
    conninfo = conninfo_to_dict(dsn)
    workdir.mkdir(parents=True, exist_ok=True)
    worker = {
        "bootstrap.servers": bootstrap,
        "listeners": "http://127.0.0.1:0",
        "offset.storage.file.filename": str(workdir / "offsets"),
        "offset.flush.interval.ms": "1000",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "producer.acks": "all",
        "producer.enable.idempotence": "true",
    }
    connector = {
        "name": f"{schema}-debezium",
        "connector.class": CONNECTOR,
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": str(conninfo.get("host", "127.0.0.1")),
        "database.port": str(conninfo.get("port", "5432")),
        "database.user": str(conninfo.get("user", "postgres")),
        "database.password": str(conninfo.get("password", "")),
        "database.dbname": str(conninfo.get("dbname", "postgres")),
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "no_data",
        "topic.prefix": prefix,
        "table.include.list": ",".join(f"{schema}.{table}" for table in tables),
        "tombstones.on.delete": "false",
    }
    (workdir / "worker.properties").write_text(_properties(worker))
    (workdir / "connector.properties").write_text(_properties(connector))
    (workdir / "log4j2.properties").write_text(LOG4J2)
    classpath = ":".join(str(jar) for jar in sorted(jar_dir("debezium").glob("*.jar")))
    pid_file, log_file = workdir / "connect.pid", workdir / "connect.log"
    started = time.perf_counter()
    pid = spawn(
        [
            find_java(),
            "-Xmx1g",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
            "-cp",
            classpath,
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(workdir / "worker.properties"),
            str(workdir / "connector.properties"),
        ],
        log_file=log_file,
        pid_file=pid_file,
    )
    try:
        first_at: float | None = None
        first_cpu = 0.0
        cpu = 0.0
        while True:
            now = time.perf_counter()
            if now - started > timeout_s:
                raise SystemExit(
                    f"Debezium did not drain the backlog in {timeout_s:.0f} s; {log_file}"
                )
            current = cpu_seconds(pid)
            if current is None:
                raise SystemExit(f"the Connect worker exited; its log: {log_file}")
            cpu = current
            count = records_in(names)
            if first_at is None and count > 0:
                first_at, first_cpu = now, cpu
            if count >= changes:
                break
            time.sleep(0.2)
        assert first_at is not None
        return DebeziumRun(
            startup_s=first_at - started,
            steady_s=now - first_at,
            startup_cpu_s=first_cpu,
            steady_cpu_s=cpu - first_cpu,
            records=count,
        )
    finally:
        stop(pid_file, what="Kafka Connect worker")


def _properties(settings: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in settings.items())
