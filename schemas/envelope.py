"""The fixed parts of the contract, read from ``schemas/avro/*.avsc``.

Those files are the published definitions; this module loads them once so the Python
code and a consumer in any other language use the very same JSON.

- ``operation.avsc``: the ``Operation`` enum embedded in every value schema;
- ``table_key.avsc``: the key of records about a whole table (TRUNCATE);
- ``writer_schema.avsc``: the value of a schema-topic record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.single_object import Fingerprint, header, schema_fingerprint

_AVSC_DIR = Path(__file__).with_name("avro")


def load_avsc(name: str) -> dict[str, Any]:
    """The parsed JSON of ``schemas/avro/<name>.avsc``."""
    schema: dict[str, Any] = json.loads(_AVSC_DIR.joinpath(f"{name}.avsc").read_text("utf-8"))
    return schema


OPERATION_SCHEMA = load_avsc("operation")

TABLE_KEY_SCHEMA = load_avsc("table_key")
TABLE_KEY_FINGERPRINT: Fingerprint = schema_fingerprint(TABLE_KEY_SCHEMA)
# The record has no fields, so its body is empty and the key is the header alone.
TABLE_KEY: bytes = header(TABLE_KEY_FINGERPRINT)

WRITER_SCHEMA_SCHEMA = load_avsc("writer_schema")
WRITER_SCHEMA_FINGERPRINT: Fingerprint = schema_fingerprint(WRITER_SCHEMA_SCHEMA)
