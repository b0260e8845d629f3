"""How far a Delta table is applied: the state each apply commit carries in its metadata.

Terms (docs/architecture.md): the **position** of a change record is ``(commit_lsn,
ordinal)``. Positions increase strictly along a table's stream and are identical when
the capture publishes a record again. Within one Kafka partition they increase with the
offset, except that a capture restart publishes again, at new offsets, records it had
already published (same positions).

For every Delta table, apply keeps an :class:`AppliedState` (named apart from the control
topic's ``schemas.control.TableState``, which is a table's lifecycle in capture):

- per topic-partition, the **next offset** (every record below it is applied: merged,
  superseded within its batch, or dropped as a replay or tombstone) and the **applied
  position** (the highest position of the partition's records applied so far);
- the table's newest applied transaction: its commit LSN and commit time;
- the position of the newest TRUNCATE applied, if any;
- the micro-batch that wrote it, and the ``txnAppId`` of its query (:mod:`apply.lanes`).

Invariants that make a replay safe:

- The state is written by the same Delta commit as the rows it describes (commit
  ``userMetadata``; :func:`encode_state`), so the lake and the state can never disagree:
  either both are there or neither is. On restart the state is read back from the
  table's history (:mod:`apply.lake.history`), never from anywhere else.
- A record whose position is at or below its partition's applied position was applied
  (or superseded) before; dropping it is what docs/wire-contract.md asks of consumers.
  Every record of one key lives in one partition, in position order, so this drop never
  loses the newest change of a key.
- A row change positioned before the newest applied TRUNCATE happened before that
  TRUNCATE, which already removed its row: it is dropped too, even when it arrives late
  from another partition.
- :func:`advance` only moves things forward (offsets and positions are maxima), so
  applying the same batch twice yields the same state.

The JSON is compact, with LSNs in PostgreSQL's text form, because people read it during
incidents (``DESCRIBE HISTORY``); docs/apply.md shows it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.lsn import Lsn, format_lsn, parse_lsn

FORMAT_KEY = "pgdelta.apply"
"""Marks commit metadata written by apply; its value is the format version."""
FORMAT_VERSION = 1

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """Where a change record sits in the source's stream; ordered like the stream."""

    commit_lsn: Lsn
    ordinal: int


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    next_offset: int
    """Every record of the partition below this offset is applied."""
    position: Position | None
    """Highest position applied from this partition (None: only tombstones so far)."""


@dataclass(frozen=True, slots=True)
class AppliedState:
    """What one apply commit records about its table. Treat the mapping as read-only."""

    table: str
    """The source table, ``schema.table``."""
    partitions: Mapping[TopicPartition, PartitionProgress]
    table_lsn: Lsn | None
    """Commit LSN of the newest transaction applied to the table."""
    commit_ts: int | None
    """Its commit time, microseconds since 1970-01-01 UTC."""
    truncated_at: Position | None
    """Position of the newest TRUNCATE applied."""
    batch_id: int
    """The micro-batch whose commit carries this state."""
    txn_app_id: str | None = None
    """The ``txnAppId`` of the query (lane, :mod:`apply.lanes`) whose batch ``batch_id``
    is; None in commits written before lanes existed, all by the default lane."""
    log_seq: int | None = None
    """Written by the retired change log (:mod:`apply.lake.retired_log`): in a log commit, the
    sequence number of the rows it appended; in a table commit, the sequence the table
    holds every logged change up to (the fold's watermark). Read at start to fold what a
    log holds; :func:`advance` drops it, since no batch writes a log any more."""

    def applied_position(self, topic: str, partition: int) -> Position | None:
        progress = self.partitions.get((topic, partition))
        return None if progress is None else progress.position


@dataclass(frozen=True, slots=True)
class PartitionBatch:
    """What one micro-batch held in one partition of the table's topic."""

    next_offset: int
    """Highest offset in the batch, plus one."""
    position: Position | None
    """Highest position among the partition's decodable records in the batch."""
    commit_ts: int | None
    """Commit time of the record at ``position``."""


def _later(a: Position | None, b: Position | None) -> Position | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def advance(
    previous: AppliedState | None,
    table: str,
    batch_id: int,
    partitions: Mapping[TopicPartition, PartitionBatch],
    truncate: Position | None,
    *,
    txn_app_id: str | None = None,
) -> AppliedState:
    """The state after a batch of the query ``txn_app_id``: ``previous`` moved forward by
    what the batch held."""
    merged: dict[TopicPartition, PartitionProgress] = (
        dict(previous.partitions) if previous is not None else {}
    )
    table_lsn = None if previous is None else previous.table_lsn
    commit_ts = None if previous is None else previous.commit_ts
    for key, seen in partitions.items():
        before = merged.get(key)
        merged[key] = PartitionProgress(
            next_offset=max(seen.next_offset, before.next_offset if before else 0),
            position=_later(before.position if before else None, seen.position),
        )
        # One transaction has one commit time, so comparing commit LSNs is enough.
        if seen.position is not None and (
            table_lsn is None or seen.position.commit_lsn > table_lsn
        ):
            table_lsn = seen.position.commit_lsn
            commit_ts = seen.commit_ts
    return AppliedState(
        table=table,
        partitions=merged,
        table_lsn=table_lsn,
        commit_ts=commit_ts,
        truncated_at=_later(None if previous is None else previous.truncated_at, truncate),
        batch_id=batch_id,
        txn_app_id=txn_app_id,
    )


