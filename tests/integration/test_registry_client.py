"""runtime.schema_registry's client against the real Apicurio Registry: registering is
idempotent, ids resolve back to the schema, a refused schema is an
IncompatibleSchemaError naming the subject, an unknown id is named as such."""

from __future__ import annotations

import json
import threading

import pytest

from runtime.schema_registry import (
    Compatibility,
    IncompatibleSchemaError,
    SchemaRegistryClient,
    SchemaRegistrySettings,
    UnknownSchemaIdError,
)
from schemas.registry_framing import MAX_SCHEMA_ID, SchemaId


def _record(namespace: str, fields: list[tuple[str, str]]) -> str:
    return json.dumps(
        {
            "type": "record",
            "name": "Change",
            "namespace": namespace,
            "fields": [{"name": n, "type": ["null", t], "default": None} for n, t in fields],
        }
    )


def test_register_resolve_and_refuse(schema_registry_url: str, unique_name: str) -> None:
    client = SchemaRegistryClient(
        SchemaRegistrySettings(url=schema_registry_url), setting="CAPTURE_KAFKA__REGISTRY"
    )
    subject = f"{unique_name}-value"
    client.set_compatibility(subject, Compatibility.FULL_TRANSITIVE)
    first = _record(f"{unique_name}.s1", [("id", "long")])
    schema_id = client.register(subject, first)
    assert client.register(subject, first) == schema_id
    # A fresh client (nothing cached) gets the same id from the registry itself.
    fresh = SchemaRegistryClient(
        SchemaRegistrySettings(url=schema_registry_url), setting="APPLY_KAFKA__REGISTRY"
    )
    assert fresh.register(subject, first) == schema_id
    assert json.loads(fresh.schema(schema_id)) == json.loads(first)

    # An added nullable column passes FULL_TRANSITIVE, though the namespace differs.
    added = _record(f"{unique_name}.s2", [("id", "long"), ("note", "string")])
    second_id = client.register(subject, added)
    assert second_id != schema_id
    assert fresh.versions(subject) == [1, 2]
    found = fresh.version(subject, 2)
    assert found is not None
    # The registry may hand the text back reformatted: the same schema, not the same bytes.
    assert (found[0], json.loads(found[1])) == (second_id, json.loads(added))
    assert subject in fresh.subjects()
    assert fresh.compatibility(subject) == "FULL_TRANSITIVE"

    retyped = _record(f"{unique_name}.s3", [("id", "string"), ("note", "string")])
    with pytest.raises(IncompatibleSchemaError) as caught:
        client.register(subject, retyped)
    assert caught.value.subject == subject
    assert subject in str(caught.value)
    assert fresh.versions(subject) == [1, 2]

    with pytest.raises(UnknownSchemaIdError, match="not in the schema registry"):
        fresh.schema(SchemaId(MAX_SCHEMA_ID))
    assert fresh.versions(f"{unique_name}-missing") == []


def test_setting_a_subjects_compatibility_twice_at_once_succeeds_for_both(
    schema_registry_url: str, unique_name: str
) -> None:
    """Capture's stream and its snapshot may configure a new subject side by side; the
    registry may refuse the second creation of the subject's rule with a conflict."""
    settings = SchemaRegistrySettings(url=schema_registry_url)
    clients = [SchemaRegistryClient(settings, setting="CAPTURE_KAFKA__REGISTRY") for _ in range(4)]
    subjects = [f"{unique_name}-{i}-key" for i in range(10)]
    errors: list[BaseException] = []

    def configure(client: SchemaRegistryClient, start: threading.Barrier, subject: str) -> None:
        try:
            start.wait(10)
            client.set_compatibility(subject, Compatibility.FULL_TRANSITIVE)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    for subject in subjects:
        start = threading.Barrier(len(clients))
        threads = [
            threading.Thread(target=configure, args=(client, start, subject)) for client in clients
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    assert {clients[0].compatibility(s) for s in subjects} == {"FULL_TRANSITIVE"}
