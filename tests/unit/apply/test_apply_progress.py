"""Control-topic messages from apply results and from recovered states."""

from __future__ import annotations

import json

from apply.positions import PartitionProgress, Position, TableState
from apply.progress import TableResult, applied_progress, recovered_progress
from schemas.control import decode_progress
from schemas.lsn import Lsn

TOPIC = "cdc.public.orders"
STATE = TableState(
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


def result(partitions: tuple[tuple[str, int], ...]) -> TableResult:
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
        state=STATE,
    )


def test_messages_cover_the_partitions_of_the_batch_in_order() -> None:
    messages = applied_progress(result(((TOPIC, 2), (TOPIC, 0))))
    assert [(m.topic, m.partition) for m in messages] == [(TOPIC, 0), (TOPIC, 2)]
    newest = messages[1]
    assert newest.key() == b"cdc.public.orders/2"
    assert json.loads(newest.value()) == {
        "next_offset": 40,
        "commit_lsn": "16/B374D848",
        "ordinal": 3,
        "table": "public.orders",
        "table_lsn": "16/B374D848",
        "commit_ts": 1_715_941_815_200_000,
    }
    assert decode_progress(newest.key(), newest.value()) == newest


def test_partition_with_only_tombstones_has_no_position() -> None:
    (message,) = applied_progress(result(((TOPIC, 1),)))
    assert (message.next_offset, message.commit_lsn, message.ordinal) == (9, None, None)
    assert message.table_lsn == 0x16_B374_D848


def test_recovered_state_republishes_every_partition() -> None:
    other = TableState(
        "public.items", {("cdc.public.items", 0): PartitionProgress(1, None)}, None, None, None, 0
    )
    messages = recovered_progress([STATE, other])
    assert [(m.table, m.topic, m.partition, m.next_offset) for m in messages] == [
        ("public.orders", TOPIC, 0, 12),
        ("public.orders", TOPIC, 1, 9),
        ("public.orders", TOPIC, 2, 40),
        ("public.items", "cdc.public.items", 0, 1),
    ]
