"""A local single-node Apache Kafka in KRaft combined mode (broker and controller).

Settings follow what a one-node cluster needs to behave like a real one for the
pipeline: replication factor 1 for internal topics, transactions and idempotent
producers enabled, topic auto-creation off (the services create their topics with the
partitions and retention they mean to have, and a typo should fail loudly).
Ready means a produce with ``acks=all`` to a probe topic succeeded, not merely an open
port.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from deploy.local.errors import LauncherError, MissingPrerequisite
from deploy.local.jars import kafka_classpath
from deploy.local.process import alive, port_open, read_pid, spawn, stop, wait_until

READY_TOPIC = "__cdc_launcher_ready"

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = warn
logger.server.name = org.apache.kafka.server
logger.server.level = warn
"""


def cluster_id(raw: bytes) -> str:
    """A Kafka cluster id: 16 bytes in unpadded URL-safe base64, as Kafka's ``Uuid``."""
    if len(raw) != 16:
        raise ValueError(f"a cluster id is 16 bytes, got {len(raw)}")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def new_cluster_id(draw: Callable[[int], bytes] = os.urandom) -> str:
    """A random cluster id that does not begin with ``-``.

    One random id in 64 begins with ``-`` (its first six bits all but the last set), and
    ``kafka-storage format -t -Abc...`` reads such an id as an unknown option. Kafka's own
    ``Uuid.randomUuid`` draws again in that case; so does this. The id is also passed as
    ``--cluster-id=<id>`` (:meth:`LocalKafka._format`), which no parser reads as an
    option.
    """
    while True:
        candidate = cluster_id(draw(16))
        if not candidate.startswith("-"):
            return candidate


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise MissingPrerequisite(
            "Java 17 or newer is needed to run Kafka and Spark: "
            "`apt-get install openjdk-17-jdk-headless` (done by `make bootstrap` as root)"
        )
    return java


SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True, slots=True)
class SaslSslListener:
    """An extra ``SASL_SSL`` listener on ``port`` beside the plaintext one: TLS with the
    PEM ``keystore`` (private key and certificate chain in one file, read by the broker
    as ``ssl.keystore.type=PEM``) and SCRAM-SHA-512 logins for ``users`` (name to
    password).

    The users are written into the metadata log when the storage is formatted
    (``kafka-storage format --add-scram``), so they exist before the broker accepts a
    connection; a broker formatted without them has none. The plaintext listener stays
    for the broker's own traffic and the launcher's readiness probe.

    ``authorizer``: KRaft's ``StandardAuthorizer`` is on, and a SCRAM user may do only
    what an ACL allows (nothing, until ACLs are created; docs/security.md lists the ones
    each service needs). The plaintext listeners' anonymous principal is a super user:
    the broker's own connections, its controller and the readiness probe come that way,
    and a test creates the ACLs through it."""

    port: int
    keystore: Path
    users: Mapping[str, str] = field(default_factory=dict)
    authorizer: bool = False

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True, slots=True)
class LocalKafka:
    """One KRaft node under ``root``: clients on ``port``, the controller on
    ``controller_port``.

    ``advertised_port``: the port the broker tells clients to connect to, when it is not
    ``port``. Kafka clients bootstrap once and then connect only to the advertised
    address, so a test that puts a proxy in front of the broker (to cut the network)
    advertises the proxy's port; every client then goes through the proxy, the broker's
    own readiness probe included.
    """

    root: Path
    port: int
    controller_port: int
    heap: str = "768m"
    advertised_port: int | None = None
    sasl_ssl: SaslSslListener | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.root / "kafka.out"

    @property
    def pid_file(self) -> Path:
        return self.root / "launcher.pid"

    @property
    def config_file(self) -> Path:
        return self.root / "server.properties"

    def start(self, *, timeout_s: float = 120.0) -> None:
        java = find_java()
        classpath = kafka_classpath()
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_config()
        if not (self.root / "logs" / "meta.properties").exists():
            self._format(java, classpath)
        pid = spawn(
            [
                java,
                f"-Xmx{self.heap}",
                f"-Xms{self.heap}",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
                "-cp",
                classpath,
                "kafka.Kafka",
                str(self.config_file),
            ],
            log_file=self.log_file,
            pid_file=self.pid_file,
        )
        wait_until(
            lambda: port_open(self.port),
            what=f"Kafka on port {self.port}",
            timeout_s=timeout_s,
            log_file=self.log_file,
            pid=pid,
        )
        wait_until(
            self.accepts_produce,
            what=f"Kafka on port {self.port} (accepting a produce)",
            timeout_s=timeout_s,
            log_file=self.log_file,
            pid=pid,
        )

    def accepts_produce(self) -> bool:
        from confluent_kafka import KafkaException, Producer  # noqa: PLC0415
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415
        from confluent_kafka.cimpl import NewTopic  # noqa: PLC0415

        conf: dict[str, str | int | float | bool] = {
            "bootstrap.servers": self.bootstrap_servers,
            "socket.timeout.ms": 5000,
        }
        admin = AdminClient(conf)
        try:
            if READY_TOPIC not in admin.list_topics(timeout=5).topics:
                admin.create_topics([NewTopic(READY_TOPIC, 1, 1)])[READY_TOPIC].result(10)
        except KafkaException:
            return False
        delivered: list[bool] = []
        producer = Producer({**conf, "acks": "all", "message.timeout.ms": 5000})
        producer.produce(
            READY_TOPIC, b"ready", on_delivery=lambda err, _m: delivered.append(err is None)
        )
        producer.flush(10)
        return delivered == [True]

    def running(self) -> bool:
        pid = read_pid(self.pid_file)
        return pid is not None and alive(pid)

    def stop(self) -> bool:
        return stop(self.pid_file, what="Kafka", timeout_s=60.0)

    def _write_config(self) -> None:
        logs = self.root / "logs"
        # listener name -> (security protocol, address)
        listeners = {
            "PLAINTEXT": ("PLAINTEXT", f"127.0.0.1:{self.port}"),
            "CONTROLLER": ("PLAINTEXT", f"127.0.0.1:{self.controller_port}"),
        }
        advertised = {"PLAINTEXT": f"127.0.0.1:{self.advertised_port or self.port}"}
        secured: dict[str, str] = {}
        if self.sasl_ssl is not None:
            advertised["SASL_SSL"] = f"127.0.0.1:{self.sasl_ssl.port}"
            listeners["SASL_SSL"] = ("SASL_SSL", advertised["SASL_SSL"])
            prefix = "listener.name.sasl_ssl."
            secured = {
                f"{prefix}sasl.enabled.mechanisms": SCRAM_MECHANISM,
                f"{prefix}{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                f"{prefix}ssl.keystore.type": "PEM",
                f"{prefix}ssl.keystore.location": str(self.sasl_ssl.keystore),
            }
            if self.sasl_ssl.authorizer:
                secured |= {
                    "authorizer.class.name": (
                        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                    ),
                    "super.users": "User:ANONYMOUS",
                }
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": ",".join(f"{name}://{at}" for name, (_, at) in listeners.items()),
            "advertised.listeners": ",".join(f"{name}://{at}" for name, at in advertised.items()),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(
                f"{name}:{protocol}" for name, (protocol, _) in listeners.items()
            ),
            "log.dirs": str(logs),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            **secured,
        }
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.root / "log4j2.properties").write_text(_LOG4J2.format(log=self.root / "server.log"))

    def _format(self, java: str, classpath: str, cluster: str | None = None) -> None:
        cluster = new_cluster_id() if cluster is None else cluster
        result = subprocess.run(
            [
                java,
                f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}",
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster}",
                "-c",
                str(self.config_file),
                *self._scram_users(),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise LauncherError(
                f"kafka storage format failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )

    def _scram_users(self) -> list[str]:
        """``--add-scram`` arguments creating the SASL_SSL listener's users."""
        if self.sasl_ssl is None:
            return []
        arguments: list[str] = []
        for name, password in self.sasl_ssl.users.items():
            # The tool parses name=value pairs in brackets; quotes keep any character.
            arguments += [
                "--add-scram",
                f'{SCRAM_MECHANISM}=[name="{name}",password="{password}"]',
            ]
        return arguments
