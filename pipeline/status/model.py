"""What ``python -m pipeline status`` reports: immutable values, built by
:mod:`pipeline.status.reader`, rendered by :mod:`pipeline.status.render`."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.control import SnapshotResume, TableState
from schemas.lsn import Lsn

LOST = "lost"
"""``pg_replication_slots.wal_status`` of a slot whose WAL is gone: it can never stream again."""


@dataclass(frozen=True, slots=True)
class SlotView:
    """The replication slot capture streams from, as ``pg_replication_slots`` shows it."""

    name: str
    exists: bool
    active: bool
    """A walsender (capture) is streaming from it now."""
    confirmed_flush_lsn: Lsn | None
    """Capture confirmed everything before it: it is applied (or parked) in the lake."""
    restart_lsn: Lsn | None
    """The oldest WAL the slot keeps."""
    retained_bytes: int | None
    """``pg_current_wal_lsn() - restart_lsn``: WAL the server keeps for this slot."""
    wal_status: str | None
    """``reserved``, ``extended``, ``unreserved`` or ``lost``."""
    safe_wal_size: int | None
    """Bytes that can still be written before the slot is in danger of being lost; None
    when ``max_slot_wal_keep_size`` is unlimited."""

    @property
    def lost(self) -> bool:
        """Capture cannot stream from it: absent, or its WAL is gone."""
        return not self.exists or self.wal_status == LOST


@dataclass(frozen=True, slots=True)
class TableView:
    """One captured table, from the control topic and its change topic's offsets."""

    table: str
    """``schema.table``."""
    topic: str
    capture_state: TableState | None
    """None: capture recorded no state for it under this slot."""
    capture_message: str | None
    applied_lsn: Lsn | None
    """Commit LSN of the newest transaction applied to the lake table (``table_lsn``)."""
    lag_bytes: int | None
    """Server WAL position minus ``applied_lsn``; 0 when nothing waits. None when it
    cannot be told (module :mod:`pipeline.status.lag`)."""
    lag_s: float | None
    """Seconds since the commit of the oldest change not applied yet; 0 when nothing
    waits. None when it cannot be told."""
    waiting: int
    """Offsets in the change topic above apply's next offset, summed over partitions."""
    apply_errored: bool
    parked: int
    """Records in the dead-letter table, neither re-applied nor discarded."""
    apply_error: str | None
    snapshot_resume: SnapshotResume | None = None
    """In ``snapshot``: the chunk and heap block a restarted capture would go on from
    (every block before it is in Kafka)."""

    @property
    def errored(self) -> bool:
        return self.apply_errored or self.capture_state is TableState.ERRORED


@dataclass(frozen=True, slots=True)
class PipelineStatus:
    control_topic: str
    capture_started: bool
    """The control topic exists (capture creates it at its first start)."""
    read_at_micros: int
    """When it was read, microseconds since 1970-01-01 UTC."""
    current_wal_lsn: Lsn
    slot: SlotView
    tables: tuple[TableView, ...]
    """By table name."""

    @property
    def healthy(self) -> bool:
        """Exit status 0: capture started, the slot is there and no table is errored."""
        return (
            self.capture_started and not self.slot.lost and not any(t.errored for t in self.tables)
        )
