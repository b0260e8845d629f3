"""A Schema Registry, spoken to over its Confluent-compatible REST API.

Both services use it when the topics carry the registry wire format
(:mod:`schemas.registry_framing`): capture registers each table version's schemas and
writes their ids into the records; apply resolves ids it meets back to schema JSON. The
API is the one Confluent Schema Registry defines and other registries implement
(Apicurio Registry under ``/apis/ccompat/v7``, Karapace, Redpanda); only the calls
below are used, over plain HTTP(S) with the standard library, so neither service needs
a registry client package.

Invariants:

- Registering is idempotent: the registry answers an already registered schema with its
  existing id, and the client caches ``(subject, schema text) -> id``, so a schema is
  sent once per process. Ids are immutable, so ``id -> schema`` is cached for good.
- Errors are classified by what happens next (:mod:`runtime.errors`): an unreachable
  registry, a timeout or a 5xx/429 answer is a :class:`~runtime.errors.TransientError`
  (retry); a refused login is a :class:`~runtime.errors.ConfigError` naming the
  settings; a schema the subject's compatibility rule refuses (409) is an
  :class:`IncompatibleSchemaError` for the caller to pin on its table.
- The password never appears in a message or a log line, and a URL carrying
  credentials is refused: they belong in the password setting or its file.
"""

from __future__ import annotations

import base64
import enum
import json
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from runtime.errors import ConfigError, PipelineError, TransientError
from runtime.secrets import resolve_password
from schemas.registry_framing import MAX_SCHEMA_ID, SchemaId

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class SubjectStrategy(enum.StrEnum):
    """How a subject is named, as the Confluent serializers' ``subject.name.strategy``."""

    TOPIC = "topic"
    """``TopicNameStrategy``: ``<topic>-key`` and ``<topic>-value``."""
    RECORD = "record"
    """``RecordNameStrategy``: the record's full name."""
    TOPIC_RECORD = "topic-record"
    """``TopicRecordNameStrategy``: ``<topic>-<record full name>``."""


class Compatibility(enum.StrEnum):
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"


class SchemaRegistrySettings(BaseModel):
    """Where the Schema Registry is and how to log in (docs/wire-contract.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(
        None,
        description=(
            "base URL of the registry's Confluent-compatible API, e.g. "
            "http://registry:8080/apis/ccompat/v7 for Apicurio; without credentials"
        ),
    )
    username: str | None = Field(None, description="basic auth user")
    password: SecretStr | None = Field(None, description="basic auth password")
    password_file: Path | None = Field(
        None, description="file holding the basic auth password (a mounted secret)"
    )
    ca_file: Path | None = Field(
        None, description="PEM file of the CA(s) that sign the registry's TLS certificate"
    )
    subject_strategy: SubjectStrategy = Field(
        SubjectStrategy.TOPIC,
        description=(
            "subject naming: topic (<topic>-key/-value, TopicNameStrategy), record (the "
            "record's full name) or topic-record (<topic>-<record full name>); capture and "
            "apply must agree"
        ),
    )
    timeout_s: float = Field(10.0, gt=0, description="timeout of each registry request")

    @field_validator("url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """An empty URL (``VAR=`` in an env file or compose) means no registry."""
        return None if value == "" else value


def subject_name(strategy: SubjectStrategy, topic: str, record: str, *, key: bool) -> str:
    """The subject a schema of ``topic`` whose record's full name is ``record`` is
    registered under."""
    if strategy is SubjectStrategy.TOPIC:
        return f"{topic}-{'key' if key else 'value'}"
    if strategy is SubjectStrategy.RECORD:
        return record
    return f"{topic}-{record}"


class IncompatibleSchemaError(PipelineError):
    """The subject's compatibility rule refuses the schema (HTTP 409)."""

    def __init__(self, subject: str, detail: str) -> None:
        super().__init__(
            f"the schema registry refuses the new schema of subject {subject}: {detail}"
        )
        self.subject = subject
        self.detail = detail


class RegistryRequestError(PipelineError):
    """The registry refused a request for a reason that retrying cannot change (a 4xx
    other than a refused login, a missing id or a compatibility refusal)."""


