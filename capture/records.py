"""The records capture produces, as both the stream and the snapshot hand them over.

The stream (:mod:`capture.stream.change_stream`) and a snapshot run
(:mod:`capture.snapshot.run`) make the same records, and the publisher, the held
changes and the in-flight book take them from either; they live here so that neither
side has to import the other to name them.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.headers import Headers


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """One Kafka record to produce, with the facts the in-flight book needs."""

    topic: str
    key: bytes
    value: bytes | None
    headers: Headers
    table: str


@dataclass(frozen=True, slots=True)
class SchemaRecord:
    """A writer schema to publish on the schema topic before records that use it."""

    key: bytes
    value: bytes
