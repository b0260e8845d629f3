"""capture against a PostgreSQL that requires TLS and a password, as a least-privilege role.

The server (:func:`~tests.plugins.secured.secured_postgres`) accepts roles other than the
superuser only over TLS with their SCRAM password. capture connects as a role with
``REPLICATION``, ``SELECT`` on its table and nothing else, to a publication a DBA made
(the recipe in docs/security.md), with ``sslmode=verify-full`` and its password from a
file, and must snapshot and stream; a wrong CA or password must stop it with a message
that names the setting to fix.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka.cimpl import TopicPartition
from psycopg import sql

from capture.errors import ConfigError
from capture.service import CaptureService
from capture.settings import CaptureSettings, PostgresSettings
from schemas.naming import table_topic
from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.secured import SecuredPostgres
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]
PASSWORD = "Capture-Pg-secret"


@pytest.fixture
def superuser(secured_postgres: SecuredPostgres) -> Iterator[Connection]:
    with psycopg.connect(secured_postgres.superuser_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def least_privilege(superuser: Connection, unique_name: str) -> str:
    """A role that may only log in, replicate and read its one table, and a publication
    of that table made by the superuser (the DBA); returns the table."""
    name = sql.Identifier(unique_name)
    superuser.execute(
        sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(name, sql.Literal(PASSWORD))
    )
    superuser.execute(sql.SQL("CREATE TABLE public.{} (id int PRIMARY KEY, v text)").format(name))
    superuser.execute(sql.SQL("GRANT SELECT ON public.{} TO {}").format(name, name))
    superuser.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE public.{}").format(name, name))
    return f"public.{unique_name}"


def _settings(
    services: Services,
    secured: SecuredPostgres,
    name: str,
    password_file: Path,
    *,
    ca: Path | None = None,
) -> CaptureSettings:
    base = capture_settings(services, name, [f"public.{name}"], snapshot_mode="initial")
    postgres = PostgresSettings(
        dsn=secured.dsn(name, ca=ca),
        password_file=password_file,
        slot=name,
        publication=name,
        tables=[f"public.{name}"],
    )
    return base.model_copy(update={"postgres": postgres})


def _ops(services: Services, topic: str) -> list[str]:
    """The operation of every record on ``topic`` (``pgdelta.op`` header), sorted."""
    consumer = Consumer(
        {
            "bootstrap.servers": services.kafka_bootstrap_servers,
            "group.id": topic,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return []
        consumer.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
        ops: list[str] = []
        at_end: set[int] = set()
        while len(at_end) < len(metadata.partitions):
            for message in consumer.consume(100, timeout=1):
                if message.error() is not None:
                    at_end.add(message.partition() or 0)
                    continue
                op = dict(message.headers() or []).get("pgdelta.op")
                ops.append(op.decode() if isinstance(op, bytes) else "?")
        return sorted(ops)
    finally:
        consumer.close()


def test_capture_snapshots_and_streams_over_verified_tls_as_a_least_privilege_role(
    services: Services,
    secured_postgres: SecuredPostgres,
    superuser: Connection,
    least_privilege: str,
    unique_name: str,
    tmp_path: Path,
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")  # as `kubectl create secret --from-file` keeps it
    table = sql.Identifier("public", unique_name)
    superuser.execute(sql.SQL("INSERT INTO {} VALUES (1, 'before'), (2, 'before')").format(table))
    settings = _settings(services, secured_postgres, unique_name, password_file)
    capture = CaptureThread(settings)
    capture.start(superuser)
    try:
        topic = table_topic(unique_name, "public", unique_name)
        wait_for(
            lambda: bool(capture.errors) or len(_ops(services, topic)) >= 2,
            "the snapshot never reached Kafka",
            60,
        )
        superuser.execute(sql.SQL("INSERT INTO {} VALUES (3, 'after')").format(table))
        superuser.execute(sql.SQL("UPDATE {} SET v = 'changed' WHERE id = 1").format(table))
        wait_for(
            lambda: bool(capture.errors) or len(_ops(services, topic)) >= 4,
            "the changes never reached Kafka",
            60,
        )
        assert not capture.errors, capture.errors
        assert _ops(services, topic) == ["INSERT", "READ", "READ", "UPDATE"]
        # The replication connection itself is encrypted, as the capture role.
        row = superuser.execute(
            "SELECT s.ssl, r.usename FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid) "
            "WHERE r.usename = %s",
            [unique_name],
        ).fetchone()
        assert row == (True, unique_name)
    finally:
        capture.close(superuser)


def test_a_wrong_ca_names_sslrootcert(
    services: Services,
    secured_postgres: SecuredPostgres,
    least_privilege: str,
    unique_name: str,
    tmp_path: Path,
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    settings = _settings(
        services, secured_postgres, unique_name, password_file, ca=secured_postgres.other_ca
    )
    with pytest.raises(ConfigError, match=r"certificate verify failed.*set sslrootcert"):
        CaptureService(settings, _never()).run()


def test_a_wrong_password_names_the_password_settings(
    services: Services,
    secured_postgres: SecuredPostgres,
    least_privilege: str,
    unique_name: str,
    tmp_path: Path,
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("not-" + PASSWORD)
    settings = _settings(services, secured_postgres, unique_name, password_file)
    with pytest.raises(ConfigError) as raised:
        CaptureService(settings, _never()).run()
    message = str(raised.value)
    assert "password authentication failed" in message
    assert "CAPTURE_POSTGRES__PASSWORD_FILE" in message
    assert "not-" + PASSWORD not in message


def test_a_missing_password_file_names_the_setting(
    services: Services, secured_postgres: SecuredPostgres, unique_name: str, tmp_path: Path
) -> None:
    settings = _settings(services, secured_postgres, unique_name, tmp_path / "not-mounted")
    with pytest.raises(ConfigError, match="not-mounted given by CAPTURE_POSTGRES__PASSWORD_FILE"):
        CaptureService(settings, _never()).run()


def _never() -> threading.Event:
    return threading.Event()
