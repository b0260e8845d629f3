"""What applying one micro-batch did to one table, and the control-topic messages for it.

The apply job logs a :class:`TableResult` per table and publishes
:func:`applied_progress` of it on the control topic (``schemas.control``); the capture
confirms an LSN to PostgreSQL only once every offset a transaction produced is at or
below the ``next_offset`` published for its partition.

Publishing happens after the Delta commit, so a message never claims more than the lake
holds. A crash between commit and publish loses nothing: on restart the job re-publishes
:func:`recovered_progress` of the state read back from each table's history. Messages
are compacted by key and carry absolute values, so publishing one twice is harmless.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from apply.positions import TableState, TopicPartition
from schemas.control import AppliedProgress


@dataclass(frozen=True, slots=True)
class TableResult:
    """The outcome of one micro-batch for one table. Counts are records of the batch."""

    table: str
    """The source table, ``schema.table``."""
    topic: str
    path: str
    """Location of the Delta table."""
    batch_id: int
    committed: bool
    """False when Delta skipped the MERGE because this batch was committed before (a
    replayed micro-batch); ``state`` is then the state that commit recorded."""
    version: int
    """The Delta table version holding the batch."""
    records: int
    """Kafka records of the table's topic in the batch, tombstones included."""
    tombstones: int
    replays: int
    """Records at or below their partition's applied position, dropped."""
    superseded: int
    """Changes overtaken within the batch: an earlier change of the same key, or a row
    change before a TRUNCATE."""
    truncates: int
    source_rows: int
    """Latest change per key, as handed to the MERGE."""
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    """Rows deleted by DELETE records and by TRUNCATEs."""
    rows_truncated: int
    """Of ``rows_deleted``, the rows a TRUNCATE removed."""
    table_created: bool
    columns_added: tuple[str, ...]
    """Columns added to an existing table for this batch's writer schemas."""
    partitions: tuple[TopicPartition, ...]
    """The topic-partitions the batch held records of."""
    state: TableState


def _message(state: TableState, key: TopicPartition) -> AppliedProgress:
    progress = state.partitions[key]
    topic, partition = key
    return AppliedProgress(
        topic=topic,
        partition=partition,
        next_offset=progress.next_offset,
        commit_lsn=None if progress.position is None else progress.position.commit_lsn,
        ordinal=None if progress.position is None else progress.position.ordinal,
        table=state.table,
        table_lsn=state.table_lsn,
        commit_ts=state.commit_ts,
    )


def applied_progress(result: TableResult) -> list[AppliedProgress]:
    """Control messages for the partitions the batch touched, in partition order."""
    return [_message(result.state, key) for key in sorted(result.partitions)]


def recovered_progress(states: Iterable[TableState]) -> list[AppliedProgress]:
    """Control messages for every partition of every state: what a restarted job
    publishes before its first batch."""
    return [_message(state, key) for state in states for key in sorted(state.partitions)]
