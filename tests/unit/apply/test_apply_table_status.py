"""apply's per-table status messages, from what the dead-letter table holds (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from apply.control.table_status import format_errored, table_statuses
from schemas.control import ApplyTableStatus, decode_control


@dataclass(frozen=True)
class Waiting:
    records: int
    error: str
    error_kind: str


def test_errored_tables_get_their_count_and_error_the_others_are_cleared() -> None:
    errored = {"public.a": Waiting(3, "column x changed type", "SchemaChangeError")}
    statuses = table_statuses(["public.b", "public.a", "public.a"], errored, 42)
    assert statuses == [
        ApplyTableStatus("public.a", True, 3, "SchemaChangeError: column x changed type", 42),
        ApplyTableStatus("public.b", False, 0, None, 42),
    ]
    # What goes on the wire reads back the same.
    assert [decode_control(s.key(), s.value()) for s in statuses] == statuses


def test_errored_lists_only_errored_tables() -> None:
    statuses = {
        "public.b": ApplyTableStatus("public.b", True, 2, "BadRecordError: offset 7", 1),
        "public.a": ApplyTableStatus("public.a", False, 0, None, 1),
    }
    printed = format_errored(statuses)
    assert printed.startswith("public.b: 2 records parked: BadRecordError: offset 7; cure: ")
    assert "public.a" not in printed
    assert format_errored({"public.a": statuses["public.a"]}) == "no errored table"
