"""A secured Kafka broker and a secured PostgreSQL, each started for one test module.

Both are the project's own launcher (:mod:`deploy.local`) with its security options, on
free ports under a temporary directory, with certificates made for the run
(:mod:`deploy.local.tls`); the shared stack is never touched.

- :func:`secured_kafka`: a KRaft broker with a ``SASL_SSL`` listener (TLS, SCRAM-SHA-512),
  one user per service, and the authorizer on: a user may do only what the ACLs of
  :func:`pipeline_acls` (the recipe of docs/security.md) allow. The services reach the
  broker only through the secured listener; the plaintext one (a super user's) is for
  creating ACLs.
- :func:`secured_postgres`: ``ssl = on``; only the superuser may connect without TLS
  (for the tests' setup), every other role needs TLS and its password.

Module scope: a broker costs about ten seconds to start, and a module's tests each use
their own names on it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from apply.engine.kafka_clients import SCHEMA_GROUP, SPARK_SOURCE_GROUP_PREFIX
from apply.engine.kafka_clients import STATUS_GROUP as APPLY_STATUS_GROUP
from capture.publish.control import CONTROL_GROUP
from deploy.local.kafka import SCRAM_MECHANISM, LocalKafka, SaslSslListener
from deploy.local.postgres import LocalPostgres, ServerTls
from deploy.local.process import free_port
from deploy.local.tls import CertificateAuthority, issue_server_certificate, make_ca
from pipeline.status.kafka import STATUS_GROUP as PIPELINE_STATUS_GROUP

KAFKA_USERS = {"capture": "capture-Scram-secret", "apply": "apply-Scram-secret"}


@dataclass(frozen=True, slots=True)
class SecuredKafka:
    bootstrap_servers: str
    """The SASL_SSL listener."""
    admin_bootstrap_servers: str
    """The plaintext listener, whose anonymous principal is a super user: ACLs only."""
    ca: Path
    other_ca: Path
    """A CA that did not sign the broker's certificate."""
    users: dict[str, str]

    def grant(self, acls: list[AclBinding], timeout_s: float = 30) -> None:
        """Create ``acls`` and wait until the broker enforces them: the controller
        acknowledges an ACL when it is in the metadata log, and the broker's authorizer
        applies it a moment later, so a service started at once could be refused."""
        admin = AdminClient({"bootstrap.servers": self.admin_bootstrap_servers})
        for future in admin.create_acls(acls).values():
            future.result(timeout=30)
        deadline = time.monotonic() + timeout_s
        for binding in acls:
            if binding.restype != ResourceType.TOPIC or binding.operation != AclOperation.DESCRIBE:
                continue
            user = binding.principal.removeprefix("User:")
            topic = binding.name
            if binding.resource_pattern_type == ResourcePatternType.PREFIXED:
                topic += "acl-probe"
            while not self.may_describe(user, topic):
                assert time.monotonic() < deadline, f"{binding} not enforced in time"
                time.sleep(0.1)

    def may_describe(self, user: str, topic: str) -> bool:
        """Whether ``user`` may describe ``topic`` (which need not exist: an unknown
        topic is "unknown" to a user who may describe it, "not authorized" otherwise)."""
        admin = AdminClient(
            {
                **self.client(user),
                "sasl.password": self.users[user],
                "bootstrap.servers": self.bootstrap_servers,
            }
        )
        found = admin.list_topics(topic, timeout=10).topics.get(topic)
        error = None if found is None else found.error
        return error is None or error.code() != KafkaError.TOPIC_AUTHORIZATION_FAILED

    def client(self, user: str, *, ca: Path | None = None) -> dict[str, str]:
        """The client properties for ``user``, without the password (it goes in a
        secrets directory, as a mounted Secret would)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": user,
            "ssl.ca.location": str(ca or self.ca),
        }


@dataclass(frozen=True, slots=True)
class SecuredPostgres:
    port: int
    ca: Path
    other_ca: Path

    @property
    def superuser_dsn(self) -> str:
        """Trust over loopback without TLS: for the tests' own setup only."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def dsn(self, user: str, *, ca: Path | None = None, host: str = "localhost") -> str:
        """``user`` over TLS, verifying the server's certificate and host name."""
        return (
            f"postgresql://{user}@{host}:{self.port}/postgres"
            f"?sslmode=verify-full&sslrootcert={ca or self.ca}"
        )


