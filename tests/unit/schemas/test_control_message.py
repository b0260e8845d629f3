"""Control-topic messages round-trip and reject what is not the documented format."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schemas.control import (
    AppliedProgress,
    ApplyTableStatus,
    ControlMessageError,
    ServerIdentity,
    SlotCheckpoint,
    SnapshotResume,
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


def test_a_slot_checkpoint_records_its_server_with_the_identifier_as_a_string() -> None:
    # The largest system identifier: a JSON number this size is rounded by readers
    # whose numbers are doubles, so it travels as a decimal string.
    server = ServerIdentity(2**64 - 1, 3)
    checkpoint = SlotCheckpoint("cdc_slot", Lsn(0x1_0000_0010), server)
    assert b'"system_identifier": "18446744073709551615"' in checkpoint.value()
    assert b'"timeline": 3' in checkpoint.value()
    assert decode_control(checkpoint.key(), checkpoint.value()) == checkpoint


def test_a_slot_checkpoint_of_an_older_writer_has_no_server() -> None:
    older = SlotCheckpoint("cdc_slot", Lsn(16))
    assert older.value() == b'{"confirmed_lsn": "0/10"}', "the old form, unchanged"
    decoded = decode_control(b"slot:cdc_slot", b'{"confirmed_lsn": "0/10"}')
    assert decoded == SlotCheckpoint("cdc_slot", Lsn(16), None)
    newer = b'{"confirmed_lsn": "0/10", "system_identifier": "7", "timeline": 1, "x": 2}'
    assert decode_control(b"slot:s", newer) == SlotCheckpoint("s", Lsn(16), ServerIdentity(7, 1))


@pytest.mark.parametrize(
    "fields",
    [
        '"system_identifier": "7"',
        '"timeline": 1',
        '"system_identifier": 7, "timeline": 1',
        '"system_identifier": "-7", "timeline": 1',
        '"system_identifier": "7e3", "timeline": 1',
        '"system_identifier": "18446744073709551616", "timeline": 1',
        '"system_identifier": "7", "timeline": "1"',
        '"system_identifier": "7", "timeline": true',
        '"system_identifier": "7", "timeline": 0',
    ],
)
def test_a_slot_checkpoint_server_that_is_not_the_format_is_rejected(fields: str) -> None:
    value = ('{"confirmed_lsn": "0/10", ' + fields + "}").encode()
    with pytest.raises(ControlMessageError, match="slot checkpoint"):
        decode_control(b"slot:s", value)


SNAPSHOTTING = TableStatus(
    slot="cdc_slot",
    table="public.orders",
    state=TableState.SNAPSHOT,
    snapshot_lsn=Lsn(0x16B3747),
    message=None,
    updated_at=1_700_000_000_000_000,
)


def test_table_status_round_trip() -> None:
    status = SNAPSHOTTING
    assert status.key() == b"table:cdc_slot:public.orders"
    assert b'"state":"snapshot"' in status.value()
    assert b'"snapshot_lsn":"0/16B3747"' in status.value()
    assert decode_control(status.key(), status.value()) == status


def test_a_resumable_snapshot_status_round_trips_and_older_ones_have_no_resume() -> None:
    status = replace(SNAPSHOTTING, resume=SnapshotResume(chunk=3, block=1200))
    assert b'"resume":{"chunk":3,"block":1200}' in status.value()
    assert decode_control(status.key(), status.value()) == status
    older = b'{"state":"snapshot","snapshot_lsn":"0/10","message":null,"updated_at":1}'
    decoded = decode_control(b"table:cdc_slot:public.orders", older)
    assert isinstance(decoded, TableStatus)
    assert decoded.resume is None


@pytest.mark.parametrize(
    "resume",
    [
        '"3"',
        '{"chunk": 3}',
        '{"chunk": "3", "block": 1}',
        '{"chunk": true, "block": 1}',
        '{"chunk": 0, "block": 0}',
    ],
)
def test_a_resume_that_is_not_the_format_is_rejected(resume: str) -> None:
    value = (
        '{"state":"snapshot","snapshot_lsn":"0/10","message":null,"updated_at":1,'
        f'"resume":{resume}}}'
    ).encode()
    with pytest.raises(ControlMessageError, match="documented format"):
        decode_control(b"table:s:public.t", value)


def test_table_status_that_is_not_the_format_is_rejected() -> None:
    with pytest.raises(ControlMessageError, match="table:<slot>"):
        decode_control(b"table:no-table-part", b"{}")
    with pytest.raises(ControlMessageError, match="documented format"):
        decode_control(b"table:s:public.t", b'{"state": "sleeping"}')


def test_apply_status_round_trips() -> None:
    errored = ApplyTableStatus("public.orders", True, 3, "SchemaChangeError: retyped", 17)
    assert errored.key() == b"apply:public.orders"
    assert errored.value() == (
        b'{"table":"public.orders","errored":true,"parked":3,'
        b'"error":"SchemaChangeError: retyped","updated_at":17}'
    )
    assert decode_control(errored.key(), errored.value()) == errored
    released = ApplyTableStatus("public.orders", False, 0, None, 18)
    assert decode_control(released.key(), released.value()) == released


def test_apply_status_ignores_fields_added_later() -> None:
    value = b'{"table":"a.b","errored":false,"parked":0,"error":null,"updated_at":1,"new":2}'
    assert decode_control(b"apply:a.b", value) == ApplyTableStatus("a.b", False, 0, None, 1)


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b'{"table":"a.b","errored":false,"parked":0,"error":null}',
        b'{"table":"a.b","errored":0,"parked":0,"error":null,"updated_at":1}',
        b'{"table":"a.b","errored":true,"parked":true,"error":"e","updated_at":1}',
        b'{"table":"a.b","errored":true,"parked":"2","error":"e","updated_at":1}',
        b'{"table":"a.b","errored":false,"parked":0,"error":7,"updated_at":1}',
        b'{"table":"x.y","errored":false,"parked":0,"error":null,"updated_at":1}',
    ],
)
def test_apply_status_that_is_not_the_format_is_rejected(value: bytes) -> None:
    with pytest.raises(ControlMessageError, match="documented format"):
        decode_control(b"apply:a.b", value)


def test_apply_status_errored_exactly_while_records_wait() -> None:
    with pytest.raises(ControlMessageError, match="errored exactly while records wait"):
        decode_control(
            b"apply:a.b", b'{"table":"a.b","errored":true,"parked":0,"error":"e","updated_at":1}'
        )
    with pytest.raises(ControlMessageError, match="errored exactly while records wait"):
        ApplyTableStatus("a.b", False, 2, None, 1)


def test_a_kind_this_version_does_not_know_is_refused_not_read_as_progress() -> None:
    with pytest.raises(ControlMessageError, match="kind 'lake'"):
        decode_control(b"lake:public.orders", b'{"next_offset":1}')
    with pytest.raises(ControlMessageError, match="documented format"):
        decode_control(b"apply:", b"{}")
