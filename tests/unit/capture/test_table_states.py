"""Table states: transitions, what survives a restart, where a streamed change goes."""

from __future__ import annotations

import pytest

from capture.stream.table_states import Route, TableStates
from schemas.control import SnapshotResume, TableState, TableStatus
from schemas.lsn import Lsn

SLOT = "cdc_slot"


def _states(
    persisted: dict[str, TableStatus] | None = None, *, snapshot_new: bool = True
) -> TableStates:
    return TableStates(SLOT, persisted or {}, snapshot_new=snapshot_new, clock=lambda: 7)


def _status(table: str, state: TableState, lsn: int | None = None) -> TableStatus:
    return TableStatus(SLOT, table, state, None if lsn is None else Lsn(lsn), None, 1)


def test_a_new_table_is_held_until_caught_up_and_then_published() -> None:
    states = _states()
    (pending,) = states.add(["public.t"])
    assert (pending.state, pending.slot, pending.updated_at) == (TableState.PENDING, SLOT, 7)
    assert states.route("public.t", Lsn(50)) is Route.HOLD
    assert states.snapshot_started("public.t", Lsn(99)).snapshot_lsn == 99
    assert states.route("public.t", Lsn(99)) is Route.DROP, "at the snapshot position: in it"
    assert states.route("public.t", Lsn(100)) is Route.HOLD
    assert states.snapshot_done("public.t").state is TableState.CATCH_UP
    assert states.route("public.t", Lsn(100)) is Route.HOLD, "behind the held changes"
    streaming = states.caught_up("public.t")
    assert (streaming.state, streaming.snapshot_lsn) == (TableState.STREAMING, 99)
    assert states.route("public.t", Lsn(100)) is Route.PUBLISH
    assert states.route("public.t", Lsn(98)) is Route.DROP, "a re-streamed change the snapshot has"


def test_snapshot_never_streams_new_tables_at_once() -> None:
    states = _states(snapshot_new=False)
    (status,) = states.add(["public.t"])
    assert status.state is TableState.STREAMING
    assert states.route("public.t", Lsn(1)) is Route.PUBLISH


def test_restart_redoes_cut_short_snapshots_and_keeps_the_rest() -> None:
    states = _states(
        {
            "public.a": _status("public.a", TableState.SNAPSHOT, 40),
            "public.b": _status("public.b", TableState.CATCH_UP, 40),
            "public.c": _status("public.c", TableState.STREAMING, 30),
            "public.d": TableStatus(SLOT, "public.d", TableState.ERRORED, None, "bad", 1),
            "public.e": _status("public.e", TableState.PENDING),
        }
    )
    assert states.add(["public.a", "public.b", "public.c", "public.d", "public.e"]) == []
    assert states.in_state(TableState.PENDING) == ["public.a", "public.e"]
    assert states.route("public.a", Lsn(10)) is Route.HOLD, "the old snapshot LSN is void"
    assert states.needs_truncate("public.a"), "rows of the cut-short snapshot may be in Kafka"
    assert states.needs_truncate("public.e"), "a resync replaces what the lake holds"
    assert states.route("public.b", Lsn(41)) is Route.PUBLISH, "catch-up resumes as streaming"
    assert states.route("public.c", Lsn(30)) is Route.DROP
    assert states.route("public.d", Lsn(99)) is Route.SKIP
    assert states.errors() == {"public.d": "bad"}


