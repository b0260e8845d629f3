"""``synchronized_standby_slots`` naming a slot the server cannot wait for is refused at
start, with the fix; a standby that is only away is a warning
(capture/source/standby_slots.py)."""

from __future__ import annotations

import logging

import pytest

from capture.errors import ConfigError
from capture.source.standby_slots import (
    FIX,
    StandbySlot,
    StandbySlotState,
    assess,
    parse_slot_names,
)


def test_slot_names_are_read_as_the_server_reads_them() -> None:
    assert parse_slot_names("standby1") == ["standby1"]
    assert parse_slot_names(" Standby1 ,  b ") == ["standby1", "b"]
    assert parse_slot_names('"Mixed Case", x') == ["Mixed Case", "x"]
    assert parse_slot_names('"a""b","c,d"') == ['a"b', "c,d"]


@pytest.mark.parametrize("value", ["a,", ",a", "a b", '"a', '""', "a,,b"])
def test_a_value_that_is_not_a_list_of_names_is_rejected(value: str) -> None:
    with pytest.raises(ValueError, match="synchronized_standby_slots"):
        parse_slot_names(value)


@pytest.mark.parametrize(
    "state", [StandbySlotState.MISSING, StandbySlotState.LOGICAL, StandbySlotState.INVALIDATED]
)
def test_a_slot_the_server_cannot_wait_for_is_refused_with_the_fix(
    state: StandbySlotState,
) -> None:
    slots = [StandbySlot("standby1", StandbySlotState.READY), StandbySlot("nope", state)]
    with pytest.raises(ConfigError) as refused:
        assess(slots, slot="cdc_slot")
    message = str(refused.value)
    assert f'"nope" {state.value}' in message
    assert "standby1" not in message, "only the slots that stall are named"
    assert FIX in message
    assert "slot cdc_slot" in message


def test_a_standby_that_is_away_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="capture.source.standby_slots"):
        assess([StandbySlot("standby1", StandbySlotState.INACTIVE)], slot="cdc_slot")
    assert len(caplog.records) == 1
    assert "standby1, which has no standby connected" in caplog.records[0].getMessage()


def test_ready_slots_or_none_are_silent(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="capture.source.standby_slots"):
        assess([StandbySlot("standby1", StandbySlotState.READY)], slot="s")
        assess([], slot="s")
    assert not caplog.records
