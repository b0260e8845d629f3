"""A table flow (capture.stream.table_flow) for unit tests: one table, ``public.t``, a
publisher that keeps what it is handed in memory, and snapshot runs whose items the test
hands over."""

from __future__ import annotations

import queue
from typing import Any, cast

from capture.in_flight import ProgressBook
from capture.stream.change_stream import ChangeStream
from capture.stream.table_flow import TableFlow
from capture.stream.table_states import TableStates
from schemas.control import TableStatus
from schemas.lsn import Lsn
from tests.plugins.change_stream import describe_relation


class MemoryPublisher:
    """What TableFlow hands the producer, kept in memory."""

    def __init__(self) -> None:
        self.statuses: list[Any] = []
        self.records: list[Any] = []

    def publish(self, record: Any, pin: int | None = None) -> None:
        self.records.append(record)

    def publish_batch(self, *args: Any, **kwargs: Any) -> None:
        pass

    def publish_status(self, status: Any) -> None:
        self.statuses.append(status)

    def publish_schema(self, schema: Any) -> None:
        pass

    def flush(self) -> None:
        pass


class HandedRun:
    """A snapshot run whose items the test hands over."""

    def __init__(self, tables: list[str]) -> None:
        self.tables = tuple(tables)
        self.items: queue.Queue[Any] = queue.Queue()

    def cancel(self) -> None:
        pass


def table_flow(
    persisted: dict[str, TableStatus] | None = None,
) -> tuple[TableFlow, MemoryPublisher, list[HandedRun]]:
    """A flow over ``public.t`` (a new table unless ``persisted`` has its status), its
    publisher, and the snapshot runs it starts, in order."""
    states = TableStates("slot", persisted or {}, snapshot_new=True, clock=lambda: 7)
    states.add(["public.t"])
    publisher = MemoryPublisher()
    runs: list[HandedRun] = []

    def start_run(tables: list[str], truncate: list[str], resume: dict[str, Any]) -> Any:
        runs.append(HandedRun(tables))
        return runs[-1]

    flow = TableFlow(
        states,
        book=ProgressBook(Lsn(0)),
        publisher=cast("Any", publisher),
        changes=ChangeStream(describe_relation, "cdc"),
        start_run=start_run,
        spool_dir=None,
    )
    return flow, publisher, runs
