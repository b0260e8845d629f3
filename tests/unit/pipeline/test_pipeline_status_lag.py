"""Lag, waiting offsets and the envelope read of ``python -m pipeline status`` (pure)."""

from __future__ import annotations

import pytest

from pipeline.status.lag import (
    EnvelopeError,
    WaitingChange,
    envelope_head,
    oldest,
    table_lag,
    waiting_offsets,
)
from schemas import column_type as ct
from schemas import registry_framing, single_object
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.registry_framing import SchemaId

NOW = 1_700_000_100_000_000
ENCODER = ChangeEncoder(
    build_table_schemas(
        TableDescription(
            "public",
            "orders",
            (Column("id", ct.LONG, nullable=False, key=True), Column("n", ct.STRING)),
        )
    )
)


@pytest.mark.parametrize(
    ("op", "commit_lsn", "commit_ts", "images"),
    [
        (Operation.INSERT, 0x16_B374_D848, 1_700_000_000_123_456, {"after": {"id": 1, "n": "x"}}),
        (Operation.DELETE, 0, -5, {"before": {"id": 1, "n": None}, "before_key_only": True}),
        (Operation.TRUNCATE, 2**62, 2**62, {}),
        (Operation.READ, 0x1000, 0, {"after": {"id": -(2**63), "n": "é" * 300}}),
    ],
)
def test_the_envelope_gives_commit_lsn_and_time_without_the_schema(
    op: Operation, commit_lsn: int, commit_ts: int, images: dict[str, object]
) -> None:
    change = Change(op, Lsn(commit_lsn), Lsn(commit_lsn + 8), 77, commit_ts, 3, **images)  # type: ignore[arg-type]
    single_object_value = ENCODER.encode_value(change)
    expected = WaitingChange(Lsn(commit_lsn), commit_ts)
    assert envelope_head(single_object_value) == expected
    # The same body behind the Schema Registry's header.
    body = single_object_value[single_object.HEADER_SIZE :]
    assert envelope_head(registry_framing.header(SchemaId(42)) + body) == expected


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (b"", "framing byte"),
        (b"\x07\x01" + bytes(20), "neither"),
        (b"\xc3\x01\x00\x00", "single-object header"),
        (b"\x00\x00\x01", "registry header"),
        (b"\xc3\x01" + bytes(8) + b"\x02\x80", "ends inside its envelope"),
        (b"\xc3\x01" + bytes(8) + b"\x00" + b"\xff" * 11, "longer than 10 bytes"),
        (b"\xc3\x01" + bytes(8) + b"\x00\x01\x00\x00\x00", "negative"),
    ],
)
def test_a_value_that_is_not_a_change_is_refused(value: bytes, match: str) -> None:
    with pytest.raises(EnvelopeError, match=match):
        envelope_head(value)


def test_waiting_is_the_end_minus_the_next_offset_summed_never_negative() -> None:
    assert waiting_offsets([(3, 10), (0, 0), (5, 5), (0, 4)]) == 7 + 4
    assert waiting_offsets([(12, 10)]) == 0
    assert waiting_offsets([]) == 0


def test_a_table_with_nothing_waiting_has_no_lag_however_old_its_last_change() -> None:
    assert table_lag(
        waiting=0,
        apply_errored=False,
        current_wal_lsn=Lsn(0x9000),
        applied_lsn=Lsn(0x100),
        oldest_waiting=None,
        now_micros=NOW,
    ) == (0, 0.0)


def test_lag_counts_wal_from_the_applied_lsn_and_time_from_the_oldest_waiting_change() -> None:
    waiting = WaitingChange(Lsn(0x500), NOW - 2_500_000)
    assert table_lag(
        waiting=3,
        apply_errored=False,
        current_wal_lsn=Lsn(0x9000),
        applied_lsn=Lsn(0x100),
        oldest_waiting=waiting,
        now_micros=NOW,
    ) == (0x9000 - 0x100, 2.5)


def test_before_anything_is_applied_the_wal_lag_counts_from_the_oldest_waiting_change() -> None:
    waiting = WaitingChange(Lsn(0x500), NOW)
    assert table_lag(
        waiting=1,
        apply_errored=False,
        current_wal_lsn=Lsn(0x9000),
        applied_lsn=None,
        oldest_waiting=waiting,
        now_micros=NOW,
    ) == (0x9000 - 0x500, 0.0)


def test_an_errored_table_lags_from_its_standing_lsn_and_its_time_lag_is_unknown() -> None:
    assert table_lag(
        waiting=0,
        apply_errored=True,
        current_wal_lsn=Lsn(0x9000),
        applied_lsn=Lsn(0x100),
        oldest_waiting=None,
        now_micros=NOW,
    ) == (0x9000 - 0x100, None)
    assert table_lag(
        waiting=2,
        apply_errored=True,
        current_wal_lsn=Lsn(0x9000),
        applied_lsn=None,
        oldest_waiting=WaitingChange(Lsn(0x500), NOW),
        now_micros=NOW,
    ) == (None, None)


def test_clock_skew_and_a_wal_position_read_before_the_apply_never_give_negative_lag() -> None:
    assert table_lag(
        waiting=1,
        apply_errored=False,
        current_wal_lsn=Lsn(0x100),
        applied_lsn=Lsn(0x200),
        oldest_waiting=WaitingChange(Lsn(0x300), NOW + 1_000_000),
        now_micros=NOW,
    ) == (0, 0.0)


def test_the_oldest_of_the_partitions_is_the_first_in_commit_order() -> None:
    first, second = WaitingChange(Lsn(0x100), 20), WaitingChange(Lsn(0x200), 10)
    assert oldest([second, first]) == first
    assert oldest([]) is None
