"""Read apply's state back from a Delta table's commit history.

Every MERGE apply runs carries the table's :class:`~apply.lake.positions.AppliedState` as the
commit's ``userMetadata``. Other commits on the table (its creation, added columns,
``OPTIMIZE``, ``VACUUM``) carry none, so the state is the one of the **newest commit
that has apply's metadata**. A restarted job needs nothing else: no local files, no
control topic. A commit Delta skipped as a duplicate (same ``txnAppId`` and
``txnVersion``) wrote nothing, so it cannot leave a state behind that the data lacks.

Delta keeps commit files for ``delta.logRetentionDuration`` (24 hours on the tables
apply creates, ``APPLY_LAKE__LOG_RETENTION_HOURS``; Delta's default is 30 days), so the
newest apply commit is found unless a table has had nothing but maintenance commits for
longer than that (upkeep's commits only follow apply's, so it takes an operator's).
Then the state is gone: rows still refuse older positions (the MERGE's guard), but
records the capture publishes again would no longer be recognised as replays, and a
re-sent INSERT of a row deleted since would bring it back. Run maintenance on tables
that also receive changes, or resync such a table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import Row, SparkSession

from apply.errors import CommitMetadataError
from apply.lake.positions import AppliedState, StateFormatError, decode_state

# Most commits are apply's; a first page this long almost always holds the newest one.
_FIRST_PAGE = 20


@dataclass(frozen=True, slots=True)
class TableHistory:
    """What apply needs to know about a Delta table before it writes."""

    version: int
    """The table's newest version."""
    state: AppliedState | None
    """The state in the newest apply commit; None when no MERGE has committed yet."""


def newest_state(table: str, rows: Iterable[Row | Mapping[str, Any]]) -> AppliedState | None:
    """The state of the newest commit among ``rows`` (newest first, each with its
    ``version`` and ``userMetadata``, as Spark's or delta-rs's history gives them) that
    holds one."""
    for row in rows:
        try:
            # delta-rs's history leaves the key out of a commit without metadata.
            metadata = row.get("userMetadata") if isinstance(row, Mapping) else row["userMetadata"]
            state = decode_state(metadata)
        except StateFormatError as exc:
            raise CommitMetadataError(table, f"version {row['version']}: {exc}") from exc
        if state is not None:
            return state
    return None


def read_history(spark: SparkSession, path: str, table: str) -> TableHistory | None:
    """The newest version and apply state of the Delta table at ``path``; None when
    there is no Delta table there yet."""
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    delta = DeltaTable.forPath(spark, path)
    page = delta.history(_FIRST_PAGE).select("version", "userMetadata").collect()
    state = newest_state(table, page)
    if state is None and len(page) == _FIRST_PAGE:
        state = newest_state(table, delta.history().select("version", "userMetadata").collect())
    return TableHistory(version=int(page[0]["version"]), state=state)


def recover_state(spark: SparkSession, path: str, table: str) -> AppliedState | None:
    """The applied state of ``table`` as its Delta table at ``path`` records it: what a
    restarted job resumes from and re-publishes to the control topic."""
    history = read_history(spark, path, table)
    return None if history is None else history.state


def newest_version(spark: SparkSession, path: str) -> int:
    """The newest version of the Delta table at ``path`` (a commit's own figures are
    read from its file, :mod:`apply.lake.delta_log`)."""
    row = DeltaTable.forPath(spark, path).history(1).select("version").head()
    if row is None:
        raise ValueError(f"{path} has no commits")
    return int(row["version"])
