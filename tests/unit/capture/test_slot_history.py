"""Capture refuses a slot whose position it cannot trust, and says how to resync."""

from __future__ import annotations

import pytest

from capture.errors import ConfigError
from capture.publish.control import ControlState
from capture.source.setup import SlotState, check_slot_history
from schemas.lsn import Lsn

APPLIED = {("cdc.public.orders", 0): 10, ("other.public.x", 0): 5}


def _slot(lsn: int, created: bool = False) -> SlotState:
    return SlotState("s", created, Lsn(lsn), active=False)


def _check(slot: SlotState | None, state: ControlState) -> None:
    check_slot_history(
        slot, "s", checkpoint=state.checkpoint, applied_topics=state.applied_topics("cdc")
    )


def test_fresh_start_is_accepted() -> None:
    _check(None, ControlState(None, {}))


def test_dropped_slot_with_applied_changes_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"does not exist.*cdc\.public\.orders.*Resync"):
        _check(None, ControlState(Lsn(100), APPLIED))


def test_a_missing_slot_names_a_failover_without_a_synchronized_copy() -> None:
    with pytest.raises(ConfigError, match="after a failover, the promoted standby had no"):
        _check(None, ControlState(Lsn(100), APPLIED))


def test_a_missing_slot_on_a_promoted_standby_says_why_it_is_missing() -> None:
    # Before PostgreSQL 17 a standby keeps no logical slot: a failover always ends here.
    state = ControlState(Lsn(100), APPLIED)
    with pytest.raises(ConfigError) as refused:
        check_slot_history(
            None,
            "s",
            checkpoint=state.checkpoint,
            applied_topics=state.applied_topics("cdc"),
            failed_over=True,
        )
    message = str(refused.value)
    assert "this server is a promoted standby" in message
    assert "before PostgreSQL 17 a standby keeps no logical slots" in message
    assert "Resync" in message


def test_a_promoted_standby_without_the_slot_is_refused_before_anything_was_applied() -> None:
    # Capture streamed on the old primary (its checkpoint), apply had not applied yet: a
    # new slot would still skip what the standby had past that point, and what was
    # written after the promotion.
    with pytest.raises(ConfigError) as refused:
        check_slot_history(
            None, "s", checkpoint=Lsn(0x1_0000_0100), applied_topics=(), failed_over=True
        )
    message = str(refused.value)
    assert "replication slot s does not exist" in message
    assert "capture streamed it up to 1/100" in message
    assert "this server is a promoted standby" in message
    assert "delete the lake and every checkpoint of apply's queries" in message
    assert "CAPTURE_SNAPSHOT_MODE=initial" in message
    assert message.endswith("(docs/operations.md, resync after a lost slot)")


def test_a_promoted_standby_without_the_slot_or_a_checkpoint_is_a_fresh_start() -> None:
    check_slot_history(None, "s", checkpoint=None, applied_topics=(), failed_over=True)


def test_missing_slot_is_fine_when_only_other_pipelines_applied() -> None:
    _check(None, ControlState(None, {("other.public.x", 0): 5}))


def test_slot_ahead_of_the_checkpoint_is_refused() -> None:
    with pytest.raises(ConfigError, match="someone else advanced it"):
        _check(_slot(200), ControlState(Lsn(100), APPLIED))


def test_slot_at_or_behind_the_checkpoint_is_accepted() -> None:
    _check(_slot(100), ControlState(Lsn(100), APPLIED))
    _check(_slot(50), ControlState(Lsn(100), APPLIED))
    _check(_slot(50), ControlState(None, APPLIED))
