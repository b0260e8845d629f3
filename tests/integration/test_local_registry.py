"""The launcher's Apicurio Registry answers the Confluent-compatible API: a schema
registered under a subject gets an id, is found again by that id, and the subject's
compatibility level can be set and read back."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

pytestmark = pytest.mark.slow

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def _call(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        url,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_a_schema_registered_under_a_subject_is_found_by_its_id(
    schema_registry_url: str, unique_name: str
) -> None:
    subject = f"{unique_name}-value"
    schema = {
        "type": "record",
        "name": "Row",
        "namespace": "test",
        "fields": [{"name": "id", "type": "long"}],
    }
    registered = _call(
        f"{schema_registry_url}/subjects/{subject}/versions",
        "POST",
        {"schema": json.dumps(schema)},
    )
    assert isinstance(registered["id"], int)
    found = _call(f"{schema_registry_url}/schemas/ids/{registered['id']}")
    assert json.loads(found["schema"]) == schema
    assert _call(f"{schema_registry_url}/subjects/{subject}/versions") == [1]

    _call(f"{schema_registry_url}/config/{subject}", "PUT", {"compatibility": "BACKWARD"})
    assert _call(f"{schema_registry_url}/config/{subject}")["compatibilityLevel"] == "BACKWARD"
