"""The headers of a table version's records: single-object, or registered schemas' ids.

A :data:`Framer` is asked once per table version (each time a :class:`TableCodec
<capture.rows.codec.TableCodec>` is built, before its first record is encoded) for
the headers its encoder writes (:class:`~schemas.change_record.RecordFraming`).

- :func:`single_object` (``CAPTURE_KAFKA__ENCODING=single-object``, the default): the
  fingerprints' headers; the schemas reach consumers on the schema topic only.
- :class:`RegistryFramer` (``registry``): registers the value schema, the key schema and
  the TRUNCATE key's ``TableKey`` schema under their subjects
  (:func:`runtime.schema_registry.subject_name`) and writes their ids. The schema topic
  is still written (:mod:`capture.stream.change_stream`), so our own reader keeps working.

Compatibility, set explicitly on every subject the first time this process registers
under it (a registry's default may be anything; Apicurio's is no check at all):

- value subjects: ``FULL_TRANSITIVE``. Every column of ``Row`` is ``["null", T]`` with
  default null, so the versions an ADD COLUMN or DROP COLUMN (or a rename, which is
  both) makes can each read the records of every other: a consumer with any version
  reads the whole topic. The record namespaces differ per version (they end in a
  digest, :mod:`schemas.change_record`), which Avro's resolution ignores: it matches
  records by their unqualified names. A retyped column is not compatible; the registry
  refuses it, and that table goes to ``errored`` with the subject and the way out in
  the message, while the other tables stream on.
- key subjects: ``NONE``. Under the topic strategy one key subject holds two record
  types, the table's ``Key`` and the TRUNCATE record's ``TableKey``, which no level but
  ``NONE`` lets share a subject; and a key schema changes only with the key columns,
  which the lake cannot follow without a resync anyway.

Errors: a registry that cannot be reached is a
:class:`~runtime.errors.TransientError` (the attempt restarts from the slot); a refused
schema is the table's :class:`~capture.errors.TableError`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from capture.errors import TableError
from capture.settings import KafkaSettings
from runtime.schema_registry import (
    Compatibility,
    IncompatibleSchemaError,
    RegistryRequestError,
    SchemaRegistryClient,
    SubjectStrategy,
    subject_name,
)
from schemas.change_record import RecordFraming, TableSchemas, single_object_framing
from schemas.envelope import TABLE_KEY_SCHEMA
from schemas.registry_framing import SchemaId, header

Framer = Callable[[TableSchemas, str], RecordFraming]
"""The headers of the records of ``schemas`` on ``topic``; may register them."""

TABLE_KEY_SCHEMA_JSON = json.dumps(TABLE_KEY_SCHEMA, separators=(",", ":"))
VALUE_COMPATIBILITY = Compatibility.FULL_TRANSITIVE
KEY_COMPATIBILITY = Compatibility.NONE


def single_object(schemas: TableSchemas, topic: str) -> RecordFraming:
    """The single-object headers (the default framing)."""
    return single_object_framing(schemas)


def _full_name(schema: dict[str, object]) -> str:
    return f"{schema['namespace']}.{schema['name']}"


class RegistryFramer:
    """Registers each table version's schemas and frames its records with their ids."""

    def __init__(self, client: SchemaRegistryClient, strategy: SubjectStrategy) -> None:
        self._client = client
        self._strategy = strategy
        self._lock = threading.Lock()
        self._configured: set[str] = set()

    def __call__(self, schemas: TableSchemas, topic: str) -> RecordFraming:
        table = schemas.description.qualified_name
        value_subject = self._subject(topic, schemas.value_schema, key=False)
        try:
            value_id = self._register(value_subject, schemas.value_schema_json, key=False)
            key_id = self._register(
                self._subject(topic, schemas.key_schema, key=True),
                schemas.key_schema_json,
                key=True,
            )
            table_key_id = self._register(
                self._subject(topic, TABLE_KEY_SCHEMA, key=True), TABLE_KEY_SCHEMA_JSON, key=True
            )
        except IncompatibleSchemaError as exc:
            raise TableError(
                table,
                f"{exc}. Subject {exc.subject} checks {VALUE_COMPATIBILITY.value}, which "
                "added and dropped columns pass and a retyped column does not. Every reader "
                f"of the subject is affected: delete the subject {exc.subject} in the "
                "registry so the new schema starts it anew (records already written keep "
                f"their ids), then run `python -m capture resync {table}` and restart capture",
            ) from exc
        except RegistryRequestError as exc:
            raise TableError(table, f"cannot register its schemas: {exc}") from exc
        return RecordFraming(
            key=header(key_id), value=header(value_id), table_key=header(table_key_id)
        )

    def _subject(self, topic: str, schema: dict[str, object], *, key: bool) -> str:
        return subject_name(self._strategy, topic, _full_name(schema), key=key)

    def _register(self, subject: str, schema_json: str, *, key: bool) -> SchemaId:
        with self._lock:
            configured = subject in self._configured
        if not configured:
            level = KEY_COMPATIBILITY if key else VALUE_COMPATIBILITY
            self._client.set_compatibility(subject, level)
            with self._lock:
                self._configured.add(subject)
        return self._client.register(subject, schema_json)


def framer_for(settings: KafkaSettings) -> Framer:
    """The framer ``CAPTURE_KAFKA__ENCODING`` chooses; a registry client for ``registry``
    (its password file is read here, so a missing one is a ConfigError now)."""
    if settings.encoding == "single-object":
        return single_object
    client = SchemaRegistryClient(settings.registry, setting="CAPTURE_KAFKA__REGISTRY")
    return RegistryFramer(client, settings.registry.subject_strategy)
