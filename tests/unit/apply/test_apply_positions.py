"""The applied state: how a batch moves it forward, and its commit-metadata JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from apply.lake.positions import (
    AppliedState,
    PartitionBatch,
    PartitionProgress,
    Position,
    StateFormatError,
    advance,
    covers,
    decode_state,
    encode_state,
)
from schemas.lsn import Lsn
from tests.plugins.table_states import STATE, TOPIC, pos


def test_positions_order_like_the_stream() -> None:
    assert pos(1, 9) < pos(2, 0) < pos(2, 1)
    assert max(pos(2, 1), pos(2, 0)) == pos(2, 1)


def test_state_json_is_compact_and_documented() -> None:
    text = encode_state(STATE)
    docs = Path(__file__).parents[3] / "docs" / "apply.md"
    assert f"\n{text}\n" in docs.read_text("utf-8"), "docs/apply.md must show this example"
    assert text == (
        '{"pgdelta.apply":1,"table":"public.orders","batch_id":42,'
        '"table_lsn":"16/B374D848","commit_ts":1715941815200000,'
        '"truncated_at":{"commit_lsn":"15/0","ordinal":0},'
        '"partitions":{"cdc.public.orders/0":{"next_offset":7,"commit_lsn":null,"ordinal":null},'
        '"cdc.public.orders/1":{"next_offset":12,"commit_lsn":"16/B374D848","ordinal":3}},'
        '"txn_app_id":"pgdelta-apply-bfbaa69b27b27c5c846a27f6"}'
    )


def test_states_from_before_lanes_name_no_query() -> None:
    fields = json.loads(encode_state(STATE))
    del fields["txn_app_id"]
    assert decode_state(json.dumps(fields)) == replace(STATE, txn_app_id=None)
    assert "txn_app_id" not in encode_state(replace(STATE, txn_app_id=None))


def test_state_json_round_trips() -> None:
    assert decode_state(encode_state(STATE)) == STATE
    empty = AppliedState("s.t", {}, None, None, None, 0)
    assert decode_state(encode_state(empty)) == empty


@pytest.mark.parametrize("foreign", [None, "", "nightly compaction", "[1, 2]", '{"owner": "etl"}'])
def test_metadata_of_other_writers_is_not_a_state(foreign: str | None) -> None:
    assert decode_state(foreign) is None


@pytest.mark.parametrize(
    "change",
    [
        {"pgdelta.apply": 2},
        {"partitions": {"no-partition": {"next_offset": 1, "commit_lsn": None, "ordinal": None}}},
        {"partitions": {"t/0": {"next_offset": -1, "commit_lsn": None, "ordinal": None}}},
        {"partitions": {"t/0": {"next_offset": 1, "commit_lsn": "nope", "ordinal": 1}}},
        {"truncated_at": {"commit_lsn": "0/1", "ordinal": "3"}},
        {"commit_ts": True},
        {"batch_id": None},
        {"table": 5},
        {"txn_app_id": 7},
    ],
)
def test_our_metadata_in_another_shape_is_an_error(change: dict[str, object]) -> None:
    fields = json.loads(encode_state(STATE))
    fields.update(change)
    with pytest.raises(StateFormatError):
        decode_state(json.dumps(fields))


def test_missing_field_is_an_error() -> None:
    fields = json.loads(encode_state(STATE))
    del fields["partitions"]
    with pytest.raises(StateFormatError, match=r"docs/apply\.md"):
        decode_state(json.dumps(fields))


def test_first_batch_starts_the_state() -> None:
    state = advance(
        None,
        "public.orders",
        0,
        {
            (TOPIC, 0): PartitionBatch(5, pos(0x200, 1), 2_000),
            (TOPIC, 1): PartitionBatch(3, pos(0x300, 0), 3_000),
            (TOPIC, 2): PartitionBatch(1, None, None),
        },
        None,
    )
    assert state.partitions == {
        (TOPIC, 0): PartitionProgress(5, pos(0x200, 1)),
        (TOPIC, 1): PartitionProgress(3, pos(0x300, 0)),
        (TOPIC, 2): PartitionProgress(1, None),
    }
    assert (state.table_lsn, state.commit_ts, state.truncated_at) == (0x300, 3_000, None)
    assert state.batch_id == 0
    assert state.applied_position(TOPIC, 1) == pos(0x300, 0)
    assert state.applied_position(TOPIC, 9) is None


def test_advance_keeps_untouched_partitions_and_never_moves_back() -> None:
    state = advance(
        STATE,
        "public.orders",
        43,
        {
            # Only replays of older positions: the position must not regress.
            (TOPIC, 1): PartitionBatch(15, pos(0x10, 0), 10),
            (TOPIC, 3): PartitionBatch(2, pos(0x17_0000_0000, 0), 99),
        },
        pos(0x17_0000_0000, 1),
    )
    assert state.partitions == {
        (TOPIC, 0): PartitionProgress(7, None),
        (TOPIC, 1): PartitionProgress(15, pos(0x16_B374_D848, 3)),
        (TOPIC, 3): PartitionProgress(2, pos(0x17_0000_0000, 0)),
    }
    assert (state.table_lsn, state.commit_ts) == (0x17_0000_0000, 99)
    assert state.truncated_at == pos(0x17_0000_0000, 1)
    assert state.batch_id == 43


def test_advancing_by_the_same_batch_twice_changes_nothing() -> None:
    seen = {(TOPIC, 1): PartitionBatch(20, pos(0x17_0000_0000, 2), 77)}
    once = advance(STATE, "public.orders", 43, seen, None)
    assert advance(once, "public.orders", 43, seen, None) == once


def test_a_batch_below_every_next_offset_is_covered() -> None:
    state = AppliedState(
        "public.orders",
        {
            ("t", 0): PartitionProgress(10, Position(Lsn(0x100), 0)),
            ("t", 1): PartitionProgress(4, None),
        },
        Lsn(0x100),
        None,
        None,
        3,
    )
    assert covers(state, {("t", 0): 10, ("t", 1): 2})
    assert not covers(state, {("t", 0): 11}), "offset 10 is not applied yet"
    assert not covers(state, {("t", 2): 1}), "a partition the table never saw"
    assert covers(state, {})


def test_the_retired_logs_sequence_round_trips_and_no_batch_carries_it_on() -> None:
    """A retired change log's states carry ``log_seq`` (apply.lake.retired_log reads them);
    a batch's new state does not."""
    logged = replace(STATE, log_seq=17)
    assert '"log_seq":17' in encode_state(logged)
    assert decode_state(encode_state(logged)) == logged
    assert "log_seq" not in encode_state(STATE)
    assert advance(logged, STATE.table, 8, {}, None).log_seq is None
