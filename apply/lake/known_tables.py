"""What the job last read or wrote of each table, used again while the log shows nothing
newer.

Before its MERGE a table's batch needs the table's newest version, the applied state in
its newest apply commit (:mod:`apply.lake.history`) and its columns and key
(:func:`apply.lake.delta_schema.read_existing_table`); reading them asks Delta for the
history and the table's details, Spark jobs every batch, for answers the job itself
wrote one batch earlier. So after a batch's MERGE commits, the job keeps the table's
new version, the state it committed and the columns it merged into, and the next batch
takes them back after one check: commit ``version + 1`` does not exist
(:mod:`apply.lake.delta_log`; the log has no gaps, so then ``version`` is still the newest).
Any other commit since, upkeep's own (:mod:`apply.lake.upkeep`), a ``reapply`` from another
process or an operator's ``OPTIMIZE``, makes that file exist, and the batch reads
everything from Delta as before.

Nothing is kept that Delta does not hold: an entry only repeats what the newest commit
says. A job that starts with none (a restart) reads from Delta, so it behaves exactly
like a running one, as the rest of the batch does (:mod:`apply.batch`). A batch that
created the table, added columns, replaced it or committed nothing leaves no entry,
and the next batch reads from Delta.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pyspark.sql import SparkSession

from apply.lake.delta_log import DeltaLogFiles
from apply.lake.delta_schema import ExistingTable
from apply.lake.history import TableHistory


@dataclass(frozen=True, slots=True)
class KnownTable:
    history: TableHistory
    """The version this job's commit made, and the state it committed."""
    existing: ExistingTable
    """The columns and key the commit merged into."""


class KnownTables:
    """The tables of one job, by path; each table's batch touches only its own entry."""

    def __init__(self) -> None:
        self._tables: dict[str, KnownTable] = {}
        self._lock = threading.Lock()

    def current(self, spark: SparkSession, path: str) -> KnownTable | None:
        """The entry for ``path`` while no commit followed it; else None, and the entry
        is dropped."""
        with self._lock:
            known = self._tables.get(path)
        if known is None:
            return None
        if DeltaLogFiles(spark).read(path, known.history.version + 1) is not None:
            self.forget(path)
            return None
        return known

    def remember(self, path: str, known: KnownTable) -> None:
        with self._lock:
            self._tables[path] = known

    def forget(self, path: str) -> None:
        with self._lock:
            self._tables.pop(path, None)


__all__ = ["KnownTable", "KnownTables"]
