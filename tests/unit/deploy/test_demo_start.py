"""The demo starts its workload once the snapshot is in Delta, not when the slot is."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from deploy.demo import SCHEMA, TABLES, snapshot_applied
from pipeline.status import PipelineStatus
from pipeline.status.model import TableView
from schemas.control import TableState
from schemas.lsn import Lsn


def view(table: str, state: TableState, applied: int | None, waiting: int) -> TableView:
    return TableView(
        table=f"{SCHEMA}.{table}",
        topic=f"cdc.{SCHEMA}.{table}",
        capture_state=state,
        capture_message=None,
        applied_lsn=None if applied is None else Lsn(applied),
        lag_bytes=None,
        lag_s=None,
        waiting=waiting,
        apply_errored=False,
        parked=0,
        apply_error=None,
    )


def status(*views: TableView) -> PipelineStatus:
    return cast(PipelineStatus, cast(Any, SimpleNamespace(tables=views)))


def test_the_snapshot_is_applied_once_every_table_streams_with_nothing_waiting() -> None:
    ready = [view(t, TableState.STREAMING, 0x100, 0) for t in TABLES]
    assert snapshot_applied(status(*ready))
    # A table with no rows: nothing was sent, nothing to apply.
    assert snapshot_applied(status(view(TABLES[0], TableState.STREAMING, None, 0), *ready[1:]))
    for index, not_yet in enumerate(
        [
            view(TABLES[0], TableState.SNAPSHOT, None, 0),  # capture still copies it
            view(TABLES[0], TableState.STREAMING, 0x100, 3),  # records wait in Kafka
        ]
    ):
        assert not snapshot_applied(status(not_yet, *ready[1:])), index
    assert not snapshot_applied(status(*ready[1:])), "a table the status does not list"
