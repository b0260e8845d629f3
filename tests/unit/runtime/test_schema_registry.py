"""Subject naming, the registry settings of both services, and the client's refusals
that need no registry (a registry that answers is exercised in
tests/integration/test_registry_client.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from apply.control.feedback import is_value_subject
from capture.settings import KafkaSettings as CaptureKafka
from runtime.errors import ConfigError, TransientError
from runtime.schema_registry import (
    SchemaRegistryClient,
    SchemaRegistrySettings,
    SubjectStrategy,
    subject_name,
)

RECORD = "pgdelta.public.orders.s0123456789abcdef.Change"
KEY = "pgdelta.public.orders.s0123456789abcdef.Key"


@pytest.mark.parametrize(
    ("strategy", "key", "subject"),
    [
        (SubjectStrategy.TOPIC, False, "cdc.public.orders-value"),
        (SubjectStrategy.TOPIC, True, "cdc.public.orders-key"),
        (SubjectStrategy.RECORD, False, RECORD),
        (SubjectStrategy.RECORD, True, KEY),
        (SubjectStrategy.TOPIC_RECORD, False, f"cdc.public.orders-{RECORD}"),
        (SubjectStrategy.TOPIC_RECORD, True, f"cdc.public.orders-{KEY}"),
    ],
)
def test_subject_names_follow_the_confluent_strategies(
    strategy: SubjectStrategy, key: bool, subject: str
) -> None:
    record = KEY if key else RECORD
    assert subject_name(strategy, "cdc.public.orders", record, key=key) == subject
    # apply reads back exactly the value subjects capture registers under.
    assert is_value_subject(subject, strategy, "cdc") is not key


def test_apply_reads_only_its_own_prefix_under_the_topic_strategies() -> None:
    assert not is_value_subject("other.public.orders-value", SubjectStrategy.TOPIC, "cdc")
    assert not is_value_subject("cdcx.public.orders-value", SubjectStrategy.TOPIC, "cdc")
    assert not is_value_subject(
        f"other.public.orders-{RECORD}", SubjectStrategy.TOPIC_RECORD, "cdc"
    )
    assert not is_value_subject("com.acme.Order", SubjectStrategy.RECORD, "cdc")


def test_registry_encoding_needs_a_url() -> None:
    with pytest.raises(ValidationError, match="CAPTURE_KAFKA__REGISTRY__URL"):
        CaptureKafka(encoding="registry")
    settings = CaptureKafka(
        encoding="registry", registry=SchemaRegistrySettings(url="http://registry:8080/apis")
    )
    assert settings.registry.subject_strategy is SubjectStrategy.TOPIC
    assert CaptureKafka().encoding == "single-object"


def test_an_unknown_encoding_is_refused() -> None:
    with pytest.raises(ValidationError):
        CaptureKafka(encoding="confluent")


SETTING = "CAPTURE_KAFKA__REGISTRY"


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        (SchemaRegistrySettings(), f"{SETTING}__URL is not set"),
        (SchemaRegistrySettings(url="registry:8080"), "must be an http"),
        (SchemaRegistrySettings(url="ftp://registry/"), "must be an http"),
        (
            SchemaRegistrySettings(url="http://user:s3cr3t-url@registry:8080"),
            f"carries credentials: keep them in {SETTING}__USERNAME",
        ),
        (
            SchemaRegistrySettings(url="http://registry:8080", password=SecretStr("pw-Xy7q")),
            f"{SETTING}__PASSWORD is set without {SETTING}__USERNAME",
        ),
        (
            SchemaRegistrySettings(
                url="http://registry:8080",
                username="u",
                password=SecretStr("pw-Xy7q"),
                password_file=Path("/nonexistent"),
            ),
            "keep one",
        ),
        (
            SchemaRegistrySettings(
                url="http://registry:8080", username="u", password_file=Path("/nonexistent")
            ),
            f"given by {SETTING}__PASSWORD_FILE",
        ),
        (
            SchemaRegistrySettings(url="https://registry:8080", ca_file=Path("/nonexistent")),
            f"given by {SETTING}__CA_FILE",
        ),
    ],
)
def test_settings_that_cannot_work_are_config_errors(
    settings: SchemaRegistrySettings, complaint: str
) -> None:
    with pytest.raises(ConfigError, match=complaint) as caught:
        SchemaRegistryClient(settings, setting=SETTING)
    assert "s3cr3t" not in str(caught.value)
    assert "pw-Xy7q" not in str(caught.value)


def test_an_unreachable_registry_is_transient() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    client = SchemaRegistryClient(
        SchemaRegistrySettings(url=f"http://127.0.0.1:{port}/apis/ccompat/v7", timeout_s=2),
        setting=SETTING,
    )
    with pytest.raises(TransientError, match="unreachable"):
        client.register("cdc.public.orders-value", '"long"')
