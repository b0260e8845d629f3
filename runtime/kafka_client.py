"""Kafka client properties every client of a service shares, and their Java form.

Both services take the same passthrough, ``<SERVICE>_KAFKA__CLIENT`` (a JSON object of
librdkafka properties: ``security.protocol``, ``sasl.*``, ``ssl.*``), plus
``<SERVICE>_KAFKA__CLIENT_SECRETS_DIR``, a directory holding one file per secret
property (a Kubernetes Secret mounted as a volume: file name = property name). Every
Kafka client of the service (producers, consumers, admin clients) is built on the
merge, so a secured cluster needs the setting once, not per client.

Invariants:

- A property comes from exactly one place: set both inline and as a file, it is a
  :class:`~runtime.errors.ConfigError` naming it, never a silent precedence.
- Hidden entries of the secrets directory are skipped: Kubernetes keeps the real files
  under ``..data`` and ``..<timestamp>`` and links each key to them.
- ``bootstrap.servers`` is not a client property here: each service has its own setting
  for it, and two places for one address would disagree sooner or later.
- Values are never logged, only property names (see docs/security.md).

Spark's Kafka source runs the Java client, whose property names mostly match
librdkafka's but not all; :func:`java_client_properties` applies the one mapping rule
(docs/security.md, "librdkafka and Java"): shared names pass unchanged, the SASL
user/password and the PEM CA are translated, librdkafka-only names with no translation
are left out with a warning, and raw Java properties given for the Spark source alone
(``APPLY_KAFKA__SPARK_SOURCE``) go on top.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from confluent_kafka import KafkaError

from runtime.errors import ConfigError
from runtime.secrets import read_secret_file

log = logging.getLogger(__name__)

_RESERVED = {"bootstrap.servers": "BOOTSTRAP_SERVERS"}


def client_properties(
    client: Mapping[str, str], secrets_dir: Path | None, *, setting: str = "KAFKA"
) -> dict[str, str]:
    """``client`` merged with one property per file of ``secrets_dir``.

    ``setting`` is the env prefix of the service's Kafka settings (``CAPTURE_KAFKA``,
    ``APPLY_KAFKA``), so errors name the variable to change."""
    properties = dict(client)
    if secrets_dir is not None:
        for name, value in _secret_properties(secrets_dir, setting).items():
            if name in properties:
                raise ConfigError(
                    f"Kafka client property {name} is set both in {setting}__CLIENT and as "
                    f"a file in {setting}__CLIENT_SECRETS_DIR ({secrets_dir}): keep one"
                )
            properties[name] = value
    for name, own_setting in _RESERVED.items():
        if name in properties:
            raise ConfigError(
                f"Kafka client property {name} is not taken from {setting}__CLIENT or its "
                f"secrets directory: set {setting}__{own_setting} instead"
            )
    return properties


def _secret_properties(secrets_dir: Path, setting: str) -> dict[str, str]:
    where = f"{setting}__CLIENT_SECRETS_DIR"
    try:
        entries = sorted(secrets_dir.iterdir())
    except OSError as exc:
        raise ConfigError(
            f"cannot read the Kafka client secrets directory {secrets_dir} ({where}): "
            f"{exc.strerror or exc}; mount the secret there or fix {where}"
        ) from exc
    properties: dict[str, str] = {}
    for entry in entries:
        if entry.name.startswith("."):
            continue  # Kubernetes' ..data and ..<timestamp> entries, editors' leftovers
        if not entry.is_file():
            raise ConfigError(
                f"{entry} in {where} is not a file: each entry is one client property, its "
                "content the value"
            )
        properties[entry.name] = read_secret_file(entry, setting=where)
    return properties


# librdkafka names the Java client spells differently and that are translated.
_SASL_USERNAME = "sasl.username"
_SASL_PASSWORD = "sasl.password"  # noqa: S105 - a property name, not a password
_SASL_MECHANISMS = "sasl.mechanisms"
_SSL_CA_LOCATION = "ssl.ca.location"
_SSL_CA_PEM = "ssl.ca.pem"
_SSL_ENDPOINT = "ssl.endpoint.identification.algorithm"
_TRANSLATED = {_SASL_USERNAME, _SASL_PASSWORD, _SASL_MECHANISMS, _SSL_CA_LOCATION, _SSL_CA_PEM}

_LOGIN_MODULES = {
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
}

# librdkafka-only names with a Java counterpart of another shape (keystores, verification
# switches, the Kerberos and OAuth credentials Java takes in its JAAS configuration):
# left out of the Java client, named in a warning; give the Java form in
# APPLY_KAFKA__SPARK_SOURCE. Names both clients share (sasl.kerberos.service.name,
# sasl.oauthbearer.token.endpoint.url) pass; other librdkafka-only names (tuning, debug)
# are passed on too, and the Java client ignores them with its own "isn't a known
# config" warning.
_LIBRDKAFKA_ONLY = {
    "ssl.certificate.location",
    "ssl.certificate.pem",
    "ssl.key.location",
    "ssl.key.pem",
    "ssl.ca.certificate.stores",
    "ssl.crl.location",
    "ssl.engine.location",
    "ssl.providers",
    "enable.ssl.certificate.verification",
    "sasl.kerberos.keytab",
    "sasl.kerberos.principal",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions",
    "enable.sasl.oauthbearer.unsecure.jwt",
}


def java_client_properties(
    properties: Mapping[str, str], spark_source: Mapping[str, str]
) -> dict[str, str]:
    """The Java client's form of the librdkafka ``properties``, with the raw Java
    ``spark_source`` properties on top (without the ``kafka.`` prefix Spark's options
    carry; the caller adds it)."""
    java: dict[str, str] = {}
    left_out: list[str] = []
    for name, value in properties.items():
        if name in _TRANSLATED:
            continue
        if name in _LIBRDKAFKA_ONLY:
            left_out.append(name)
        elif name == _SSL_ENDPOINT and value == "none":
            java[name] = ""  # Java's "no hostname verification" is the empty string
        else:
            java[name] = value
    java.update(_java_sasl(properties))
    java.update(_java_truststore(properties))
    for name in spark_source:
        if name.startswith("kafka."):
            raise ConfigError(
                f"APPLY_KAFKA__SPARK_SOURCE names {name}: give Java client properties "
                f"without the kafka. prefix ({name.removeprefix('kafka.')}); it is added"
            )
    unset = [n for n in left_out if n not in spark_source]
    if unset:
        log.warning(
            "kafka client properties not passed to spark's kafka source (librdkafka only): "
            "%s; give their java equivalents in APPLY_KAFKA__SPARK_SOURCE",
            ", ".join(sorted(unset)),
        )
    java.update(spark_source)
    return java


def _java_sasl(properties: Mapping[str, str]) -> dict[str, str]:
    """``sasl.mechanisms`` as ``sasl.mechanism``; ``sasl.username``/``sasl.password`` as
    the ``sasl.jaas.config`` of the mechanism's login module."""
    java: dict[str, str] = {}
    if _SASL_MECHANISMS in properties:
        if "sasl.mechanism" in properties:
            raise ConfigError(
                "both sasl.mechanism and sasl.mechanisms are set in the Kafka client "
                "properties: keep one"
            )
        java["sasl.mechanism"] = properties[_SASL_MECHANISMS]
    mechanism = java.get("sasl.mechanism", properties.get("sasl.mechanism", "GSSAPI"))
    username, password = properties.get(_SASL_USERNAME), properties.get(_SASL_PASSWORD)
    if username is None and password is None:
        return java
    if username is None or password is None:
        raise ConfigError("sasl.username and sasl.password go together: set both or neither")
    if "sasl.jaas.config" in properties:
        raise ConfigError(
            "sasl.username/sasl.password and sasl.jaas.config are both set in the Kafka "
            "client properties: keep the username and password (librdkafka has no jaas)"
        )
    module = _LOGIN_MODULES.get(mechanism.upper())
    if module is None:
        raise ConfigError(
            f"sasl.username/sasl.password cannot be translated for Spark's Kafka source "
            f"with sasl.mechanism {mechanism} (only {', '.join(sorted(_LOGIN_MODULES))}): "
            "give sasl.jaas.config in APPLY_KAFKA__SPARK_SOURCE"
        )
    java["sasl.jaas.config"] = (
        f'{module} required username="{_jaas_quote(username)}" password="{_jaas_quote(password)}";'
    )
    return java


