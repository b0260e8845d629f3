"""How far apply is behind, per table: pure functions over offsets, LSNs and times.

Definitions (docs/operations.md, status):

- **waiting**: per partition of the table's change topic, its end offset (high
  watermark) minus apply's ``next_offset`` from the control topic (0 when apply has
  published nothing for it), summed. Offsets, not records: after retention or
  compaction some of them may be gone.
- **lag in bytes**: the server's current WAL LSN minus the table's applied LSN (the
  ``table_lsn`` apply publishes). Before anything of the table was applied, it is
  measured from the commit LSN of the oldest waiting change instead.
- **lag in seconds**: now minus the commit time of the oldest change not applied yet,
  i.e. of the record at apply's ``next_offset`` in each lagging partition (the oldest
  of those).
- A table with **nothing waiting** has lag 0 bytes and 0 s, however long ago its last
  change was: a quiet table is not behind.
- A table **errored in apply** has its oldest unapplied changes parked in the
  dead-letter table, whose commit times are not on Kafka: its lag in seconds is unknown
  (None) and its lag in bytes counts from its applied LSN, which stands still.

The commit time of a waiting record is read from its value without its writer schema:
every change value is a header (single-object ``C3 01`` + 8-byte fingerprint, or the
Schema Registry's ``00`` + 4-byte id) + an Avro ``Change`` whose first fields are the
closed envelope ``op`` (enum), ``commit_lsn``, ``change_lsn``, ``xid``, ``commit_ts``
(docs/wire-contract.md, value; a new envelope field is a new contract version). So five
zig-zag varints after the header give it, exactly, without reading the schema topic or
asking the registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schemas import registry_framing, single_object
from schemas.errors import DecodeError
from schemas.lsn import Lsn
from schemas.registry_framing import Framing, framing_of

_HEADER_SIZES = {
    Framing.SINGLE_OBJECT: single_object.HEADER_SIZE,
    Framing.REGISTRY: registry_framing.HEADER_SIZE,
}

_MAX_VARINT_BYTES = 10  # a 64-bit zig-zag long
_ENVELOPE_LONGS = 4  # commit_lsn, change_lsn, xid, commit_ts after op


class EnvelopeError(ValueError):
    """A change value whose envelope cannot be read: not a record of the contract."""


@dataclass(frozen=True, slots=True)
class WaitingChange:
    """The oldest change of a partition that apply has not applied yet."""

    commit_lsn: Lsn
    commit_ts: int
    """Microseconds since 1970-01-01 UTC."""


def envelope_head(value: bytes) -> WaitingChange:
    """``commit_lsn`` and ``commit_ts`` of a change value (module docstring)."""
    try:
        framing = framing_of(value)
    except DecodeError as exc:
        raise EnvelopeError(str(exc)) from exc
    header_size = _HEADER_SIZES[framing]
    if len(value) < header_size:
        raise EnvelopeError(
            f"the value ends inside its {framing.value} header ({len(value)} bytes)"
        )
    position = header_size
    fields = []
    for _ in range(1 + _ENVELOPE_LONGS):
        number, position = _zigzag(value, position)
        fields.append(number)
    _op, commit_lsn, _change_lsn, _xid, commit_ts = fields
    if commit_lsn < 0:
        raise EnvelopeError(f"commit_lsn {commit_lsn} is negative")
    return WaitingChange(Lsn(commit_lsn), commit_ts)


def _zigzag(data: bytes, position: int) -> tuple[int, int]:
    """One Avro zig-zag varint at ``position``; the number and the position after it."""
    raw = 0
    for index in range(_MAX_VARINT_BYTES):
        if position + index >= len(data):
            raise EnvelopeError(f"the value ends inside its envelope at byte {len(data)}")
        byte = data[position + index]
        raw |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position + index + 1
    raise EnvelopeError(f"a varint at byte {position} is longer than {_MAX_VARINT_BYTES} bytes")


def waiting_offsets(partitions: Iterable[tuple[int, int]]) -> int:
    """Offsets waiting over ``(next_offset, end_offset)`` pairs, one per partition."""
    return sum(max(0, end - next_offset) for next_offset, end in partitions)


def table_lag(
    *,
    waiting: int,
    apply_errored: bool,
    current_wal_lsn: Lsn,
    applied_lsn: Lsn | None,
    oldest_waiting: WaitingChange | None,
    now_micros: int,
) -> tuple[int | None, float | None]:
    """Lag in bytes and in seconds (module docstring); None where it cannot be told."""
    if waiting == 0 and not apply_errored:
        return 0, 0.0
    since = applied_lsn
    if since is None and oldest_waiting is not None and not apply_errored:
        since = oldest_waiting.commit_lsn
    lag_bytes = None if since is None else max(0, current_wal_lsn - since)
    if apply_errored or oldest_waiting is None:
        return lag_bytes, None
    return lag_bytes, max(0.0, (now_micros - oldest_waiting.commit_ts) / 1_000_000)


def oldest(changes: Iterable[WaitingChange]) -> WaitingChange | None:
    """The earliest by commit LSN (commit order) of the partitions' oldest changes."""
    return min(changes, key=lambda c: (c.commit_lsn, c.commit_ts), default=None)
