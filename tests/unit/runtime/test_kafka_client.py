"""Kafka client properties: the passthrough merged with a secrets directory, the Java
form for Spark's Kafka source, and passwords from files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from pydantic import SecretStr

from runtime.errors import ConfigError
from runtime.kafka_client import ConnectionErrors, client_properties, java_client_properties
from runtime.secrets import read_secret_file, resolve_password


def kubernetes_secret(root: Path, items: dict[str, str]) -> Path:
    """The layout kubelet writes for a Secret volume: the files under a timestamped
    hidden directory, ``..data`` linking to it, one visible link per key."""
    mount = root / "secret"
    stamped = mount / "..2026_11_23_16_00_00.000000001"
    stamped.mkdir(parents=True)
    for name, value in items.items():
        (stamped / name).write_text(value)
    (mount / "..data").symlink_to(stamped.name)
    for name in items:
        (mount / name).symlink_to(Path("..data") / name)
    return mount


def test_merges_the_passthrough_with_one_property_per_file(tmp_path: Path) -> None:
    secrets = kubernetes_secret(tmp_path, {"sasl.password": "s3cret\n", "ssl.key.password": "k"})
    merged = client_properties(
        {"security.protocol": "SASL_SSL", "sasl.username": "capture"}, secrets
    )
    assert merged == {
        "security.protocol": "SASL_SSL",
        "sasl.username": "capture",
        "sasl.password": "s3cret",
        "ssl.key.password": "k",
    }


def test_only_one_trailing_newline_is_removed(tmp_path: Path) -> None:
    (tmp_path / "sasl.password").write_text(" pass word \n\n")
    assert client_properties({}, tmp_path) == {"sasl.password": " pass word \n"}


def test_without_a_secrets_dir_the_passthrough_is_returned_as_is() -> None:
    assert client_properties({"security.protocol": "SSL"}, None) == {"security.protocol": "SSL"}


def test_a_property_in_both_places_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "sasl.password").write_text("from-file")
    with pytest.raises(ConfigError, match=r"sasl\.password is set both in CAPTURE_KAFKA__CLIENT"):
        client_properties({"sasl.password": "inline"}, tmp_path, setting="CAPTURE_KAFKA")


def test_the_error_never_shows_the_value(tmp_path: Path) -> None:
    (tmp_path / "sasl.password").write_text("from-file-sentinel")
    with pytest.raises(ConfigError) as raised:
        client_properties({"sasl.password": "inline-sentinel"}, tmp_path)
    assert "sentinel" not in str(raised.value)


def test_a_missing_secrets_dir_says_what_to_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=r"nowhere \(APPLY_KAFKA__CLIENT_SECRETS_DIR\)"):
        client_properties({}, missing, setting="APPLY_KAFKA")


def test_an_unreadable_secret_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "sasl.password").write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ConfigError, match=r"sasl\.password given by KAFKA__CLIENT_SECRETS_DIR"):
        client_properties({}, tmp_path)


def test_a_directory_entry_that_is_not_hidden_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ssl").mkdir()
    with pytest.raises(ConfigError, match="is not a file"):
        client_properties({}, tmp_path)


def test_bootstrap_servers_has_its_own_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set CAPTURE_KAFKA__BOOTSTRAP_SERVERS instead"):
        client_properties({"bootstrap.servers": "x:9092"}, None, setting="CAPTURE_KAFKA")


def test_java_form_translates_scram_credentials_to_a_jaas_config() -> None:
    java = java_client_properties(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "apply",
            "sasl.password": 'p"w\\d',
        },
        {},
    )
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="apply" password="p\\"w\\\\d";'
        ),
    }


def test_java_form_of_plain_uses_the_plain_login_module() -> None:
    java = java_client_properties(
        {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}, {}
    )
    assert java["sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
    )


def test_java_form_refuses_credentials_it_cannot_translate() -> None:
    with pytest.raises(ConfigError, match="APPLY_KAFKA__SPARK_SOURCE"):
        java_client_properties(
            {"sasl.mechanism": "OAUTHBEARER", "sasl.username": "u", "sasl.password": "p"}, {}
        )
    with pytest.raises(ConfigError, match="set both or neither"):
        java_client_properties({"sasl.mechanism": "PLAIN", "sasl.username": "u"}, {})


def test_java_form_reads_the_ca_file_into_an_inline_pem_truststore(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    ca.write_text(pem + "\n")
    java = java_client_properties({"ssl.ca.location": str(ca)}, {})
    assert java == {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": pem}
    assert java_client_properties({"ssl.ca.pem": "PEM"}, {})["ssl.truststore.certificates"] == (
        "PEM"
    )


def test_java_form_of_a_missing_ca_file_names_the_property(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ssl\.ca\.location"):
        java_client_properties({"ssl.ca.location": str(tmp_path / "missing.pem")}, {})


def test_java_form_of_disabled_hostname_verification_is_the_empty_string() -> None:
    java = java_client_properties({"ssl.endpoint.identification.algorithm": "none"}, {})
    assert java == {"ssl.endpoint.identification.algorithm": ""}


def test_librdkafka_only_names_are_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="runtime.kafka_client"):
        java = java_client_properties(
            {"ssl.key.location": "/k.pem", "ssl.certificate.location": "/c.pem", "acks": "all"},
            {},
        )
    assert java == {"acks": "all"}
    assert "ssl.certificate.location, ssl.key.location" in caplog.text
    assert "/k.pem" not in caplog.text


def test_spark_source_properties_go_on_top_and_silence_the_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="runtime.kafka_client"):
        java = java_client_properties(
            {"ssl.key.location": "/k.pem", "security.protocol": "SSL"},
            {"ssl.key.location": "ignored-by-java", "security.protocol": "SASL_SSL"},
        )
    assert java["security.protocol"] == "SASL_SSL"
    assert caplog.text == ""


def test_spark_source_names_go_without_the_kafka_prefix() -> None:
    with pytest.raises(ConfigError, match=r"without the kafka\. prefix \(ssl\.keystore\.type\)"):
        java_client_properties({}, {"kafka.ssl.keystore.type": "PEM"})


def test_password_from_a_file_loses_one_trailing_newline(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("hunter2\n")
    resolved = resolve_password(None, secret, setting="CAPTURE_POSTGRES__PASSWORD")
    assert resolved is not None
    assert resolved.get_secret_value() == "hunter2"


def test_password_inline_is_kept() -> None:
    inline = SecretStr("x")
    assert resolve_password(inline, None, setting="CAPTURE_POSTGRES__PASSWORD") is inline
    assert resolve_password(None, None, setting="CAPTURE_POSTGRES__PASSWORD") is None


def test_password_inline_and_from_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"both CAPTURE_POSTGRES__PASSWORD and .*_FILE"):
        resolve_password(SecretStr("x"), tmp_path / "p", setting="CAPTURE_POSTGRES__PASSWORD")


def test_an_unreadable_password_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CAPTURE_POSTGRES__PASSWORD_FILE"):
        resolve_password(None, tmp_path / "missing", setting="CAPTURE_POSTGRES__PASSWORD")
    with pytest.raises(ConfigError, match="fix X"):
        read_secret_file(tmp_path, setting="X")


def test_connection_errors_name_what_to_fix_after_a_refused_login() -> None:
    errors = ConnectionErrors("APPLY_KAFKA")
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    errors.check()  # nothing a setting fixes yet
    errors(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"))
    with pytest.raises(ConfigError, match=r"invalid credentials\): check sasl\.username"):
        errors.check()


def test_connection_errors_name_the_ca_after_a_failed_handshake() -> None:
    errors = ConnectionErrors("CAPTURE_KAFKA")
    errors(KafkaError(KafkaError._SSL, "certificate verify failed"))
    with pytest.raises(ConfigError, match=r"check ssl\.ca\.location in CAPTURE_KAFKA__CLIENT"):
        errors.check()


def test_connection_errors_forget_a_refusal_long_past() -> None:
    now = [100.0]
    errors = ConnectionErrors("CAPTURE_KAFKA", recent_s=60, clock=lambda: now[0])
    errors(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error"))
    now[0] += 61
    errors.check()  # a network failure now is not blamed on the old refusal
    errors(KafkaError(KafkaError._SSL, "certificate verify failed"))
    with pytest.raises(ConfigError, match="TLS handshake"):
        errors.check()