def test_a_snapshot_cut_short_after_a_chunk_resumes_at_its_old_position() -> None:
    resume = SnapshotResume(chunk=4, block=400)
    cut = TableStatus(SLOT, "public.a", TableState.SNAPSHOT, Lsn(40), "resynced", 1, resume)
    states = _states({"public.a": cut})
    assert states.in_state(TableState.PENDING) == ["public.a"]
    assert states.resume_point("public.a") == (Lsn(40), resume)
    assert not states.needs_truncate("public.a"), "a TRUNCATE would drop chunks 0..3"
    assert states.route("public.a", Lsn(40)) is Route.DROP, "chunks 0..3 hold its effect"
    assert states.route("public.a", Lsn(41)) is Route.HOLD
    # The new run's point is later; the table's rows keep the old position.
    started = states.snapshot_started("public.a", Lsn(90))
    assert (started.state, started.snapshot_lsn, started.resume) == (
        TableState.SNAPSHOT,
        Lsn(40),
        resume,
    )
    assert states.route("public.a", Lsn(60)) is Route.HOLD, "released over the rows read at 90"
    further = states.chunk_published("public.a", SnapshotResume(chunk=7, block=700))
    assert further.resume == SnapshotResume(7, 700)
    assert further.message == "resynced"
    done = states.snapshot_done("public.a")
    assert (done.state, done.snapshot_lsn, done.resume) == (TableState.CATCH_UP, Lsn(40), None)


def test_a_resync_or_an_error_forgets_where_a_snapshot_would_resume() -> None:
    states = _states()
    states.add(["public.a", "public.b"])
    for table in ("public.a", "public.b"):
        states.snapshot_started(table, Lsn(10))
        assert states.chunk_published(table, SnapshotResume(2, 20)).resume is not None
    assert states.resync("public.a", "a default was added").resume is None
    assert states.resume_point("public.a") is None
    assert states.needs_truncate("public.a")
    assert states.errored("public.b", "bad").resume is None
    with pytest.raises(ValueError, match="not snapshot"):
        states.chunk_published("public.b", SnapshotResume(3, 30))


def test_a_first_snapshot_records_where_it_would_resume() -> None:
    states = _states()
    states.add(["public.t"])
    states.snapshot_started("public.t", Lsn(10))
    status = states.chunk_published("public.t", SnapshotResume(1, 25))
    assert (status.state, status.snapshot_lsn, status.resume) == (
        TableState.SNAPSHOT,
        Lsn(10),
        SnapshotResume(1, 25),
    )
    restarted = _states({"public.t": status})
    assert restarted.resume_point("public.t") == (Lsn(10), SnapshotResume(1, 25))
    assert not restarted.needs_truncate("public.t")


def test_a_table_met_first_needs_no_truncate() -> None:
    states = _states()
    states.discover("public.new")
    assert not states.needs_truncate("public.new")


def test_errored_from_any_state_and_transitions_are_checked() -> None:
    states = _states()
    states.add(["public.t"])
    with pytest.raises(ValueError, match="pending, not snapshot"):
        states.snapshot_done("public.t")
    status = states.errored("public.t", "NaN in numeric(5,2)")
    assert status.state is TableState.ERRORED
    assert status.message == (
        "NaN in numeric(5,2); once the cause is fixed: python -m capture resync public.t, "
        "then restart capture (docs/capture.md, resync of an errored table)"
    )
    assert states.route("public.t", Lsn(1)) is Route.SKIP
    with pytest.raises(KeyError):
        states.route("public.unknown", Lsn(1))


def test_every_transition_moves_the_version() -> None:
    states = _states(snapshot_new=True)
    seen = [states.version]
    states.discover("public.a")
    seen.append(states.version)
    states.snapshot_started("public.a", Lsn(100))
    seen.append(states.version)
    states.snapshot_done("public.a")
    seen.append(states.version)
    states.caught_up("public.a")
    seen.append(states.version)
    states.route("public.a", Lsn(200))
    assert states.version == seen[-1], "a question is not a transition"
    assert seen == sorted(set(seen)), seen


def test_at_start_new_tables_and_problems_get_a_status_errored_ones_keep_theirs() -> None:
    persisted = {
        "public.old": _status("public.old", TableState.STREAMING, 5),
        "public.broken": _status("public.broken", TableState.ERRORED),
    }
    states = _states(persisted)
    statuses = states.at_start(
        ["public.old", "public.new"],
        {"public.broken": "no primary key", "public.nokey": "no primary key"},
    )
    assert [(s.table, s.state) for s in statuses] == [
        ("public.new", TableState.PENDING),
        ("public.nokey", TableState.ERRORED),
    ]
    assert states.state("public.old") is TableState.STREAMING
