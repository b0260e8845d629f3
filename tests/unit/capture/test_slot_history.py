"""Capture refuses a slot whose position it cannot trust, and says how to resync."""

from __future__ import annotations

import pytest

from capture.errors import ConfigError
from capture.publish.control import ControlState
from capture.service import check_slot_history
from capture.source.setup import SlotState
from schemas.lsn import Lsn

APPLIED = {("cdc.public.orders", 0): 10, ("other.public.x", 0): 5}


def _slot(lsn: int, created: bool = False) -> SlotState:
    return SlotState("s", created, Lsn(lsn), active=False)


def test_fresh_start_is_accepted() -> None:
    check_slot_history(None, ControlState(None, {}), "s", "cdc")


def test_dropped_slot_with_applied_changes_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"does not exist.*cdc\.public\.orders.*Resync"):
        check_slot_history(None, ControlState(Lsn(100), APPLIED), "s", "cdc")


def test_missing_slot_is_fine_when_only_other_pipelines_applied() -> None:
    check_slot_history(None, ControlState(None, {("other.public.x", 0): 5}), "s", "cdc")


def test_slot_ahead_of_the_checkpoint_is_refused() -> None:
    with pytest.raises(ConfigError, match="someone else advanced it"):
        check_slot_history(_slot(200), ControlState(Lsn(100), APPLIED), "s", "cdc")


def test_slot_at_or_behind_the_checkpoint_is_accepted() -> None:
    check_slot_history(_slot(100), ControlState(Lsn(100), APPLIED), "s", "cdc")
    check_slot_history(_slot(50), ControlState(Lsn(100), APPLIED), "s", "cdc")
    check_slot_history(_slot(50), ControlState(None, APPLIED), "s", "cdc")
