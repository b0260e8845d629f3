"""How PostgreSQL identifiers become Avro names and Kafka topic names.

PostgreSQL identifiers may hold any character (``"order-items"``, ``"Straße"``,
``"1st"``); Avro names are ``[A-Za-z_][A-Za-z0-9_]*`` and topic names
``[A-Za-z0-9._-]{1,249}``. Both mappings are injective, so two distinct identifiers never
share a name, and both leave the common case (snake_case ASCII) unchanged.

Avro names (:func:`avro_name`):

- an identifier that is a valid Avro name and does not start with :data:`ESCAPE_PREFIX`
  (``_pg_``) is used as is;
- any other identifier becomes ``_pg_`` followed by its escaped form: ASCII letters and
  digits stay, ``_`` becomes ``__``, every other character becomes ``_`` plus two lower
  case hex digits per UTF-8 byte (``-`` -> ``_2d``, ``ß`` -> ``_c3_9f``).

  A name is kept only when it does not start with the prefix and every escaped name
  starts with it, so kept and escaped names never meet; within the escaped ones ``_`` is
  always followed by ``_`` or by two hex digits, so the escape reads back one way only.
  The original identifier travels in the schema as the ``pg.name`` attribute.

Topic segments (:func:`topic_segment`): letters, digits and ``_`` stay; every other
character, ``.`` and ``-`` included, becomes ``-`` plus two lower case hex digits per
UTF-8 byte. ``-`` appears only as that escape and ``.`` only between segments, so a
table topic ``<prefix>.<schema>.<table>`` names exactly one table, and
``<prefix>._schemas`` (one segment after the prefix) is never a table topic.
"""

from __future__ import annotations

import re

from schemas.errors import TableDefinitionError

ESCAPE_PREFIX = "_pg_"
SCHEMA_TOPIC_SUFFIX = "_schemas"
MAX_TOPIC_LENGTH = 249

_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_AVRO_KEPT_CHAR = re.compile(r"[A-Za-z0-9]")
_TOPIC_KEPT_CHAR = re.compile(r"[A-Za-z0-9_]")
_TOPIC_PREFIX = re.compile(r"[A-Za-z0-9._-]+")


def avro_name(identifier: str) -> str:
    """The Avro name for a PostgreSQL identifier (see the module docstring for the rule)."""
    if not identifier:
        raise ValueError("an empty identifier has no Avro name")
    if _AVRO_NAME.fullmatch(identifier) and not identifier.startswith(ESCAPE_PREFIX):
        return identifier
    parts = [ESCAPE_PREFIX]
    for char in identifier:
        if _AVRO_KEPT_CHAR.match(char):
            parts.append(char)
        elif char == "_":
            parts.append("__")
        else:
            parts.extend(f"_{byte:02x}" for byte in char.encode("utf-8"))
    return "".join(parts)


def topic_segment(identifier: str) -> str:
    """The topic-name segment for a PostgreSQL identifier."""
    if not identifier:
        raise ValueError("an empty identifier has no topic segment")
    return "".join(
        char
        if _TOPIC_KEPT_CHAR.match(char)
        else "".join(f"-{byte:02x}" for byte in char.encode("utf-8"))
        for char in identifier
    )


def _check_prefix(prefix: str) -> None:
    if not _TOPIC_PREFIX.fullmatch(prefix) or prefix.startswith(".") or prefix.endswith("."):
        raise ValueError(
            f"topic prefix {prefix!r} is not usable: use letters, digits, '.', '_' and '-' "
            "only, not starting or ending with '.'"
        )


def _too_long(topic: str) -> str:
    return (
        f"topic name {topic[:40]}... is {len(topic)} characters, Kafka allows "
        f"{MAX_TOPIC_LENGTH}: choose a shorter topic prefix"
    )


def table_topic(prefix: str, schema: str, table: str) -> str:
    """The change topic of a table: ``<prefix>.<schema>.<table>`` with escaped segments."""
    _check_prefix(prefix)
    topic = f"{prefix}.{topic_segment(schema)}.{topic_segment(table)}"
    if len(topic) > MAX_TOPIC_LENGTH:
        raise TableDefinitionError(f"{schema}.{table}", _too_long(topic))
    return topic


def schema_topic(prefix: str) -> str:
    """The compacted topic holding every writer schema: ``<prefix>._schemas``."""
    _check_prefix(prefix)
    topic = f"{prefix}.{SCHEMA_TOPIC_SUFFIX}"
    if len(topic) > MAX_TOPIC_LENGTH:
        raise ValueError(_too_long(topic))
    return topic
