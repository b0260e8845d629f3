"""A real Kafka Connect worker for the tests that prove a Connect sink reads our
registry-framed change topics (docs/wire-contract.md, Kafka Connect).

One standalone worker (``ConnectStandalone``) per test, on the jars of
``deploy/jars/connect/pom.xml`` (resolved into ``.local/jars/connect`` the first time a
test asks, not by ``make jars``), with Apicurio's 2.x ``AvroConverter`` for keys and
values and one ``FileStreamSinkConnector`` that writes each record's value, in Connect's
``Struct`` string form, as one line of a file.

Invariants:

- The converter reads the Confluent framing (magic byte, 4-byte schema id) and takes
  the id as a *content* id, which is what Apicurio 3's Confluent-compatible API hands
  out; it fetches schemas through the same server's native v2 API
  (:func:`native_v2_url`), the only one the 2.x client speaks.
- Everything the worker writes (its config, offsets, log, sink file) lives under the
  test's own directory, and its REST listener takes a free port, so parallel workers
  never share anything.
- The worker is stopped (its process group) when the context exits, test failed or not.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy.local.jars import jar_dir, resolve
from deploy.local.kafka import find_java
from deploy.local.process import free_port, spawn, stop, tail, wait_until
from deploy.local.registry import CCOMPAT_PATH

CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
FILE_SINK = "org.apache.kafka.connect.file.FileStreamSinkConnector"

# What makes Apicurio 2.x read a Confluent-framed record written against Apicurio 3's
# ccompat API: a 4-byte id (not 2.x's default 8-byte global id) that is a content id.
# Apicurio's own headers are off: our records carry none, and the id is in the payload.
CONVERTER_SETTINGS = {
    "apicurio.registry.id-handler": "io.apicurio.registry.serde.Legacy4ByteIdHandler",
    "apicurio.registry.use-id": "contentId",
    "apicurio.registry.headers.enabled": "false",
}

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.clients.name = org.apache.kafka.clients
logger.clients.level = warn
"""


def native_v2_url(ccompat_url: str) -> str:
    """The Apicurio native v2 API's base URL on the server whose Confluent-compatible
    base URL is ``ccompat_url``."""
    base = ccompat_url.rstrip("/")
    if not base.endswith(CCOMPAT_PATH):
        raise ValueError(
            f"{ccompat_url} is not an Apicurio Confluent-compatible URL "
            f"(ending in {CCOMPAT_PATH}); the Connect converter needs the same server's "
            "/apis/registry/v2 API"
        )
    return base.removesuffix(CCOMPAT_PATH) + "/apis/registry/v2"


def _properties(settings: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in settings.items())


@dataclass(frozen=True, slots=True)
class FileSinkWorker:
    """A running standalone worker whose one connector, ``name``, sinks ``topic`` into
    :attr:`sink_file`."""

    root: Path
    name: str
    topic: str
    rest_port: int

    @property
    def sink_file(self) -> Path:
        return self.root / "sink.txt"

    @property
    def log_file(self) -> Path:
        return self.root / "connect.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "connect.pid"

    def lines(self) -> list[str]:
        try:
            return self.sink_file.read_text().splitlines()
        except FileNotFoundError:
            return []

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def task_states(self) -> list[str]:
        """The states of the connector's tasks, from the worker's REST API ([] until it
        answers)."""
        url = f"http://127.0.0.1:{self.rest_port}/connectors/{self.name}/status"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                status = json.loads(response.read())
        except (urllib.error.URLError, OSError):
            return []
        return [str(task["state"]) for task in status.get("tasks", [])]

    def wait_for_lines(self, count: int, timeout_s: float = 120) -> list[str]:
        """The sink file's lines once it holds ``count``; fails early with the log's
        tail if a task fails (e.g. the converter cannot read a record)."""

        def done() -> bool:
            assert "FAILED" not in self.task_states(), (
                f"the sink task failed; last log lines:\n{tail(self.log_file, 60)}"
            )
            return len(self.lines()) >= count

        wait_until(
            done,
            what=f"{count} lines in {self.sink_file}",
            timeout_s=timeout_s,
            log_file=self.log_file,
            pid=None,
        )
        return self.lines()


@pytest.fixture(scope="session")
def connect_jars() -> Path:
    """The Connect worker's jars (resolved with Maven the first time)."""
    return resolve("connect")


@contextmanager
def file_sink_worker(
    root: Path, *, bootstrap_servers: str, registry_url: str, topic: str, name: str
) -> Iterator[FileSinkWorker]:
    """A standalone Connect worker under ``root`` sinking ``topic`` to a file through the
    Apicurio converter, fetching schemas from the registry whose Confluent-compatible
    base URL is ``registry_url``; stopped on exit."""
    root.mkdir(parents=True, exist_ok=True)
    worker = FileSinkWorker(root, name, topic, free_port())
    v2 = native_v2_url(registry_url)
    converters: dict[str, str] = {}
    for side in ("key", "value"):
        converters[f"{side}.converter"] = CONVERTER
        converters[f"{side}.converter.apicurio.registry.url"] = v2
        for key, value in CONVERTER_SETTINGS.items():
            converters[f"{side}.converter.{key}"] = value
    worker_properties = {
        "bootstrap.servers": bootstrap_servers,
        "listeners": f"http://127.0.0.1:{worker.rest_port}",
        "offset.storage.file.filename": str(root / "offsets"),
        "offset.flush.interval.ms": "1000",
        **converters,
    }
    sink_properties = {
        "name": name,
        "connector.class": FILE_SINK,
        "tasks.max": "1",
        "topics": topic,
        "file": str(worker.sink_file),
        # A record the converter cannot read stops the task (the default, said out loud):
        # the test must see a failure, not a file with lines missing.
        "errors.tolerance": "none",
    }
    (root / "worker.properties").write_text(_properties(worker_properties))
    (root / "sink.properties").write_text(_properties(sink_properties))
    (root / "log4j2.properties").write_text(_LOG4J2)
    classpath = ":".join(str(jar) for jar in sorted(jar_dir("connect").glob("*.jar")))
    pid = spawn(
        [
            find_java(),
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={root / 'log4j2.properties'}",
            "-cp",
            classpath,
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(root / "worker.properties"),
            str(root / "sink.properties"),
        ],
        log_file=worker.log_file,
        pid_file=worker.pid_file,
    )
    try:
        wait_until(
            lambda: "RUNNING" in worker.task_states(),
            what=f"the Connect worker's {name} task",
            timeout_s=120,
            log_file=worker.log_file,
            pid=pid,
        )
        yield worker
    finally:
        stop(worker.pid_file, what="Kafka Connect worker")