def _position_json(position: Position | None) -> dict[str, Any] | None:
    if position is None:
        return None
    return {"commit_lsn": format_lsn(position.commit_lsn), "ordinal": position.ordinal}


def encode_state(state: AppliedState) -> str:
    """The commit ``userMetadata`` for ``state``: compact JSON, keys in a fixed order."""
    partitions: dict[str, Any] = {}
    for (topic, partition), progress in sorted(state.partitions.items()):
        entry: dict[str, Any] = {"next_offset": progress.next_offset}
        position = _position_json(progress.position)
        entry.update(position or {"commit_lsn": None, "ordinal": None})
        partitions[f"{topic}/{partition}"] = entry
    return json.dumps(
        {
            FORMAT_KEY: FORMAT_VERSION,
            "table": state.table,
            "batch_id": state.batch_id,
            "table_lsn": None if state.table_lsn is None else format_lsn(state.table_lsn),
            "commit_ts": state.commit_ts,
            "truncated_at": _position_json(state.truncated_at),
            "partitions": partitions,
            **({} if state.txn_app_id is None else {"txn_app_id": state.txn_app_id}),
            **({} if state.log_seq is None else {"log_seq": state.log_seq}),
        },
        separators=(",", ":"),
    )


class StateFormatError(ValueError):
    """Commit metadata marked as apply's that does not follow the format."""


def _integer(name: str, value: Any, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"{name} {value!r} is not a non-negative integer")
    return value


def _position(value: Any) -> Position | None:
    if value is None:
        return None
    return Position(parse_lsn(value["commit_lsn"]), _integer("ordinal", value["ordinal"]))


def _partition_key(key: str) -> TopicPartition:
    topic, _, partition = key.rpartition("/")
    if not topic:
        raise ValueError(f"partition key {key!r} is not <topic>/<partition>")
    return topic, int(partition)


def _string(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} {value!r} is not a string")
    return value


def _optional_string(name: str, value: Any) -> str | None:
    return None if value is None else _string(name, value)


def decode_state(text: str | None) -> AppliedState | None:
    """The state in a commit's ``userMetadata``; None when the commit is not apply's.

    Raises :class:`StateFormatError` for metadata that carries apply's marker but does
    not follow the format, or follows a version this code does not know.
    """
    if not text:
        return None
    try:
        fields = json.loads(text)
    except ValueError:
        return None  # someone else's free-text metadata
    if not isinstance(fields, dict) or FORMAT_KEY not in fields:
        return None
    if fields[FORMAT_KEY] != FORMAT_VERSION:
        raise StateFormatError(
            f"apply commit metadata has format version {fields[FORMAT_KEY]!r}, this job "
            f"reads version {FORMAT_VERSION}: run the apply release that wrote it, or newer"
        )
    try:
        table_lsn = fields["table_lsn"]
        return AppliedState(
            table=_string("table", fields["table"]),
            partitions={
                _partition_key(key): PartitionProgress(
                    _integer("next_offset", entry["next_offset"]),
                    None if entry["commit_lsn"] is None else _position(entry),
                )
                for key, entry in fields["partitions"].items()
            },
            table_lsn=None if table_lsn is None else parse_lsn(table_lsn),
            commit_ts=_integer("commit_ts", fields["commit_ts"], optional=True),
            truncated_at=_position(fields["truncated_at"]),
            batch_id=_integer("batch_id", fields["batch_id"]),
            txn_app_id=_optional_string("txn_app_id", fields.get("txn_app_id")),
            log_seq=_integer("log_seq", fields.get("log_seq"), optional=True),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateFormatError(
            f"apply commit metadata does not follow the documented format (docs/apply.md): "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def covers(state: AppliedState, next_offsets: Mapping[TopicPartition, int]) -> bool:
    """True when every record below ``next_offsets`` is already below the state's next
    offset of its partition: a batch of those records holds nothing new for the table
    (a replayed micro-batch, or the same records under a later batch id)."""
    for key, next_offset in next_offsets.items():
        progress = state.partitions.get(key)
        if progress is None or progress.next_offset < next_offset:
            return False
    return True
