"""Which source table a change topic carries, and where its Delta table lives.

A change topic is ``<prefix>.<schema>.<table>`` with both names escaped by
:func:`schemas.naming.topic_segment`; segments never contain ``.``, so the last two
segments name the table whatever the prefix is, and the escape reads back one way only
(``-`` always starts a ``-xx`` byte escape).

The Delta table of ``schema.table`` lives at ``<lake_root>/<schema segment>/<table
segment>``: the same escaped segments as the topic. They hold only ``[A-Za-z0-9_-]``, so
every file system and object store accepts them, and for the usual snake_case names
they are the PostgreSQL names themselves (``<lake_root>/public/orders``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from apply.errors import ConfigError
from schemas.naming import topic_segment

_SEGMENT = re.compile(r"(?:[A-Za-z0-9_]|-[0-9a-f]{2})+")
_ESCAPE = re.compile(r"-([0-9a-f]{2})")


@dataclass(frozen=True, slots=True, order=True)
class TableId:
    """A PostgreSQL table, by its unquoted schema and table names."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"


def _unescape(segment: str) -> str:
    if not _SEGMENT.fullmatch(segment):
        raise ValueError(segment)
    data = bytearray()
    position = 0
    for match in _ESCAPE.finditer(segment):
        data += segment[position : match.start()].encode("ascii")
        data.append(int(match[1], 16))
        position = match.end()
    data += segment[position:].encode("ascii")
    name = data.decode("utf-8")
    if topic_segment(name) != segment:
        # e.g. "-61" for "a": topic_segment never escapes a kept character.
        raise ValueError(segment)
    return name


def table_of_topic(topic: str) -> TableId:
    """The table whose changes ``topic`` carries (see the module docstring)."""
    parts = topic.split(".")
    if len(parts) < 3:
        raise ConfigError(
            f"topic {topic!r} is not a change topic <prefix>.<schema>.<table>: subscribe the "
            "apply job to the change topics only (not the schema or control topic)"
        )
    try:
        return TableId(_unescape(parts[-2]), _unescape(parts[-1]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"topic {topic!r} does not end in two escaped table-name segments as the capture "
            "writes them (docs/wire-contract.md, names): subscribe the apply job to the "
            "change topics only"
        ) from exc


def table_of_segments(schema_segment: str, table_segment: str) -> TableId:
    """The table whose lake folders are ``<schema_segment>/<table_segment>``; raises
    ``ValueError`` for names :func:`table_path` never writes."""
    return TableId(_unescape(schema_segment), _unescape(table_segment))


def table_path(lake_root: str, table: TableId) -> str:
    """The location of the Delta table of ``table`` under ``lake_root`` (path or URI)."""
    return f"{lake_root.rstrip('/')}/{topic_segment(table.schema)}/{topic_segment(table.table)}"
