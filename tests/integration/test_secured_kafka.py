"""capture and apply through a Kafka listener that takes only TLS with SCRAM logins.

The broker (:func:`~tests.plugins.secured.secured_kafka`) is reached only on its
``SASL_SSL`` listener; each service logs in as its own SCRAM-SHA-512 user with the
password in a secrets directory laid out as a mounted Kubernetes Secret, and may do only
what the ACLs of docs/security.md allow (the broker's authorizer is on). Every Kafka
client of both services is on the path: capture's admin client, producer and control
consumer, apply's Spark source (the Java client, with the translated properties), schema
consumer, control producer and status consumer, and the status reader. A wrong password
or CA must stop them with a message naming the setting to fix.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from psycopg import sql

from apply.control.feedback import SchemaCatalog
from apply.control.table_status import read_table_statuses
from apply.settings import ApplySettings, LakeSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture.errors import ConfigError
from capture.service import CaptureService
from capture.settings import CaptureSettings
from deploy.local.kafka import READY_TOPIC
from pipeline.status import StatusReader
from schemas.naming import table_topic
from tests.plugins.capture import CaptureThread, capture_settings, confirmed_lsn, current_lsn
from tests.plugins.secured import SecuredKafka, pipeline_acls
from tests.plugins.services import Services
from tests.plugins.topics import end_offsets
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]


def mounted_secret(root: Path, items: dict[str, str]) -> Path:
    """A directory as kubelet mounts a Secret: the files under a hidden timestamped
    directory, ``..data`` linking to it, and one link per key."""
    stamped = root / "..2026_11_23_00_00_00.000000001"
    stamped.mkdir(parents=True)
    for name, value in items.items():
        (stamped / name).write_text(value + "\n")
    (root / "..data").symlink_to(stamped.name)
    for name in items:
        (root / name).symlink_to(Path("..data") / name)
    return root


def secured_capture(
    services: Services, kafka: SecuredKafka, name: str, secrets: Path, *, ca: Path | None = None
) -> CaptureSettings:
    base = capture_settings(services, name, [f"public.{name}"])
    secured = base.kafka.model_copy(
        update={
            "bootstrap_servers": kafka.bootstrap_servers,
            "client": kafka.client("capture", ca=ca),
            "client_secrets_dir": secrets,
        }
    )
    return base.model_copy(update={"kafka": secured})


def secured_apply(
    capture: CaptureSettings, kafka: SecuredKafka, secrets: Path, tmp_path: Path
) -> ApplySettings:
    return ApplySettings(
        kafka=ApplyKafka(
            bootstrap_servers=kafka.bootstrap_servers,
            topic_prefix=capture.kafka.topic_prefix,
            control_topic=capture.kafka.control_topic,
            schema_topic=capture.kafka.schema_topic,
            client=kafka.client("apply"),
            client_secrets_dir=secrets,
        ),
        lake=LakeSettings(root=str(tmp_path / "lake"), checkpoint_root=str(tmp_path / "cp")),
        trigger=TriggerSettings(mode="available_now"),
    )


def records_in(kafka: SecuredKafka, topic: str) -> int:
    """Records on ``topic``, asked through the secured listener as the apply user."""
    consumer = Consumer(
        {
            **kafka.client("apply"),
            "sasl.password": kafka.users["apply"],
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": topic,
        }
    )
    try:
        # Capture's topics start empty and are never compacted: the end offsets add up to
        # the records (a topic it created a moment ago may have no leader yet: retried).
        return sum(end_offsets(consumer, topic).values())
    finally:
        consumer.close()


def create_table(pg: Connection, name: str) -> sql.Identifier:
    table = sql.Identifier("public", name)
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(table))
    return table


@pytest.mark.slow
def test_capture_and_apply_stream_through_sasl_ssl(
    services: Services,
    secured_kafka: SecuredKafka,
    pg: Connection,
    spark: object,
    unique_name: str,
    tmp_path: Path,
) -> None:
    from pyspark.sql import SparkSession  # noqa: PLC0415 - Spark only where needed

    from apply.app import ApplyJob  # noqa: PLC0415

    assert isinstance(spark, SparkSession)
    table = create_table(pg, unique_name)
    capture_secret = mounted_secret(
        tmp_path / "capture-secret", {"sasl.password": secured_kafka.users["capture"]}
    )
    apply_secret = mounted_secret(
        tmp_path / "apply-secret", {"sasl.password": secured_kafka.users["apply"]}
    )
    capture = secured_capture(services, secured_kafka, unique_name, capture_secret)
    apply = secured_apply(capture, secured_kafka, apply_secret, tmp_path)
    # Each user gets only the ACLs docs/security.md lists.
    secured_kafka.grant(
        pipeline_acls(
            capture="capture",
            apply="apply",
            prefix=unique_name,
            control_topic=capture.kafka.control_topic,
            schema_topic=capture.kafka.schema_topic,
        )
    )
    thread = CaptureThread(capture)
    thread.start(pg)
    try:
        pg.execute(
            sql.SQL("INSERT INTO {} VALUES (1, 'one'), (2, 'two'), (3, 'three')").format(table)
        )
        pg.execute(sql.SQL("UPDATE {} SET v = 'uno' WHERE id = 1").format(table))
        pg.execute(sql.SQL("DELETE FROM {} WHERE id = 2").format(table))
        written = current_lsn(pg)
        topic = table_topic(unique_name, "public", unique_name)
        wait_for(
            lambda: bool(thread.errors) or records_in(secured_kafka, topic) >= 5,
            "the changes never reached the secured broker",
            60,
        )
        assert not thread.errors, thread.errors
        assert records_in(secured_kafka, topic) == 5

        # apply: schema consumer, Spark's Kafka source (Java client), control producer.
        with ApplyJob(apply, spark) as job:
            job.run(threading.Event())
        lake = spark.read.format("delta").load(str(tmp_path / "lake" / "public" / unique_name))
        assert sorted((r["id"], r["v"]) for r in lake.collect()) == [(1, "uno"), (3, "three")]

        # capture's control consumer read apply's progress: the slot moved past the changes.
        wait_for(
            lambda: confirmed_lsn(pg, unique_name) >= written,
            "capture never confirmed what apply applied",
            60,
        )
        assert not thread.errors, thread.errors

        # The operator's views read through the same listener.
        with StatusReader(capture, apply) as reader:
            status = reader.read()
        view = next(t for t in status.tables if t.table == f"public.{unique_name}")
        assert (view.waiting, view.apply_errored, view.applied_lsn is not None) == (0, False, True)
        statuses = read_table_statuses(apply.kafka)
        assert (
            f"public.{unique_name}" not in statuses or not statuses[f"public.{unique_name}"].errored
        )
    finally:
        thread.close(pg)


def test_a_wrong_password_stops_capture_naming_the_secrets_dir(
    services: Services,
    secured_kafka: SecuredKafka,
    pg: Connection,
    unique_name: str,
    tmp_path: Path,
) -> None:
    create_table(pg, unique_name)
    secret = mounted_secret(tmp_path / "secret", {"sasl.password": "not-the-password"})
    settings = secured_capture(services, secured_kafka, unique_name, secret)
    try:
        with pytest.raises(ConfigError) as raised:
            CaptureService(settings, threading.Event()).run()
    finally:
        pg.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(unique_name)))
    message = str(raised.value)
    assert "Kafka refused the login" in message
    assert "CAPTURE_KAFKA__CLIENT_SECRETS_DIR" in message
    assert "not-the-password" not in message


def test_a_wrong_ca_or_password_stops_apply_naming_the_setting(
    services: Services, secured_kafka: SecuredKafka, unique_name: str, tmp_path: Path
) -> None:
    capture = capture_settings(services, unique_name, [f"public.{unique_name}"])
    wrong_password = mounted_secret(tmp_path / "wrong", {"sasl.password": "not-the-password"})
    apply = secured_apply(capture, secured_kafka, wrong_password, tmp_path)
    with pytest.raises(ConfigError, match=r"Kafka refused the login .* APPLY_KAFKA__CLIENT"):
        SchemaCatalog(apply.kafka).refresh()

    right_password = mounted_secret(
        tmp_path / "right", {"sasl.password": secured_kafka.users["apply"]}
    )
    wrong_ca = apply.kafka.model_copy(
        update={
            "client": secured_kafka.client("apply", ca=secured_kafka.other_ca),
            "client_secrets_dir": right_password,
        }
    )
    with pytest.raises(ConfigError, match=r"check ssl\.ca\.location in APPLY_KAFKA__CLIENT"):
        read_table_statuses(wrong_ca)


def test_the_broker_shows_a_user_only_what_its_acls_allow(
    secured_kafka: SecuredKafka, unique_name: str
) -> None:
    """The authorizer is on, so the streaming test above proves the ACL recipe: a user
    without an ACL for a topic does not even see it."""
    topic = f"{unique_name}.public.orders"
    assert not secured_kafka.may_describe("apply", topic)
    secured_kafka.grant(
        pipeline_acls(
            capture="capture",
            apply="apply",
            prefix=unique_name,
            control_topic=f"{unique_name}._control",
            schema_topic=f"{unique_name}._schemas",
        )
    )
    assert secured_kafka.may_describe("apply", topic)
    assert not secured_kafka.may_describe("apply", f"other{unique_name}.public.orders")
    admin = AdminClient(
        {
            **secured_kafka.client("apply"),
            "sasl.password": secured_kafka.users["apply"],
            "bootstrap.servers": secured_kafka.bootstrap_servers,
        }
    )
    plain = AdminClient({"bootstrap.servers": secured_kafka.admin_bootstrap_servers})
    assert READY_TOPIC in plain.list_topics(timeout=10).topics
    assert READY_TOPIC not in admin.list_topics(timeout=10).topics
