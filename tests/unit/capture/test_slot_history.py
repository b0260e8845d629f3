"""Capture refuses a slot whose position it cannot trust, and says how to resync."""

from __future__ import annotations

import pytest

from capture.errors import ConfigError
from capture.publish.control import ControlState
from capture.source.setup import SlotState, check_slot_history
from schemas.control import TableState, TableStatus
from schemas.lsn import Lsn

APPLIED = {("cdc.public.orders", 0): 10, ("other.public.x", 0): 5}


def _slot(lsn: int, created: bool = False) -> SlotState:
    return SlotState("s", created, Lsn(lsn), active=False)


def _check(slot: SlotState | None, state: ControlState) -> None:
    check_slot_history(
        slot,
        "s",
        checkpoint=state.checkpoint,
        applied_topics=state.applied_topics("cdc"),
        streamed_tables=state.streamed_tables(),
    )


def _states(**tables: TableState) -> dict[str, TableStatus]:
    return {
        f"public.{name}": TableStatus("s", f"public.{name}", state, None, None, 0)
        for name, state in tables.items()
    }


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


def test_a_slot_dropped_before_anything_was_applied_is_refused_with_its_position() -> None:
    # The same server and timeline: capture checkpointed the slot at 1/100 and published
    # changes after it, apply had not applied any. A new slot would start at the
    # server's current WAL and the changes in between would never reach Kafka.
    with pytest.raises(ConfigError) as refused:
        _check(None, ControlState(Lsn(0x1_0000_0100), {}))
    message = str(refused.value)
    assert message.startswith("replication slot s does not exist, but capture streamed it ")
    assert "up to 1/100 (its last checkpoint on the control topic)" in message
    assert "promoted from" not in message
    assert "the slot was dropped" in message
    assert "would silently skip every change made since" in message
    assert "capture makes one only on a fresh start" in message
    assert "delete this pipeline's change, schema and control topics" in message
    assert message.endswith("(docs/operations.md, resync after a lost slot)")


def test_a_slot_missing_on_the_checkpoints_server_and_timeline_was_dropped_there() -> None:
    with pytest.raises(ConfigError) as refused:
        check_slot_history(None, "s", checkpoint=Lsn(0x100), applied_topics=(), same_timeline=True)
    message = str(refused.value)
    assert "the slot was dropped (this is the server and the timeline capture last " in message
    assert "so no failover took it" in message
    assert "promoted standby" not in message


def test_a_slot_dropped_before_its_first_checkpoint_is_refused_naming_the_tables() -> None:
    # Nothing confirmed yet (an unapplied snapshot or changes pin the slot where it was
    # made), so no checkpoint: the table states show capture was taking changes from it.
    state = ControlState(
        None,
        {},
        _states(a=TableState.STREAMING, b=TableState.SNAPSHOT, c=TableState.CATCH_UP),
    )
    with pytest.raises(ConfigError) as refused:
        _check(None, state)
    message = str(refused.value)
    assert "capture was taking the changes of public.a, public.b, public.c from it" in message
    assert "before its first checkpoint" in message
    assert "Resync the pipeline" in message


def test_tables_that_took_no_changes_from_the_slot_leave_a_fresh_start() -> None:
    # Pending tables are snapshotted from a point of their own, errored ones only after a
    # resync: a new slot skips nothing of theirs (a resync request before the first
    # start, a start that failed before its first snapshot).
    _check(None, ControlState(None, {}, _states(a=TableState.PENDING, b=TableState.ERRORED)))


def test_an_existing_slot_with_table_states_and_no_checkpoint_is_adopted() -> None:
    _check(_slot(100), ControlState(None, {}, _states(a=TableState.STREAMING)))


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