def _jaas_quote(value: str) -> str:
    # The JAAS parser reads quoted strings with backslash escapes.
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _java_truststore(properties: Mapping[str, str]) -> dict[str, str]:
    """The CA as an inline PEM truststore: read here, on the driver, so executors on
    other machines need no file at the same path."""
    location, pem = properties.get(_SSL_CA_LOCATION), properties.get(_SSL_CA_PEM)
    if location is None and pem is None:
        return {}
    if location is not None and pem is not None:
        raise ConfigError("both ssl.ca.location and ssl.ca.pem are set: keep one")
    if location is not None:
        pem = read_secret_file(Path(location), setting="the Kafka client property ssl.ca.location")
    if "ssl.truststore.location" in properties or "ssl.truststore.certificates" in properties:
        raise ConfigError(
            "ssl.ca.location/ssl.ca.pem and a Java ssl.truststore.* are both set in the "
            "Kafka client properties: keep one"
        )
    return {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": pem or ""}


# librdkafka reports why it could not connect only through the error callback; a request
# that fails meanwhile says "broker transport failure". These two kinds are fixed by a
# setting, not by waiting.
_AUTHENTICATION = KafkaError._AUTHENTICATION
_SSL = KafkaError._SSL


class ConnectionErrors:
    """A client's ``error_cb``: remembers the last login and TLS failure, so a request
    that then fails can say what to fix (:meth:`check`). Holds the librdkafka message
    only, which names the broker and mechanism, never a credential.

    Only failures of the last ``recent_s`` seconds count: librdkafka reports no
    recovery, and a login refused once an hour ago (a broker restarting its SCRAM
    store) must not turn today's network failure into a fatal configuration error."""

    def __init__(
        self,
        setting: str,
        *,
        recent_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._setting = setting
        self._recent_s = recent_s
        self._clock = clock
        self._authentication: tuple[float, str] | None = None
        self._tls: tuple[float, str] | None = None

    def __call__(self, error: KafkaError) -> None:
        if error.code() == _AUTHENTICATION:
            self._authentication = (self._clock(), error.str())
        elif error.code() == _SSL:
            self._tls = (self._clock(), error.str())

    def _recent(self, seen: tuple[float, str] | None) -> str | None:
        if seen is None or self._clock() - seen[0] > self._recent_s:
            return None
        return seen[1]

    def check(self) -> None:
        """Raise :class:`ConfigError` if the broker refused the login or the TLS
        handshake failed lately; serve the client's callbacks (``poll``) before."""
        where = f"{self._setting}__CLIENT or {self._setting}__CLIENT_SECRETS_DIR"
        authentication, tls = self._recent(self._authentication), self._recent(self._tls)
        if authentication is not None:
            raise ConfigError(
                f"Kafka refused the login ({authentication}): check sasl.username, "
                f"sasl.password and sasl.mechanism in {where}"
            )
        if tls is not None:
            raise ConfigError(
                f"the TLS handshake with Kafka failed ({tls}): check ssl.ca.location in "
                f"{where} (the CA that signed the broker's certificate) and that the "
                "certificate names the host of the bootstrap servers"
            )


KafkaConf = dict[str, str | int | float | bool]
"""A librdkafka client configuration (callbacks go as keyword arguments: ``error_cb=``)."""


def connection_conf(bootstrap_servers: str, properties: Mapping[str, str]) -> KafkaConf:
    """What every librdkafka client of a service starts from: the bootstrap servers and
    the shared ``properties`` (:func:`client_properties`). Build the client with a
    :class:`ConnectionErrors` as ``error_cb`` so a refused login is reported as such."""
    return {**properties, "bootstrap.servers": bootstrap_servers}
