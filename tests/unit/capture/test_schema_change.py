"""Which Relation changes resync a table (capture.stream.schema_change), the resync transition
(capture.stream.table_states), the Relation change the stream reports, and when a table being
snapshotted is taken again (capture.stream.table_flow, with an in-memory publisher and run)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from capture.pgoutput import Relation, RelationColumn
from capture.snapshot.run import RunFinished, SnapshotTaken, TableCopied
from capture.stream.change_stream import ChangeStream, RelationChanged
from capture.stream.schema_change import AddedColumn, added_columns, resync_reason
from capture.stream.table_states import Route, TableStates
from schemas.control import TableState
from schemas.lsn import Lsn
from tests.plugins.change_stream import ORDERS, describe_relation, run_stream
from tests.plugins.table_flow import MemoryPublisher, table_flow

WITH_EXTRA = replace(ORDERS, columns=(*ORDERS.columns, RelationColumn(False, "extra", 20, -1)))
NO_DEFAULT = AddedColumn(has_missing=False, has_default=False, identity=False)


def _added(relation: Relation, *names: str) -> Relation:
    return replace(
        relation,
        columns=(*relation.columns, *(RelationColumn(False, n, 20, -1) for n in names)),
    )


def test_added_columns_are_those_the_new_relation_names_first() -> None:
    assert added_columns(ORDERS, _added(ORDERS, "a", "b")) == ("a", "b")
    assert added_columns(ORDERS, ORDERS) == ()
    # A retype or a drop adds nothing.
    retyped = replace(ORDERS, columns=(*ORDERS.columns[:2], RelationColumn(False, "blob", 23, -1)))
    assert added_columns(ORDERS, retyped) == ()
    assert added_columns(ORDERS, replace(ORDERS, columns=ORDERS.columns[:2])) == ()


@pytest.mark.parametrize(
    "catalog",
    [
        AddedColumn(has_missing=True, has_default=True, identity=False),  # DEFAULT 7
        AddedColumn(has_missing=False, has_default=True, identity=False),  # DEFAULT random()
        AddedColumn(has_missing=False, has_default=False, identity=True),  # AS IDENTITY
        None,  # no longer in the catalog: cannot be checked, the safe side
    ],
)
def test_a_column_added_with_a_value_for_existing_rows_resyncs(catalog: AddedColumn | None) -> None:
    found = {} if catalog is None else {"extra": catalog}
    reason = resync_reason(ORDERS, WITH_EXTRA, found)
    assert reason is not None
    assert reason.startswith("column extra added with a default")


def test_a_column_added_without_default_or_any_other_change_needs_nothing() -> None:
    assert resync_reason(ORDERS, WITH_EXTRA, {"extra": NO_DEFAULT}) is None
    assert resync_reason(ORDERS, ORDERS, {}) is None
    dropped = replace(ORDERS, columns=ORDERS.columns[:2])
    assert resync_reason(ORDERS, dropped, {}) is None


def test_the_reason_names_only_the_filled_columns() -> None:
    both = _added(ORDERS, "plain", "filled")
    catalog = {
        "plain": NO_DEFAULT,
        "filled": AddedColumn(has_missing=True, has_default=True, identity=False),
    }
    reason = resync_reason(ORDERS, both, catalog)
    assert reason is not None
    assert reason.startswith("column filled added")


def test_the_stream_reports_a_changed_relation_but_not_the_first_or_a_repeated_one() -> None:
    stream = ChangeStream(describe_relation, "cdc")
    assert not [o for o in run_stream(stream, [ORDERS, ORDERS]) if isinstance(o, RelationChanged)]
    (changed,) = [o for o in run_stream(stream, [WITH_EXTRA]) if isinstance(o, RelationChanged)]
    assert changed == RelationChanged("public.orders", ORDERS, WITH_EXTRA)


def test_resync_holds_a_streaming_table_again_and_keeps_the_reason() -> None:
    states = TableStates("slot", {}, snapshot_new=True, clock=lambda: 7)
    states.add(["public.t"])
    states.snapshot_started("public.t", Lsn(99))
    states.snapshot_done("public.t")
    states.caught_up("public.t")

    status = states.resync("public.t", "column extra added with a default")

    assert (status.state, status.message) == (
        TableState.PENDING,
        "column extra added with a default",
    )
    assert states.route("public.t", Lsn(500)) is Route.HOLD
    assert states.needs_truncate("public.t")
    snapshot = states.snapshot_started("public.t", Lsn(600))
    assert snapshot.message == "column extra added with a default"
    states.snapshot_done("public.t")
    streaming = states.caught_up("public.t")
    assert (streaming.state, streaming.message) == (
        TableState.STREAMING,
        "column extra added with a default",
    )
    assert states.route("public.t", Lsn(600)) is Route.DROP


def test_only_a_snapshotted_table_resyncs() -> None:
    states = TableStates("slot", {}, snapshot_new=True, clock=lambda: 7)
    states.add(["public.pending"])
    states.errored("public.bad", "NaN")
    for table in ("public.pending", "public.bad", "public.unknown"):
        with pytest.raises(ValueError, match="only a captured, snapshotted table resyncs"):
            states.resync(table, "why")


def _states_of(publisher: MemoryPublisher) -> list[TableState]:
    return [status.state for status in publisher.statuses]


def test_a_snapshot_that_sees_the_change_is_kept_one_that_predates_it_is_taken_again() -> None:
    flow, publisher, runs = table_flow()
    flow.step()
    (run,) = runs
    run.items.put(SnapshotTaken(("public.t",), Lsn(100)))
    flow.step()
    assert _states_of(publisher)[-1] is TableState.SNAPSHOT

    flow.resync("public.t", "why", Lsn(100))  # committed before the consistent point
    assert _states_of(publisher)[-1] is TableState.SNAPSHOT

    flow.resync("public.t", "why", Lsn(101))
    assert (publisher.statuses[-1].state, publisher.statuses[-1].message) == (
        TableState.PENDING,
        "why",
    )
    run.items.put(TableCopied("public.t", 5))  # the old run's end no longer counts
    run.items.put(RunFinished())
    flow.step()
    flow.step()
    assert _states_of(publisher)[-1] is TableState.PENDING
    assert len(runs) == 2, "a new run takes the table again"
    assert runs[1].tables == ("public.t",)
    flow.close()


def test_a_change_during_a_run_not_positioned_yet_is_decided_at_its_consistent_point() -> None:
    for consistent_point, resynced in ((Lsn(300), False), (Lsn(250), True)):
        flow, publisher, runs = table_flow()
        flow.step()
        flow.resync("public.t", "why", Lsn(300))  # pending, in the run: wait for its point
        assert publisher.statuses == []
        runs[0].items.put(SnapshotTaken(("public.t",), consistent_point))
        flow.step()
        expected = [TableState.SNAPSHOT, TableState.PENDING] if resynced else [TableState.SNAPSHOT]
        assert _states_of(publisher) == expected
        flow.close()