def pipeline_acls(
    *, capture: str, apply: str, prefix: str, control_topic: str, schema_topic: str
) -> list[AclBinding]:
    """The ACLs of docs/security.md ("Kafka ACLs") for the users ``capture`` and
    ``apply`` of one pipeline; the tests grant exactly these, so the recipe is proven."""
    topic, group = ResourceType.TOPIC, ResourceType.GROUP
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    op = AclOperation
    rules = [
        # capture: creates and writes its topics, reads the control topic from the start.
        (capture, topic, prefixed, f"{prefix}.", [op.CREATE, op.WRITE, op.DESCRIBE]),
        (capture, topic, literal, control_topic, [op.CREATE, op.WRITE, op.READ, op.DESCRIBE]),
        (capture, topic, literal, schema_topic, [op.CREATE, op.WRITE, op.DESCRIBE]),
        (capture, group, literal, CONTROL_GROUP, [op.READ]),
        # python -m pipeline status runs with capture's settings: reads change topics too.
        (capture, topic, prefixed, f"{prefix}.", [op.READ]),
        (capture, group, literal, PIPELINE_STATUS_GROUP, [op.READ]),
        # apply: reads change and schema topics, reads and writes the control topic.
        (apply, topic, prefixed, f"{prefix}.", [op.READ, op.DESCRIBE]),
        (apply, topic, literal, schema_topic, [op.READ, op.DESCRIBE]),
        (apply, topic, literal, control_topic, [op.WRITE, op.READ, op.DESCRIBE]),
        (apply, group, literal, SCHEMA_GROUP, [op.READ]),
        (apply, group, literal, APPLY_STATUS_GROUP, [op.READ]),
        (apply, group, prefixed, SPARK_SOURCE_GROUP_PREFIX, [op.READ]),
    ]
    return [
        AclBinding(kind, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW)
        for user, kind, pattern, name, operations in rules
        for operation in operations
    ]


def _authorities(root: Path) -> tuple[CertificateAuthority, CertificateAuthority]:
    return make_ca(root / "ca"), make_ca(root / "other-ca", "unrelated test CA")


@pytest.fixture(scope="module")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    root = tmp_path_factory.mktemp("secured-kafka")
    ca, other = _authorities(root)
    server = issue_server_certificate(ca, root / "broker", "kafka")
    listener = SaslSslListener(
        free_port(),
        server.keystore(root / "broker" / "keystore.pem"),
        dict(KAFKA_USERS),
        authorizer=True,
    )
    kafka = LocalKafka(root / "kafka", free_port(), free_port(), heap="512m", sasl_ssl=listener)
    try:
        kafka.start()
        yield SecuredKafka(
            listener.bootstrap_servers,
            kafka.bootstrap_servers,
            ca.certificate,
            other.certificate,
            KAFKA_USERS,
        )
    finally:
        kafka.stop()


@pytest.fixture(scope="module")
def secured_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredPostgres]:
    root = tmp_path_factory.mktemp("secured-postgres")
    ca, other = _authorities(root)
    server = issue_server_certificate(ca, root / "server", "postgres")
    # Run as root, the server runs as the postgres user, which cannot pass pytest's
    # private temporary directories: the cluster lives in a directory of its own under
    # the system temp directory (the launcher hands it to that user).
    cluster = Path(tempfile.mkdtemp(prefix="cdc-secured-postgres-"))
    postgres = LocalPostgres(cluster, free_port(), tls=ServerTls(server.certificate, server.key))
    try:
        postgres.start()
        yield SecuredPostgres(postgres.port, ca.certificate, other.certificate)
    finally:
        postgres.stop()
        shutil.rmtree(cluster, ignore_errors=True)
