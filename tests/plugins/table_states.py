"""Applied states of ``public.orders`` for the apply unit tests: one as the commit metadata
records it (:data:`STATE`, with a truncation and a transaction id), one that a batch's
progress messages report (:data:`PROGRESS_STATE`), and the batch result ending at it."""

from __future__ import annotations

from apply.control.progress import TableResult
from apply.lake.positions import AppliedState, PartitionProgress, Position
from schemas.lsn import Lsn

TOPIC = "cdc.public.orders"


def pos(lsn: int, ordinal: int) -> Position:
    return Position(Lsn(lsn), ordinal)


STATE = AppliedState(
    table="public.orders",
    partitions={
        (TOPIC, 1): PartitionProgress(12, pos(0x16_B374_D848, 3)),
        (TOPIC, 0): PartitionProgress(7, None),
    },
    table_lsn=Lsn(0x16_B374_D848),
    commit_ts=1_715_941_815_200_000,
    truncated_at=pos(0x15_0000_0000, 0),
    batch_id=42,
    txn_app_id="pgdelta-apply-bfbaa69b27b27c5c846a27f6",
)
"""A recorded state: partition 0 has no position yet, the table was truncated."""

PROGRESS_STATE = AppliedState(
    table="public.orders",
    partitions={
        (TOPIC, 2): PartitionProgress(40, Position(Lsn(0x16_B374_D848), 3)),
        (TOPIC, 0): PartitionProgress(12, Position(Lsn(0x16_B374_0000), 0)),
        (TOPIC, 1): PartitionProgress(9, None),
    },
    table_lsn=Lsn(0x16_B374_D848),
    commit_ts=1_715_941_815_200_000,
    truncated_at=None,
    batch_id=7,
)


def table_result(partitions: tuple[tuple[str, int], ...]) -> TableResult:
    """A committed batch of ``public.orders`` that covered ``partitions``, ending at
    :data:`PROGRESS_STATE`."""
    return TableResult(
        table="public.orders",
        topic=TOPIC,
        path="/lake/public/orders",
        batch_id=7,
        committed=True,
        version=3,
        records=10,
        tombstones=0,
        replays=0,
        superseded=0,
        truncates=0,
        source_rows=10,
        rows_inserted=10,
        rows_updated=0,
        rows_deleted=0,
        rows_truncated=0,
        table_created=False,
        columns_added=(),
        partitions=partitions,
        state=PROGRESS_STATE,
    )
