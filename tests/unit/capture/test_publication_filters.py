"""Publication row filters and column lists: the snapshot's COPY under them
(capture.snapshot.worker), what a column list must hold (capture.source.publication),
which changes of them resync a table (capture.stream.schema_change), the entry a
table's status keeps (schemas.control, capture.stream.table_states), and what the table
flow does when it reads one (capture.stream.table_flow, with an in-memory publisher and
run)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capture.pgoutput import Relation, RelationColumn, ReplicaIdentity
from capture.snapshot.chunks import Chunk
from capture.snapshot.run import SnapshotTaken, TableCopied
from capture.snapshot.worker import chunk_query
from capture.source.publication import column_list_error
from capture.stream.change_stream import ChangeStream, RelationReceived
from capture.stream.schema_change import publication_change_reason
from capture.stream.table_states import TableStates
from schemas.control import (
    ControlMessageError,
    PublicationFilter,
    SnapshotResume,
    TableState,
    TableStatus,
    decode_control,
)
from schemas.lsn import Lsn
from tests.plugins.change_stream import ORDERS, describe_relation, run_stream
from tests.plugins.table_flow import table_flow

TENANT_7 = PublicationFilter("(tenant = 7)", ("id", "tenant", "Note"))


def _relation(*names: str) -> Relation:
    return Relation(
        xid=None,
        oid=1,
        namespace="My Schema",
        name='odd"table',
        replica_identity=ReplicaIdentity.DEFAULT,
        columns=tuple(RelationColumn(n == "id", n, 23, -1) for n in names),
    )


# -- the snapshot's COPY -------------------------------------------------------------------


def test_the_copy_reads_the_listed_columns_and_the_rows_the_filter_lets_through() -> None:
    relation = _relation("id", "tenant", "Note")
    whole = Chunk("s.t", 0, 1, 0, None)
    middle = Chunk("s.t", 1, 3, 10, 20)
    assert chunk_query(relation, whole, "(tenant = 7)").as_string(None) == (
        """COPY (SELECT "id", "tenant", "Note" FROM "My Schema"."odd""table" """
        """WHERE ((tenant = 7))) TO STDOUT"""
    )
    assert chunk_query(relation, middle, "((tenant = 7) OR (id < 3))").as_string(None) == (
        """COPY (SELECT "id", "tenant", "Note" FROM "My Schema"."odd""table" """
        """WHERE (((tenant = 7) OR (id < 3))) AND ctid >= '(10,0)'::tid """
        """AND ctid < '(20,0)'::tid) TO STDOUT"""
    )


def test_without_a_filter_the_copy_reads_every_row() -> None:
    text = chunk_query(_relation("id"), Chunk("s.t", 0, 1, 0, None)).as_string(None)
    assert text == """COPY (SELECT "id" FROM "My Schema"."odd""table") TO STDOUT"""


# -- what a column list must hold --------------------------------------------------------


def test_a_column_list_must_hold_the_key() -> None:
    default, index = ReplicaIdentity.DEFAULT, ReplicaIdentity.INDEX
    assert column_list_error("pub", "s.t", default, ()) is None
    assert column_list_error("pub", "s.t", index, ()) is None
    error = column_list_error("pub", "s.t", default, ("tenant", "id"))
    assert error is not None
    assert error.table == "s.t"
    text = str(error)
    assert "without its replica identity columns tenant, id:" in text
    assert "python -m capture resync s.t" in text


def test_under_replica_identity_full_no_column_list_is_allowed() -> None:
    error = column_list_error("pub", "s.t", ReplicaIdentity.FULL, ())
    assert error is not None
    assert "REPLICA IDENTITY FULL" in str(error)
    assert "Drop the list" in str(error)


# -- which changes resync --------------------------------------------------------------------


def test_an_unknown_or_unchanged_entry_resyncs_nothing() -> None:
    assert publication_change_reason(None, TENANT_7) is None
    assert publication_change_reason(TENANT_7, TENANT_7) is None
    assert publication_change_reason(PublicationFilter(), PublicationFilter()) is None


@pytest.mark.parametrize(
    ("current", "what"),
    [
        (PublicationFilter("(tenant = 8)", TENANT_7.columns), "row filter changed"),
        (PublicationFilter(None, TENANT_7.columns), "row filter changed"),
        (PublicationFilter("(tenant = 7)", ("id", "tenant")), "column list changed"),
        (PublicationFilter("(tenant = 7)", None), "column list changed"),
        (PublicationFilter(), "row filter and column list changed"),
    ],
)
def test_any_change_of_the_filter_or_the_list_resyncs(
    current: PublicationFilter, what: str
) -> None:
    reason = publication_change_reason(TENANT_7, current)
    assert reason is not None
    assert f"the publication's {what} (WHERE (tenant = 7), columns (id, tenant, Note) -> " in (
        reason
    )
    assert reason.endswith("so the table is snapshotted again")


def test_an_entry_describes_itself() -> None:
    assert PublicationFilter().describe() == "every row and column"
    assert PublicationFilter(None, ("a", "b")).describe() == "columns (a, b)"
    assert PublicationFilter("(x > 1)").describe() == "WHERE (x > 1)"


# -- the entry in a table's status -------------------------------------------------------


def test_a_status_keeps_the_entry_its_rows_were_taken_under() -> None:
    for published in (TENANT_7, PublicationFilter()):
        status = TableStatus(
            "slot", "public.t", TableState.STREAMING, Lsn(9), None, 1, publication=published
        )
        assert decode_control(status.key(), status.value()) == status
    plain = TableStatus("slot", "public.t", TableState.STREAMING, Lsn(9), None, 1)
    assert "publication" not in json.loads(plain.value()), "absent while not known"
    assert json.loads(TableStatus(**{**_fields(plain), "publication": TENANT_7}).value())[
        "publication"
    ] == {"row_filter": "(tenant = 7)", "columns": ["id", "tenant", "Note"]}


def _fields(status: TableStatus) -> dict[str, Any]:
    return {name: getattr(status, name) for name in TableStatus.__dataclass_fields__}


@pytest.mark.parametrize(
    "publication",
    [
        "(tenant = 7)",
        {"row_filter": 7, "columns": None},
        {"row_filter": None, "columns": "id"},
        {"row_filter": None, "columns": [1]},
        {"row_filter": None},
    ],
)
def test_a_malformed_entry_is_refused(publication: object) -> None:
    value = json.dumps(
        {
            "state": "streaming",
            "snapshot_lsn": "0/9",
            "message": None,
            "updated_at": 1,
            "publication": publication,
        }
    ).encode()
    with pytest.raises(ControlMessageError):
        decode_control(b"table:slot:public.t", value)


def test_the_entry_follows_the_table_from_its_snapshot_to_streaming_and_across_a_restart() -> None:
    states = TableStates("slot", {}, snapshot_new=True, clock=lambda: 7)
    states.add(["public.t"])
    assert states.published("public.t") is None
    assert states.snapshot_started("public.t", Lsn(10), TENANT_7).publication == TENANT_7
    assert states.snapshot_done("public.t").publication == TENANT_7
    streaming = states.caught_up("public.t")
    assert streaming.publication == TENANT_7
    restarted = TableStates("slot", {"public.t": streaming}, snapshot_new=True, clock=lambda: 7)
    assert restarted.published("public.t") == TENANT_7
    assert restarted.resync("public.t", "why").publication is None, "the next snapshot decides"


def test_a_resumable_snapshot_under_an_old_entry_starts_again_with_a_truncate() -> None:
    cut = TableStatus(
        "slot",
        "public.t",
        TableState.SNAPSHOT,
        Lsn(40),
        None,
        1,
        SnapshotResume(2, 20),
        publication=TENANT_7,
    )
    states = TableStates("slot", {"public.t": cut}, snapshot_new=True, clock=lambda: 7)
    assert states.resume_point("public.t") is not None
    assert states.published("public.t") == TENANT_7
    restarted = states.restart_snapshot("public.t", "changed")
    assert (restarted.state, restarted.snapshot_lsn, restarted.message) == (
        TableState.PENDING,
        None,
        "changed",
    )
    assert states.resume_point("public.t") is None
    assert states.needs_truncate("public.t")


# -- the table flow --------------------------------------------------------------------------


def _streaming(publication: PublicationFilter | None, snapshot_lsn: int | None = 5) -> TableStatus:
    lsn = None if snapshot_lsn is None else Lsn(snapshot_lsn)
    return TableStatus(
        "slot", "public.t", TableState.STREAMING, lsn, None, 1, publication=publication
    )


def test_a_streaming_table_whose_entry_changed_is_resynced_once() -> None:
    flow, publisher, _ = table_flow({"public.t": _streaming(TENANT_7)})
    flow.publication_seen("public.t", TENANT_7, Lsn(50))
    assert publisher.statuses == [], "the same entry: nothing to do"
    flow.publication_seen("public.t", PublicationFilter("(tenant = 8)", TENANT_7.columns), Lsn(50))
    (status,) = publisher.statuses
    assert status.state is TableState.PENDING
    assert status.message.startswith("the publication's row filter changed")
    flow.publication_seen("public.t", PublicationFilter(), Lsn(60))
    assert len(publisher.statuses) == 1, "pending: its snapshot reads the entry then"
    flow.close()


def test_a_streaming_table_without_a_known_entry_records_it() -> None:
    # Streaming without a snapshot (CAPTURE_SNAPSHOT_MODE=never): nothing to redo.
    flow, publisher, _ = table_flow({"public.t": _streaming(None, snapshot_lsn=None)})
    flow.publication_seen("public.t", TENANT_7, Lsn(50))
    (status,) = publisher.statuses
    assert (status.state, status.publication) == (TableState.STREAMING, TENANT_7)
    flow.close()


def test_a_table_an_earlier_version_snapshotted_whole_is_resynced_under_a_filter() -> None:
    flow, publisher, _ = table_flow({"public.t": _streaming(None)})
    flow.publication_seen("public.t", TENANT_7, Lsn(50))
    assert [s.state for s in publisher.statuses] == [TableState.PENDING]
    flow.close()
    flow, publisher, _ = table_flow({"public.t": _streaming(None)})
    flow.publication_seen("public.t", PublicationFilter(), Lsn(50))
    assert [(s.state, s.publication) for s in publisher.statuses] == [
        (TableState.STREAMING, PublicationFilter())
    ]
    flow.close()


def test_an_entry_read_during_a_run_is_compared_with_the_runs_at_its_consistent_point() -> None:
    changed = PublicationFilter("(tenant = 8)", TENANT_7.columns)
    for commit_lsn, resynced in ((Lsn(100), False), (Lsn(101), True)):
        flow, publisher, runs = table_flow()
        flow.step()
        flow.publication_seen("public.t", changed, commit_lsn)
        assert publisher.statuses == [], "the run's entry is not known yet"
        runs[0].items.put(SnapshotTaken(("public.t",), Lsn(100), {"public.t": TENANT_7}))
        flow.step()
        expected = [TableState.SNAPSHOT, TableState.PENDING] if resynced else [TableState.SNAPSHOT]
        assert [s.state for s in publisher.statuses] == expected
        assert publisher.statuses[0].publication == TENANT_7
        flow.close()


def test_the_entry_a_run_copied_under_is_what_the_streaming_table_keeps() -> None:
    flow, publisher, runs = table_flow()
    flow.step()
    runs[0].items.put(SnapshotTaken(("public.t",), Lsn(100), {"public.t": TENANT_7}))
    runs[0].items.put(TableCopied("public.t", 0))
    for _ in range(3):
        flow.step()
    assert publisher.statuses[-1].state is TableState.STREAMING
    assert publisher.statuses[-1].publication == TENANT_7
    flow.close()


def test_the_stream_reports_every_relation_when_asked() -> None:
    quiet = ChangeStream(describe_relation, "cdc")
    assert not [o for o in run_stream(quiet, [ORDERS]) if isinstance(o, RelationReceived)]
    stream = ChangeStream(describe_relation, "cdc", report_relations=True)
    received = [o for o in run_stream(stream, [ORDERS, ORDERS]) if isinstance(o, RelationReceived)]
    assert received == [RelationReceived("public.orders")] * 2


@pytest.mark.parametrize("recorded", [TENANT_7, None])
def test_a_snapshot_to_resume_under_another_entry_starts_again_from_scratch(
    recorded: PublicationFilter | None,
) -> None:
    cut = TableStatus(
        "slot",
        "public.t",
        TableState.SNAPSHOT,
        Lsn(40),
        None,
        1,
        SnapshotResume(2, 20),
        publication=recorded,
    )
    flow, publisher, _ = table_flow({"public.t": cut})
    assert flow.to_compare() == ["public.t"]
    flow.publication_seen("public.t", recorded or PublicationFilter(), Lsn(50))
    assert publisher.statuses == [], "the same entry: the snapshot resumes"
    flow.publication_seen("public.t", PublicationFilter("(tenant = 8)"), Lsn(50))
    (status,) = publisher.statuses
    assert (status.state, status.snapshot_lsn) == (TableState.PENDING, None)
    assert flow.to_compare() == [], "pending from scratch: its snapshot reads the entry"
    flow.close()
