"""The control topic: how far the apply job got, per change-topic partition.

apply publishes one message per change-topic partition after each Delta commit that
touched it; capture reads them to decide which LSN it may confirm to PostgreSQL. The
topic is compacted, so the latest message per partition is the state.

- key: ``<topic>/<partition>`` in UTF-8 (e.g. ``cdc.public.orders/2``).
- value: a JSON object (small, rare, and read by humans during incidents, so JSON wins
  over Avro here):

  ``next_offset``   every record of that partition below this offset is applied to
                    its lake table or parked in the dead-letter table (docs/apply.md)
  ``commit_lsn``    position of the newest applied record: its commit LSN ...
  ``ordinal``       ... and ordinal (``null`` when nothing was applied yet)
  ``table``         the source table, ``schema.table``
  ``table_lsn``     commit LSN of the newest transaction applied to that table
  ``commit_ts``     its commit time, microseconds since 1970-01-01 UTC

  LSNs are in PostgreSQL's ``X/X`` text form.

A second kind of message shares the topic: capture's own checkpoint of the LSN it is
about to confirm to PostgreSQL, written (and delivered) before the status update that
confirms it.

- key: ``slot:<slot name>`` (``:`` never occurs in a Kafka topic name, so the two kinds
  of key cannot collide).
- value: ``{"confirmed_lsn": "X/X", "system_identifier": "<decimal>", "timeline": n}``.
  ``system_identifier`` and ``timeline`` name the server the LSN belongs to (its
  ``IDENTIFY_SYSTEM``; :class:`ServerIdentity`); the identifier is a decimal string,
  since it is an unsigned 64-bit integer that JSON readers of other languages would
  round as a number. Checkpoints written before capture recorded them have neither;
  they are read with ``server`` None. The two come together or not at all.

At start, capture compares the slot with its checkpoint: a slot *ahead* of the
checkpoint was advanced by someone else, and WAL in between may never have reached
Kafka; a slot that was just created while the control topic already holds applied
progress was dropped and recreated; a server of another database cluster, or on a
timeline that forked before the checkpoint, is not where the checkpoint's LSN means
anything (capture/source/server_identity.py). All refuse to start instead of silently
skipping data.

A third kind holds the state of each captured table, written by capture on every
transition and by ``python -m capture resync`` (which sets ``pending``):

- key: ``table:<slot name>:<schema>.<table>`` (slot names never contain ``:``).
- value: ``{"state": ..., "snapshot_lsn": "X/X" or null, "message": str or null,
  "updated_at": micros}``. ``state`` is one of :class:`TableState`; ``snapshot_lsn`` is
  the position of the table's snapshot rows (streamed changes at or below it are in the
  snapshot and never published); ``message`` says why a table is errored. A table in
  ``snapshot`` whose chunks are partly published also has ``"resume": {"chunk": k,
  "block": b}``: every chunk before chunk ``k``, i.e. every heap block before ``b``, is
  in Kafka, so a capture that restarts reads from block ``b`` on instead of from scratch
  (docs/capture.md, "Resuming a snapshot"). Absent, or null, otherwise. A table whose
  rows were taken under a known publication entry also has ``"publication":
  {"row_filter": str or null, "columns": [str, ...] or null}``: the row filter (as
  ``pg_get_expr`` prints it) and column list the publication had for the table when its
  snapshot was taken (both null: every row and column). Absent when not known yet
  (docs/capture.md, "Row filters and column lists").

A fourth kind holds apply's view of each table: whether it is errored and how many of
its records wait in the dead-letter table (docs/apply.md, errored tables). apply writes
it after the Delta commit that parks records of the table, after ``python -m apply
reapply``/``discard`` released some, and for every table with parked records when the
job starts; ``python -m apply errored`` and ``python -m pipeline status`` read it, so
neither needs Spark.

- key: ``apply:<schema>.<table>``.
- value: ``{"table": "schema.table", "errored": bool, "parked": int, "error": str or
  null, "updated_at": micros}``. ``parked`` counts the records parked and neither
  re-applied nor discarded; ``errored`` is ``parked > 0``; ``error`` is the error that
  parked the oldest of them (null when none waits). Absolute values, so publishing one
  twice is harmless and the newest message of a key is the state.

A key with a ``<kind>:`` prefix this module does not know is refused
(:class:`ControlMessageError`), never read as applied progress. Within a known kind a
consumer must ignore unknown fields, so fields can be added without a version bump.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from schemas.errors import ContractError
from schemas.lsn import Lsn, format_lsn, parse_lsn


class ControlMessageError(ContractError):
    """A control-topic message that does not follow this format."""


@dataclass(frozen=True, slots=True)
class AppliedProgress:
    topic: str
    partition: int
    next_offset: int
    commit_lsn: Lsn | None
    ordinal: int | None
    table: str
    table_lsn: Lsn | None
    commit_ts: int | None

    def key(self) -> bytes:
        return f"{self.topic}/{self.partition}".encode()

    def value(self) -> bytes:
        return json.dumps(
            {
                "next_offset": self.next_offset,
                "commit_lsn": None if self.commit_lsn is None else format_lsn(self.commit_lsn),
                "ordinal": self.ordinal,
                "table": self.table,
                "table_lsn": None if self.table_lsn is None else format_lsn(self.table_lsn),
                "commit_ts": self.commit_ts,
            },
            separators=(",", ":"),
        ).encode()


SLOT_KEY_PREFIX = "slot:"


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """Which server an LSN belongs to, as ``IDENTIFY_SYSTEM`` names it
    (https://www.postgresql.org/docs/current/protocol-replication.html)."""

    system_identifier: int
    """The database cluster's identifier, chosen by ``initdb``; its physical standbys and
    base backups share it, a new cluster (a dump restored, ``pg_upgrade``) does not."""
    timeline: int
    """The cluster's history branch; a promotion or a point-in-time recovery starts a new
    one."""

    def __post_init__(self) -> None:
        if not 0 <= self.system_identifier < 2**64 or self.timeline < 1:
            raise ValueError(f"not a server identity: {self}")


@dataclass(frozen=True, slots=True)
class SlotCheckpoint:
    slot: str
    confirmed_lsn: Lsn
    server: ServerIdentity | None = None
    """The server ``confirmed_lsn`` is a position of; None in checkpoints written before
    capture recorded it."""

    def key(self) -> bytes:
        return f"{SLOT_KEY_PREFIX}{self.slot}".encode()

    def value(self) -> bytes:
        fields: dict[str, object] = {"confirmed_lsn": format_lsn(self.confirmed_lsn)}
        if self.server is not None:
            fields["system_identifier"] = str(self.server.system_identifier)
            fields["timeline"] = self.server.timeline
        return json.dumps(fields).encode()


TABLE_KEY_PREFIX = "table:"


class TableState(enum.Enum):
    """Where a captured table is in its life; docs/capture.md has the transitions."""

    PENDING = "pending"
    """Known, not snapshotted yet (new, or a resync was requested)."""
    SNAPSHOT = "snapshot"
    """Its rows are being copied; streamed changes are held back meanwhile."""
    CATCH_UP = "catch_up"
    """The snapshot is in Kafka; held-back changes are being published."""
    STREAMING = "streaming"
    """Every change is published as it is decoded."""
    ERRORED = "errored"
    """Not published any more until a resync; ``message`` says why."""


@dataclass(frozen=True, slots=True)
class SnapshotResume:
    """Where a snapshot cut short goes on: chunk ``chunk`` (which may be published in
    part) and every later one are read again, starting at heap block ``block``; every
    earlier chunk is in Kafka."""

    chunk: int
    block: int

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.block < 1:
            raise ValueError(f"a snapshot resumes after its first chunk, not at {self}")


@dataclass(frozen=True, slots=True)
class PublicationFilter:
    """What a publication lets through of one table (PostgreSQL 15+): its row filter, the
    ``WHERE`` expression as the server prints it, and its column list, in column order.
    None for either means every row, or every column."""

    row_filter: str | None = None
    columns: tuple[str, ...] | None = None

    def describe(self) -> str:
        """For messages: ``WHERE (tenant = 7), columns (id, tenant)``."""
        parts = []
        if self.row_filter is not None:
            parts.append(f"WHERE {self.row_filter}")
        if self.columns is not None:
            parts.append(f"columns ({', '.join(self.columns)})")
        return ", ".join(parts) or "every row and column"

    def as_json(self) -> dict[str, object]:
        return {
            "row_filter": self.row_filter,
            "columns": None if self.columns is None else list(self.columns),
        }


@dataclass(frozen=True, slots=True)
class TableStatus:
    slot: str
    table: str
    state: TableState
    snapshot_lsn: Lsn | None
    message: str | None
    updated_at: int
    """Microseconds since 1970-01-01 UTC."""
    resume: SnapshotResume | None = None
    """Set only in ``snapshot``, once its first chunk is in Kafka."""
    publication: PublicationFilter | None = None
    """The publication's row filter and column list the table's rows were taken under;
    None when not known yet."""

    def key(self) -> bytes:
        return f"{TABLE_KEY_PREFIX}{self.slot}:{self.table}".encode()

    def value(self) -> bytes:
        return json.dumps(
            {
                "state": self.state.value,
                "snapshot_lsn": (
                    None if self.snapshot_lsn is None else format_lsn(self.snapshot_lsn)
                ),
                "message": self.message,
                "updated_at": self.updated_at,
                **(
                    {}
                    if self.resume is None
                    else {"resume": {"chunk": self.resume.chunk, "block": self.resume.block}}
                ),
                **({} if self.publication is None else {"publication": self.publication.as_json()}),
            },
            separators=(",", ":"),
        ).encode()


APPLY_KEY_PREFIX = "apply:"


@dataclass(frozen=True, slots=True)
class ApplyTableStatus:
    """apply's state of one table: errored or not, and its parked records waiting."""

    table: str
    """The source table, ``schema.table``."""
    errored: bool
    parked: int
    """Records parked in the dead-letter table, neither re-applied nor discarded."""
    error: str | None
    """The error that parked the oldest waiting record; None when none waits."""
    updated_at: int
    """Microseconds since 1970-01-01 UTC."""

    def __post_init__(self) -> None:
        if self.parked < 0 or self.errored != (self.parked > 0):
            raise ControlMessageError(
                f"apply status of {self.table}: errored={self.errored} with parked="
                f"{self.parked}; a table is errored exactly while records wait"
            )

    def key(self) -> bytes:
        return f"{APPLY_KEY_PREFIX}{self.table}".encode()

    def value(self) -> bytes:
        return json.dumps(
            {
                "table": self.table,
                "errored": self.errored,
                "parked": self.parked,
                "error": self.error,
                "updated_at": self.updated_at,
            },
            separators=(",", ":"),
        ).encode()


ControlMessage = AppliedProgress | SlotCheckpoint | TableStatus | ApplyTableStatus

_KIND_SEPARATOR = b":"
"""Every kind but applied progress has a ``<kind>:`` key prefix; a topic name never
holds ``:``, so a progress key never does."""


def decode_control(key: bytes, value: bytes) -> ControlMessage:
    """Any kind of control-topic message, told apart by its key."""
    if key.startswith(TABLE_KEY_PREFIX.encode()):
        return _decode_table_status(key, value)
    if key.startswith(APPLY_KEY_PREFIX.encode()):
        return _decode_apply_status(key, value)
    if key.startswith(SLOT_KEY_PREFIX.encode()):
        return _decode_slot_checkpoint(key, value)
    if _KIND_SEPARATOR in key:
        kind = key.partition(_KIND_SEPARATOR)[0].decode(errors="replace")
        raise ControlMessageError(
            f"control message {key!r} is of kind {kind!r}, which this version does not know "
            "(schemas/control.py lists the kinds): is a newer writer on this topic?"
        )
    return decode_progress(key, value)


def _decode_slot_checkpoint(key: bytes, value: bytes) -> SlotCheckpoint:
    try:
        fields = json.loads(value)
        return SlotCheckpoint(
            key[len(SLOT_KEY_PREFIX) :].decode(),
            parse_lsn(fields["confirmed_lsn"]),
            _server(fields.get("system_identifier"), fields.get("timeline")),
        )
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ControlMessageError(
            f"slot checkpoint {key!r} is not in the documented format (schemas/control.py): {exc}"
        ) from exc


def _server(system_identifier: object, timeline: object) -> ServerIdentity | None:
    """The identity a checkpoint records; None when it records none (an older writer)."""
    if system_identifier is None and timeline is None:
        return None
    # A decimal string, never a JSON number (rounded by some readers); the timeline an
    # integer, never a boolean (bool is an int in Python).
    if not isinstance(system_identifier, str) or not (
        system_identifier.isascii() and system_identifier.isdigit()
    ):
        raise TypeError(f"system_identifier {system_identifier!r} is not a decimal string")
    if isinstance(timeline, bool) or not isinstance(timeline, int):
        raise TypeError(f"timeline {timeline!r} is not an integer")
    return ServerIdentity(int(system_identifier), timeline)


def decode_progress(key: bytes, value: bytes) -> AppliedProgress:
    try:
        topic, _, partition = key.decode().rpartition("/")
        fields = json.loads(value)
        commit_lsn, table_lsn = fields["commit_lsn"], fields["table_lsn"]
        return AppliedProgress(
            topic=topic,
            partition=int(partition),
            next_offset=int(fields["next_offset"]),
            commit_lsn=None if commit_lsn is None else parse_lsn(commit_lsn),
            ordinal=fields["ordinal"],
            table=str(fields["table"]),
            table_lsn=None if table_lsn is None else parse_lsn(table_lsn),
            commit_ts=fields["commit_ts"],
        )
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ControlMessageError(
            f"control message {key!r} is not in the documented format (schemas/control.py): {exc}"
        ) from exc


def _decode_table_status(key: bytes, value: bytes) -> TableStatus:
    slot, separator, table = key[len(TABLE_KEY_PREFIX) :].decode(errors="replace").partition(":")
    if not separator or not slot or not table:
        raise ControlMessageError(f"table status key {key!r} is not table:<slot>:<schema>.<table>")
    try:
        fields = json.loads(value)
        snapshot_lsn, message = fields["snapshot_lsn"], fields["message"]
        return TableStatus(
            slot=slot,
            table=table,
            state=TableState(fields["state"]),
            snapshot_lsn=None if snapshot_lsn is None else parse_lsn(snapshot_lsn),
            message=None if message is None else str(message),
            updated_at=int(fields["updated_at"]),
            resume=_resume(fields.get("resume")),
            publication=_publication(fields.get("publication")),
        )
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ControlMessageError(
            f"table status {key!r} is not in the documented format (schemas/control.py): {exc}"
        ) from exc


def _resume(field: object) -> SnapshotResume | None:
    if field is None:
        return None
    if not isinstance(field, dict):
        raise TypeError(f"resume is {type(field).__name__}, not an object")
    chunk, block = field["chunk"], field["block"]
    # bool is an int subclass: JSON's true must not read as chunk 1.
    if type(chunk) is not int or type(block) is not int:
        raise TypeError(f"resume's chunk and block are not integers: {field}")
    return SnapshotResume(chunk, block)


def _publication(field: object) -> PublicationFilter | None:
    if field is None:
        return None
    if not isinstance(field, dict):
        raise TypeError(f"publication is {type(field).__name__}, not an object")
    row_filter, columns = field["row_filter"], field["columns"]
    if row_filter is not None and not isinstance(row_filter, str):
        raise TypeError("publication's row_filter must be a string or null")
    if columns is not None and (
        not isinstance(columns, list) or not all(isinstance(c, str) for c in columns)
    ):
        raise TypeError("publication's columns must be a list of strings or null")
    return PublicationFilter(row_filter, None if columns is None else tuple(columns))


def _decode_apply_status(key: bytes, value: bytes) -> ApplyTableStatus:
    try:
        return _apply_status(key[len(APPLY_KEY_PREFIX) :].decode(), json.loads(value))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ControlMessageError(
            f"apply status {key!r} is not in the documented format (schemas/control.py): {exc}"
        ) from exc


def _apply_status(table: str, fields: dict[str, object]) -> ApplyTableStatus:
    errored, parked, error = fields["errored"], fields["parked"], fields["error"]
    updated_at = fields["updated_at"]
    if not table:
        raise ValueError("the key names no table")
    if fields["table"] != table:
        raise ValueError(f"its table {fields['table']!r} is not the one its key names")
    # bool is an int in Python: the types are checked exactly, so a JSON boolean is
    # never taken for a count, nor a count for a boolean.
    if type(errored) is not bool or type(parked) is not int or type(updated_at) is not int:
        raise TypeError("errored must be a boolean, parked and updated_at integers")
    if error is not None and not isinstance(error, str):
        raise TypeError("error must be a string or null")
    return ApplyTableStatus(table, errored, parked, error, updated_at)
