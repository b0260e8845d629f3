"""Control-topic messages round-trip and reject what is not the documented format."""

from __future__ import annotations

import pytest

from schemas.control import (
    AppliedProgress,
    ControlMessageError,
    SlotCheckpoint,
    TableState,
    TableStatus,
    decode_control,
    decode_progress,
)
from schemas.lsn import Lsn


def test_round_trip() -> None:
    progress = AppliedProgress(
        topic="cdc.public.orders",
        partition=2,
        next_offset=1042,
        commit_lsn=Lsn(0x16B3748),
        ordinal=3,
        table="public.orders",
        table_lsn=Lsn(0x16B3748),
        commit_ts=1_700_000_000_000_000,
    )
    assert progress.key() == b"cdc.public.orders/2"
    assert b'"commit_lsn":"0/16B3748"' in progress.value()
    assert decode_progress(progress.key(), progress.value()) == progress


def test_nothing_applied_yet_round_trips() -> None:
    progress = AppliedProgress("t.a.b", 0, 0, None, None, "a.b", None, None)
    assert decode_progress(progress.key(), progress.value()) == progress


def test_topic_names_with_slashes_keep_the_last_segment_as_partition() -> None:
    progress = AppliedProgress("odd/topic", 1, 5, None, None, "a.b", None, None)
    assert decode_progress(progress.key(), progress.value()).topic == "odd/topic"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (b"cdc.public.orders/x", b'{"next_offset":1}'),
        (b"cdc.public.orders/1", b"not json"),
        (b"cdc.public.orders/1", b'{"next_offset":1}'),
        (
            b"cdc.public.orders/1",
            b'{"next_offset":1,"commit_lsn":"zz","ordinal":null,'
            b'"table":"a.b","table_lsn":null,"commit_ts":null}',
        ),
        (b"\xff/1", b"{}"),
    ],
)
def test_malformed_messages_raise(key: bytes, value: bytes) -> None:
    with pytest.raises(ControlMessageError, match="documented format"):
        decode_progress(key, value)


def test_slot_checkpoint_round_trips_and_is_told_apart() -> None:
    checkpoint = SlotCheckpoint("cdc_slot", Lsn(0x1_0000_0010))
    assert checkpoint.key() == b"slot:cdc_slot"
    assert decode_control(checkpoint.key(), checkpoint.value()) == checkpoint
    progress = AppliedProgress("cdc.public.orders", 0, 5, None, None, "public.orders", None, None)
    assert decode_control(progress.key(), progress.value()) == progress


def test_malformed_slot_checkpoint_raises() -> None:
    with pytest.raises(ControlMessageError, match="slot checkpoint"):
        decode_control(b"slot:x", b'{"confirmed_lsn": "nope"}')


def test_table_status_round_trip() -> None:
    status = TableStatus(
        slot="cdc_slot",
        table="public.orders",
        state=TableState.SNAPSHOT,
        snapshot_lsn=Lsn(0x16B3747),
        message=None,
        updated_at=1_700_000_000_000_000,
    )
    assert status.key() == b"table:cdc_slot:public.orders"
    assert b'"state":"snapshot"' in status.value()
    assert b'"snapshot_lsn":"0/16B3747"' in status.value()
    assert decode_control(status.key(), status.value()) == status


def test_table_status_that_is_not_the_format_is_rejected() -> None:
    with pytest.raises(ControlMessageError, match="table:<slot>"):
        decode_control(b"table:no-table-part", b"{}")
    with pytest.raises(ControlMessageError, match="documented format"):
        decode_control(b"table:s:public.t", b'{"state": "sleeping"}')
