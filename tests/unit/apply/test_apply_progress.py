"""Control-topic messages from apply results and from recovered states."""

from __future__ import annotations

import json

from apply.control.progress import (
    BatchResult,
    ParkedTable,
    applied_progress,
    batch_progress,
    parked_progress,
    recovered_progress,
)
from apply.lake.positions import AppliedState, PartitionProgress
from schemas.control import decode_progress
from schemas.lsn import Lsn
from tests.plugins.table_states import PROGRESS_STATE as STATE
from tests.plugins.table_states import TOPIC
from tests.plugins.table_states import table_result as result


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
    other = AppliedState(
        "public.items", {("cdc.public.items", 0): PartitionProgress(1, None)}, None, None, None, 0
    )
    messages = recovered_progress([STATE, other])
    assert [(m.table, m.topic, m.partition, m.next_offset) for m in messages] == [
        ("public.orders", TOPIC, 0, 12),
        ("public.orders", TOPIC, 1, 9),
        ("public.orders", TOPIC, 2, 40),
        ("public.items", "cdc.public.items", 0, 1),
    ]


def parked(next_offsets: dict[tuple[str, int], int], state: AppliedState | None) -> ParkedTable:
    return ParkedTable(
        table="public.orders",
        topic=TOPIC,
        batch_id=8,
        error="table public.orders: column amount changed type",
        error_kind="SchemaChangeError",
        newly_errored=True,
        records=5,
        parked=5,
        next_offsets=next_offsets,
        state=state,
    )


def test_parked_partitions_move_offsets_but_keep_the_lake_position() -> None:
    messages = parked_progress(parked({(TOPIC, 2): 55, (TOPIC, 3): 4}, STATE))
    assert [
        (m.partition, m.next_offset, m.commit_lsn, m.ordinal, m.table_lsn) for m in messages
    ] == [
        (2, 55, Lsn(0x16_B374_D848), 3, Lsn(0x16_B374_D848)),
        (3, 4, None, None, Lsn(0x16_B374_D848)),
    ]


def test_parked_offsets_never_go_below_what_the_lake_holds() -> None:
    (message,) = parked_progress(parked({(TOPIC, 2): 30}, STATE))
    assert message.next_offset == 40


def test_a_table_without_lake_state_publishes_offsets_only() -> None:
    (message,) = parked_progress(parked({(TOPIC, 0): 3}, None))
    assert (message.next_offset, message.commit_lsn, message.table_lsn, message.commit_ts) == (
        3,
        None,
        None,
        None,
    )


def test_batch_progress_lists_applied_then_parked_tables() -> None:
    batch = BatchResult(applied=(result(((TOPIC, 0),)),), parked=(parked({(TOPIC, 1): 20}, STATE),))
    assert [(m.partition, m.next_offset) for m in batch_progress(batch)] == [(0, 12), (1, 20)]


def test_recovered_progress_takes_parked_offsets_where_they_are_ahead() -> None:
    messages = recovered_progress(
        [STATE],
        {
            "public.orders": {(TOPIC, 0): 30, (TOPIC, 2): 1},
            "public.lost": {("cdc.public.lost", 0): 7},
        },
    )
    assert [(m.table, m.partition, m.next_offset, m.commit_lsn) for m in messages] == [
        ("public.orders", 0, 30, Lsn(0x16_B374_0000)),
        ("public.orders", 1, 9, None),
        ("public.orders", 2, 40, Lsn(0x16_B374_D848)),
        ("public.lost", 0, 7, None),
    ]
