"""What applying one micro-batch did to each table, and the control-topic messages for it.

The apply job logs a :class:`TableResult` per table it applied and a
:class:`ParkedTable` per errored table, and publishes :func:`batch_progress` on the
control topic (``schemas.control``); the capture confirms an LSN to PostgreSQL only once
every offset a transaction produced is below the ``next_offset`` published for its
partition.

The rule for a partition's message (docs/apply.md, errored tables):

- ``next_offset``: every record of the partition below it is **in the lake table or
  parked in the dead-letter table** (:mod:`apply.lake.dead_letter`). Parked records are
  durable and replayable from there, so the slot may move past them: one errored table
  must not pin the WAL of the whole database.
- ``commit_lsn``/``ordinal``, ``table_lsn``/``commit_ts``: only what the lake table
  holds, read from its own applied state. Parked records never move them, so an errored
  table's position stands still on the control topic while its offsets go on.

Publishing happens after the Delta commits (lake tables and dead-letter table), so a
message never claims more than they hold. A crash between commit and publish loses
nothing: on restart the job re-publishes :func:`recovered_progress` of the state read
back from each table's history and of the dead-letter table. Messages are compacted by
key and carry absolute values, so publishing one twice is harmless.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from apply.lake.positions import AppliedState, TopicPartition
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
    state: AppliedState


@dataclass(frozen=True, slots=True)
class ParkedTable:
    """An errored table's part of one micro-batch: parked, not applied."""

    table: str
    """The source table, ``schema.table``."""
    topic: str
    batch_id: int
    error: str
    """The error that parked the table: this batch's, or the first one still waiting."""
    error_kind: str
    """Class name of that error (``SchemaChangeError``, ``BadRecordError`` ...)."""
    newly_errored: bool
    """This batch's records failed; False when the table was errored before the batch."""
    records: int
    """Kafka records of the table's topic in the batch, tombstones included."""
    parked: int
    """Of ``records``, those written to the dead-letter table now; the others were
    parked by an earlier attempt of the same records (a replayed batch)."""
    next_offsets: Mapping[TopicPartition, int]
    """Per partition the batch held: its highest offset plus one."""
    state: AppliedState | None
    """The lake table's applied state, untouched by the batch; None when the table has
    none yet, or its history could not be read (the error may be about exactly that)."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What one micro-batch did, table by table, in topic order."""

    applied: tuple[TableResult, ...] = ()
    parked: tuple[ParkedTable, ...] = ()


def _message(
    table: str,
    state: AppliedState | None,
    key: TopicPartition,
    parked_next_offset: int = 0,
) -> AppliedProgress:
    progress = None if state is None else state.partitions.get(key)
    position = None if progress is None else progress.position
    topic, partition = key
    return AppliedProgress(
        topic=topic,
        partition=partition,
        next_offset=max(parked_next_offset, 0 if progress is None else progress.next_offset),
        commit_lsn=None if position is None else position.commit_lsn,
        ordinal=None if position is None else position.ordinal,
        table=table,
        table_lsn=None if state is None else state.table_lsn,
        commit_ts=None if state is None else state.commit_ts,
    )


def applied_progress(result: TableResult) -> list[AppliedProgress]:
    """Control messages for the partitions the batch touched, in partition order."""
    return [_message(result.table, result.state, key) for key in sorted(result.partitions)]


def parked_progress(parked: ParkedTable) -> list[AppliedProgress]:
    """Control messages for the partitions an errored table's batch touched, in
    partition order: offsets past the parked records, positions of the lake table."""
    return [
        _message(parked.table, parked.state, key, next_offset)
        for key, next_offset in sorted(parked.next_offsets.items())
    ]


def batch_progress(result: BatchResult) -> list[AppliedProgress]:
    """Every control message of a micro-batch: applied tables, then parked ones."""
    return [
        *(m for r in result.applied for m in applied_progress(r)),
        *(m for p in result.parked for m in parked_progress(p)),
    ]


def recovered_progress(
    states: Iterable[AppliedState],
    parked_offsets: Mapping[str, Mapping[TopicPartition, int]] | None = None,
) -> list[AppliedProgress]:
    """Control messages for every partition of every state, and of every table with
    parked records (``parked_offsets``: per table and partition, the highest parked
    offset plus one): what a restarted job publishes before its first batch."""
    parked = parked_offsets or {}
    messages = []
    seen = set()
    for state in states:
        seen.add(state.table)
        offsets = parked.get(state.table, {})
        for key in sorted({*state.partitions, *offsets}):
            messages.append(_message(state.table, state, key, offsets.get(key, 0)))
    for table in sorted(set(parked) - seen):
        for key, next_offset in sorted(parked[table].items()):
            messages.append(_message(table, None, key, next_offset))
    return messages