class UnknownSchemaIdError(PipelineError):
    """No schema has this id in the registry."""

    def __init__(self, schema_id: int, url: str) -> None:
        super().__init__(
            f"schema id {schema_id} is not in the schema registry at {url}: the records "
            "were registered in another registry (check the registry URL), or its storage "
            "was lost"
        )
        self.schema_id = schema_id


_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class SchemaRegistryClient:
    """The few calls the services make (module docstring). Thread-safe."""

    def __init__(self, settings: SchemaRegistrySettings, *, setting: str) -> None:
        """``setting``: the env name of ``settings`` (e.g. ``CAPTURE_KAFKA__REGISTRY``),
        named in errors."""
        if settings.url is None:
            raise ConfigError(f"{setting}__URL is not set: give the registry's base URL")
        parsed = urllib.parse.urlsplit(settings.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(
                f"{setting}__URL must be an http(s) URL such as "
                "http://registry:8080/apis/ccompat/v7"
            )
        if parsed.username is not None or parsed.password is not None:
            raise ConfigError(
                f"{setting}__URL carries credentials: keep them in {setting}__USERNAME and "
                f"{setting}__PASSWORD (or {setting}__PASSWORD_FILE)"
            )
        self.url = settings.url.rstrip("/")
        self._setting = setting
        self._timeout_s = settings.timeout_s
        password = resolve_password(
            settings.password, settings.password_file, setting=f"{setting}__PASSWORD"
        )
        self._auth: str | None = None
        if settings.username is not None:
            secret = f"{settings.username}:{password.get_secret_value() if password else ''}"
            self._auth = "Basic " + base64.b64encode(secret.encode("utf-8")).decode("ascii")
        elif password is not None:
            raise ConfigError(f"{setting}__PASSWORD is set without {setting}__USERNAME")
        self._ssl: ssl.SSLContext | None = None
        if settings.ca_file is not None:
            try:
                self._ssl = ssl.create_default_context(cafile=str(settings.ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"cannot load the CA file {settings.ca_file} given by {setting}__CA_FILE: {exc}"
                ) from exc
        self._lock = threading.Lock()
        self._registered: dict[tuple[str, str], SchemaId] = {}
        self._schemas: dict[SchemaId, str] = {}

    # -- calls --------------------------------------------------------------------------

    def register(self, subject: str, schema_json: str) -> SchemaId:
        """The id of ``schema_json`` under ``subject``, registering it as the subject's
        next version if it is new there. Raises :class:`IncompatibleSchemaError` when the
        subject's compatibility rule refuses it."""
        cached = (subject, schema_json)
        with self._lock:
            found = self._registered.get(cached)
        if found is not None:
            return found
        answer = self._call(
            "POST",
            f"/subjects/{_quote(subject)}/versions",
            {"schema": schema_json},
            subject=subject,
        )
        schema_id = _schema_id(answer, f"registering under {subject}")
        with self._lock:
            self._registered[cached] = schema_id
            self._schemas[schema_id] = schema_json
        return schema_id

    def schema(self, schema_id: SchemaId) -> str:
        """The schema JSON registered under ``schema_id`` (cached)."""
        with self._lock:
            found = self._schemas.get(schema_id)
        if found is not None:
            return found
        answer = self._call("GET", f"/schemas/ids/{int(schema_id)}", schema_id=schema_id)
        text = _text(answer, "schema", f"schema id {schema_id}")
        with self._lock:
            self._schemas[schema_id] = text
        return text

    def set_compatibility(self, subject: str, level: Compatibility) -> None:
        """Give ``subject`` its own compatibility ``level``.

        Two writers may set it at once (capture's stream and its snapshot register the
        same table version side by side), and a registry may refuse the second with a
        conflict while the first creates the subject's rule (Apicurio: 409, "A rule
        named 'COMPATIBILITY' already exists"). The rule then exists, so the level is
        read back, and set once more only if it differs."""
        path = f"/config/{_quote(subject)}"
        try:
            self._call("PUT", path, {"compatibility": level.value})
        except RegistryRequestError:
            if self.compatibility(subject) == level.value:
                return
            self._call("PUT", path, {"compatibility": level.value})

    def compatibility(self, subject: str) -> str | None:
        """The subject's own compatibility level, or None when it has none."""
        try:
            answer = self._call("GET", f"/config/{_quote(subject)}")
        except RegistryRequestError:
            return None
        level = answer.get("compatibilityLevel") if isinstance(answer, dict) else None
        return str(level) if level is not None else None

    def subjects(self) -> list[str]:
        answer = self._call("GET", "/subjects")
        if not isinstance(answer, list):
            raise RegistryRequestError(f"the schema registry at {self.url} listed no subjects")
        return [str(subject) for subject in answer]

    def versions(self, subject: str) -> list[int]:
        """The subject's versions, oldest first; empty when the subject is gone."""
        try:
            answer = self._call("GET", f"/subjects/{_quote(subject)}/versions")
        except RegistryRequestError:
            return []
        return sorted(int(v) for v in answer) if isinstance(answer, list) else []

    def version(self, subject: str, version: int) -> tuple[SchemaId, str] | None:
        """The id and schema of one version of ``subject``; None when it is gone."""
        try:
            answer = self._call("GET", f"/subjects/{_quote(subject)}/versions/{int(version)}")
        except RegistryRequestError:
            return None
        schema_id = _schema_id(answer, f"{subject} version {version}")
        text = _text(answer, "schema", f"{subject} version {version}")
        with self._lock:
            self._schemas.setdefault(schema_id, text)
        return schema_id, text

    # -- transport ----------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        subject: str | None = None,
        schema_id: int | None = None,
    ) -> Any:
        headers = {"Accept": CONTENT_TYPE}
        if body is not None:
            headers["Content-Type"] = CONTENT_TYPE
        if self._auth is not None:
            headers["Authorization"] = self._auth
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked in __init__
            self.url + path,
            data=None if body is None else json.dumps(body).encode("utf-8"),
            headers=headers,
            method=method,
        )
        what = f"{method} {path}"
        try:
            with urllib.request.urlopen(  # noqa: S310 - the scheme is checked in __init__
                request, timeout=self._timeout_s, context=self._ssl
            ) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            with exc:  # its response holds the connection
                raise self._refused(exc, what, subject=subject, schema_id=schema_id) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise ConfigError(
                    f"the schema registry at {self.url} has a certificate that does not "
                    f"verify ({reason.verify_message}): give its CA in {self._setting}__CA_FILE"
                ) from exc
            raise TransientError(
                f"the schema registry at {self.url} is unreachable ({what}: {reason})"
            ) from exc
        try:
            return json.loads(payload) if payload else None
        except ValueError as exc:
            raise TransientError(
                f"the schema registry at {self.url} answered {what} with something that is "
                "not JSON: is the URL the Confluent-compatible API's base?"
            ) from exc

    def _refused(
        self,
        exc: urllib.error.HTTPError,
        what: str,
        *,
        subject: str | None,
        schema_id: int | None,
    ) -> PipelineError:
        status = exc.code
        try:
            detail = json.loads(exc.read()).get("message") or exc.reason
        except (ValueError, AttributeError, OSError):
            detail = exc.reason
        if status in _TRANSIENT_STATUS:
            return TransientError(
                f"the schema registry at {self.url} answered {what} with {status}: {detail}"
            )
        if status in (401, 403):
            return ConfigError(
                f"the schema registry at {self.url} refuses the login ({status}) for {what}: "
                f"check {self._setting}__USERNAME and {self._setting}__PASSWORD (or _FILE)"
            )
        if status == 409 and subject is not None:
            return IncompatibleSchemaError(subject, str(detail))
        if status == 404 and schema_id is not None:
            return UnknownSchemaIdError(schema_id, self.url)
        return RegistryRequestError(
            f"the schema registry at {self.url} refused {what} ({status}): {detail}"
        )


def _quote(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


def _schema_id(answer: Any, what: str) -> SchemaId:
    value = answer.get("id") if isinstance(answer, dict) else None
    if not isinstance(value, int) or not 0 < value <= MAX_SCHEMA_ID:
        raise RegistryRequestError(f"the schema registry answered {what} without a valid id")
    return SchemaId(value)


def _text(answer: Any, field: str, what: str) -> str:
    value = answer.get(field) if isinstance(answer, dict) else None
    if not isinstance(value, str):
        raise RegistryRequestError(f"the schema registry answered {what} without its {field}")
    return value
