"""A small micro-batch MERGEd into its Delta table from the driver, with delta-rs.

A batch of a few hundred changes spends its time on Spark's fixed cost per table, not
on the data: planning, scheduling and a task per partition for every table of the
batch, seconds each on two cores, so a schema of eleven tables was 40 s behind its
source at 25 transactions a second (docs/benchmarks.md). delta-rs MERGEs 10 to 100,000
rows into a 100,000-row table in 37 to 72 ms from one Python process. So a batch the
driver holds (:mod:`apply.batch.micro_batch`) is decoded, measured and reduced to the
latest change per key there (:mod:`apply.lake.driver_plan`), and each table's rows are
MERGEd by delta-rs
(:func:`merge_rows`) with the rules of :func:`apply.lake.spark_merge.merge_into`:

- matched, the source row is a DELETE and newer than the target -> delete;
- matched, an INSERT/UPDATE/READ and newer -> every column updated;
- not matched, not a DELETE -> insert;

where "newer" compares ``(_cdc_commit_lsn, _cdc_ordinal)``, so no replayed or late
change takes a row back to an older state. The commit carries the batch's applied state
as ``userMetadata`` and the query's ``txnAppId`` with the batch id as its ``txn``
action: the commit Spark's MERGE makes, which a restarted job, the control topic,
``pipeline status`` and ``verify`` read the same way.

What it leaves to Spark's MERGE (:func:`apply.batch.write.merge_from_driver` checks):
a batch that creates the table or adds columns, a TRUNCATE, an unchanged TOAST value,
more than one writer schema, a replayed batch id (Spark's transaction check decides),
and a table this module cannot write exactly (:func:`writable`):

- **deletion vectors**: delta-rs 1.6 reads a table with the ``deletionVectors``
  feature as unsupported, but its MERGE rewrites such a table's files *without* the
  rows their vectors hide, bringing deleted rows back (measured here). Only tables
  whose writer features are all in :data:`WRITABLE_FEATURES` are written;
- **the change data feed**: Spark writes the change files of a MERGE, which delta-rs
  does not write the same way;
- a lake on an object store other than S3 (:mod:`apply.lake.driver_store`);
- **INT96 instants outside 1677-2262** in its files, which delta-rs would rewrite as
  other instants (:mod:`apply.lake.legacy_instants`); checked when the driver opens a
  table, not at each batch.

Any failure of delta-rs before its commit falls back to Spark's MERGE, which is safe
even after a delta-rs commit: it carries the same transaction id, which Delta skips.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError
from pyspark.sql.types import StructType

from apply.errors import TransientError
from apply.lake.delta_schema import (
    COMMIT_LSN_COLUMN,
    COMMIT_TS_COLUMN,
    ORDINAL_COLUMN,
    ColumnPlan,
    ColumnSpec,
    ExistingTable,
    existing_table,
    table_properties,
)
from apply.lake.driver_plan import DecodedChange, change_arrays, table_arrow_types
from apply.lake.driver_store import LOCAL, DriverStore
from apply.lake.history import TableHistory, newest_state
from apply.lake.known_tables import KnownTable
from apply.lake.legacy_instants import CheckedFiles, wrong_instants
from apply.lake.table_lock import TABLE_LOCKS
from apply.lake.tables import TableId
from schemas.operation import Operation

log = logging.getLogger(__name__)

SOURCE_OP = "__cdc_source_op"
"""The source rows' operation, a column of the MERGE's source only."""
SOURCE_UNCHANGED = "__cdc_source_unchanged"
"""The columns a source row leaves as the table holds them (unchanged TOAST values no
change of the batch carried), a column of the MERGE's source only."""

WRITABLE_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz"})
"""Writer features a table may have and still be written from the driver: the ones
delta-rs writes exactly and apply's tables use (a zone-less timestamp needs
``timestampNtz``)."""

AFTER_COMMIT = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
"""What delta-rs does after the driver's commits: a checkpoint when one is due, but not the
cleaning of expired commit files, which lists the whole ``_delta_log`` at every commit
(measured once, beside a running soak: a MERGE into a table of 3,000 commit files took
44 ms with it, 24 ms without; docs/benchmarks.md); upkeep cleans them at its compaction turn instead
(:func:`apply.lake.upkeep.compact`)."""

_CHANGE_DATA_FEED = "delta.enableChangeDataFeed"
_DELETION_VECTORS = "delta.enableDeletionVectors"


_FIRST_PAGE = 20
"""Commits read first for the newest apply state (:func:`apply.lake.history.read_history`'s
page)."""


class DriverMergeUnavailableError(Exception):
    """This table or batch cannot be MERGEd from the driver; Spark's MERGE takes it."""

    def __init__(self, reason: str, *, reported: bool = False) -> None:
        super().__init__(reason)
        self.reported = reported
        """Whether the reason was logged as a warning already: a table the driver leaves
        to Spark (:meth:`DriverTables.at`) is refused at every batch, and is reported
        when found, not each time."""


def _quoted(name: str) -> str:
    """``name`` as a SQL identifier for delta-rs's predicates (DataFusion lower-cases an
    unquoted one, and the contract's column names keep their case)."""
    return '"' + name.replace('"', '""') + '"'


def writable(table: Any) -> None:
    """Raise :class:`DriverMergeUnavailableError` unless delta-rs writes ``table`` exactly
    (module docstring)."""
    protocol = table.protocol()
    features = set(protocol.writer_features or ())
    if protocol.min_writer_version > 7 or not features <= WRITABLE_FEATURES:
        raise DriverMergeUnavailableError(
            f"writer features {sorted(features - WRITABLE_FEATURES)} (writer version "
            f"{protocol.min_writer_version}) that the driver does not write"
        )
    if 2 < protocol.min_writer_version < 7:
        # Versions 3 to 6 imply features (constraints, change data feed, generated
        # columns, column mapping) apply's tables do not use; the driver leaves them.
        raise DriverMergeUnavailableError(f"writer version {protocol.min_writer_version}")
    configuration = table.metadata().configuration
    if str(configuration.get(_CHANGE_DATA_FEED, "false")).lower() == "true":
        raise DriverMergeUnavailableError("the change data feed is on")


def exact_instants(
    table: Any, options: Mapping[str, str], checked: CheckedFiles | None = None
) -> None:
    """Raise :class:`DriverMergeUnavailableError` when a delta-rs rewrite of ``table``
    would change instants (:func:`apply.lake.legacy_instants.wrong_instants`, reading
    no file ``checked`` holds)."""
    try:
        wrong = wrong_instants(table, options, checked)
    except (OSError, ValueError, ArithmeticError, pa.ArrowException, DeltaError) as exc:
        # Not knowing is no reason to stop: Spark writes the table exactly either way.
        raise DriverMergeUnavailableError(f"its files' instants were not checked: {exc}") from exc
    if wrong is not None:
        raise DriverMergeUnavailableError(
            f"{wrong}; Spark writes and compacts the table until its files are rewritten "
            "(docs/apply.md, Timestamps are INT64 microseconds)"
        )


class DriverTables:
    """delta-rs's view of each table the driver writes, kept between batches: opening a
    table replays its log from the last checkpoint, while the job already knows that no
    commit but its own followed (:mod:`apply.lake.known_tables`). Safe for tables written
    from several threads, one thread per table at a time."""

    def __init__(self, store: DriverStore = LOCAL) -> None:
        """``store``: how delta-rs reaches the lake (:mod:`apply.lake.driver_store`)."""
        self._lock = threading.Lock()
        self._tables: dict[str, Any] = {}
        self._refused: dict[str, tuple[int, str]] = {}
        self._store = store
        self.checked = CheckedFiles()
        """The data files whose instants were read, and what was found, shared with
        upkeep's compaction (:class:`apply.lake.upkeep.TableUpkeep`)."""

    def _checked(self, path: str, table: Any) -> None:
        """:func:`writable` and :func:`exact_instants` for ``table`` as just opened; a
        refusal is remembered with the version it was found at, since only a commit can
        change the answer, and a table refused every batch would be read every batch."""
        version = table.version()
        with self._lock:
            refused = self._refused.get(path)
        if refused is not None and refused[0] == version:
            raise DriverMergeUnavailableError(refused[1], reported=True)
        try:
            writable(table)
            exact_instants(table, self._store.options, self.checked)
        except DriverMergeUnavailableError as exc:
            with self._lock:
                if self._refused.get(path, (None, ""))[1] != str(exc):
                    log.warning("table %s is written by Spark: %s", path, exc)
                self._refused[path] = (version, str(exc))
            raise DriverMergeUnavailableError(str(exc), reported=True) from exc
        with self._lock:
            self._refused.pop(path, None)

    def at(self, path: str, version: int) -> Any:
        """The table at ``path`` as of ``version``, its newest (the caller knows no later
        commit exists); :class:`DriverMergeUnavailableError` when delta-rs cannot open it
        there or write it."""
        with self._lock:
            table, refused = self._tables.get(path), self._refused.get(path)
        if table is None and refused is not None and refused[0] == version:
            raise DriverMergeUnavailableError(refused[1], reported=True)  # not opened again
        opened = table is None
        try:
            if table is None:
                table = self._open(path)
            elif table.version() < version:
                table.update_incremental()
        except DeltaError as exc:
            raise DriverMergeUnavailableError(f"delta-rs cannot open the table: {exc}") from exc
        if table.version() != version:
            self.forget(path)
            raise DriverMergeUnavailableError(
                f"delta-rs reads version {table.version()}, the job knows {version}"
            )
        if opened:
            self._checked(path, table)
        else:
            writable(table)  # its files since the check are the driver's own, INT64
        with self._lock:
            self._tables[path] = table
        return table

    def _open(self, path: str) -> Any:
        return DeltaTable(self._store.location(path), storage_options=dict(self._store.options))

    def forget(self, path: str) -> None:
        with self._lock:
            self._tables.pop(path, None)

    def read(self, path: str, table: TableId) -> KnownTable | None:
        """What a batch needs of the table at ``path`` before it writes, read by delta-rs
        with no Spark job: its newest version, the state of its newest apply commit
        (:mod:`apply.lake.history`) and its columns and key; None when there is no table yet.
        The first batch after a start, or after someone else's commit, is then written
        from the driver too. :class:`DriverMergeUnavailableError` when delta-rs cannot
        read or write the table (Spark reads it then)."""
        try:
            location, options = self._store.location(path), dict(self._store.options)
            if not DeltaTable.is_deltatable(location, storage_options=options):
                return None
            delta_table = DeltaTable(location, storage_options=options)
            self._checked(path, delta_table)
            page = delta_table.history(_FIRST_PAGE)
            state = newest_state(str(table), page)
            if state is None and len(page) == _FIRST_PAGE:
                state = newest_state(str(table), delta_table.history())
            schema = StructType.fromJson(json.loads(delta_table.schema().to_json()))
        except DeltaError as exc:
            raise DriverMergeUnavailableError(f"delta-rs cannot read the table: {exc}") from exc
        existing = existing_table(
            path, table, dict(delta_table.metadata().configuration), schema.fields
        )
        with self._lock:
            self._tables[path] = delta_table
        return KnownTable(TableHistory(delta_table.version(), state), existing)

    def create(
        self, path: str, table: TableId, plan: ColumnPlan, defaults: Mapping[str, str]
    ) -> ExistingTable:
        """Create the table at ``path`` with ``plan``'s columns in one delta-rs commit,
        with the properties Spark's creation gives a table: ``defaults``, the ones the
        session gives every new table (its ``properties.defaults`` confs: the lake's
        retentions, the operator's own), then those of
        :func:`apply.lake.delta_schema.ensure_table` (deletion vectors off: the driver
        writes only such tables). Idempotent, as Spark's creation is. What the table then
        is, for the batch's MERGE; :class:`DriverMergeUnavailableError` when the defaults
        ask for a table the driver does not write (deletion vectors, the change data
        feed), which Spark then creates."""
        TABLE_LOCKS.require(path, "a table's creation")
        for feature in (_DELETION_VECTORS, _CHANGE_DATA_FEED):
            if str(defaults.get(feature, "false")).lower() == "true":
                raise DriverMergeUnavailableError(f"new tables get {feature}")
        configuration = {
            **defaults,
            **table_properties(table, plan.key_columns, deletion_vectors=False),
        }
        schema = pa.schema(
            [pa.field(name, arrow) for name, arrow in table_arrow_types(plan.columns).items()]
        )
        try:
            created = DeltaTable.create(
                self._store.location(path),
                schema,
                mode="ignore",
                configuration=configuration,
                raise_if_key_not_exists=False,
                post_commithook_properties=AFTER_COMMIT,
                storage_options=dict(self._store.options),
            )
        except DeltaError as exc:
            raise DriverMergeUnavailableError(f"delta-rs did not create the table: {exc}") from exc
        fields = StructType.fromJson(json.loads(created.schema().to_json())).fields
        existing = existing_table(path, table, dict(created.metadata().configuration), fields)
        if existing.columns != plan.columns:
            # Someone created it first (mode "ignore"), with other columns: Spark plans it.
            raise DriverMergeUnavailableError("the table was created with other columns")
        with self._lock:
            self._tables[path] = created
        return existing


def source_rows(changes: Sequence[DecodedChange], columns: Sequence[ColumnSpec]) -> Any:
    """The MERGE's source: one row per key (``changes`` hold the latest change of each),
    with the table's columns, the operation and the columns it leaves unchanged."""
    for reserved in (SOURCE_OP, SOURCE_UNCHANGED):
        if any(column.name == reserved for column in columns):
            raise DriverMergeUnavailableError(f"the table has a column named {reserved}")
    arrays = change_arrays(changes, columns)
    arrays[SOURCE_OP] = pa.array([change.op for change in changes], type=pa.string())
    arrays[SOURCE_UNCHANGED] = pa.array(
        [list(change.unchanged) for change in changes], type=pa.list_(pa.string())
    )
    return pa.table(arrays)


def merge_rows(
    table: Any,
    rows: Any,
    *,
    path: str,
    name: str,
    columns: Sequence[ColumnSpec],
    key_columns: Sequence[str],
    app_id: str,
    batch_id: int,
    metadata: str,
    unchanged_columns: frozenset[str] = frozenset(),
) -> Mapping[str, int]:
    """MERGE ``rows`` (:func:`source_rows`) into ``table`` in one commit carrying
    ``metadata`` and ``(app_id, batch_id)`` (module docstring); delta-rs's metrics.

    A commit that loses to another writer raises :class:`~apply.errors.TransientError`,
    as Spark's MERGE does; any other failure of delta-rs raises
    :class:`DriverMergeUnavailableError`, and the batch takes Spark's MERGE. The caller
    holds the lock of the table at ``path`` (:mod:`apply.lake.table_lock`).
    ``unchanged_columns``: the columns a source row may leave as the table holds them
    (:func:`source_rows`), as Spark's MERGE does (:func:`apply.lake.spark_merge.merge_into`)."""
    TABLE_LOCKS.require(path, f"the driver's MERGE of batch {batch_id}")
    s_lsn, t_lsn = f"s.{_quoted(COMMIT_LSN_COLUMN)}", f"t.{_quoted(COMMIT_LSN_COLUMN)}"
    s_ord, t_ord = f"s.{_quoted(ORDINAL_COLUMN)}", f"t.{_quoted(ORDINAL_COLUMN)}"
    newer = f"({s_lsn} > {t_lsn} OR ({s_lsn} = {t_lsn} AND {s_ord} > {t_ord}))"
    is_delete = f"s.{_quoted(SOURCE_OP)} = '{Operation.DELETE.value}'"
    not_delete = f"s.{_quoted(SOURCE_OP)} <> '{Operation.DELETE.value}'"
    matches = " AND ".join(f"t.{_quoted(k)} = s.{_quoted(k)}" for k in key_columns)
    names = [c.name for c in columns] + [COMMIT_LSN_COLUMN, ORDINAL_COLUMN, COMMIT_TS_COLUMN]
    values = {_quoted(n): f"s.{_quoted(n)}" for n in names}
    # An unchanged TOAST value no change of the batch carried: the row keeps its own. The
    # names are Avro names ([A-Za-z_][A-Za-z0-9_]*): nothing to escape in the literal.
    updated = {
        _quoted(c.name): (
            f"CASE WHEN array_has(s.{_quoted(SOURCE_UNCHANGED)}, '{c.name}') "
            f"THEN t.{_quoted(c.name)} ELSE s.{_quoted(c.name)} END"
        )
        for c in columns
        if c.name in unchanged_columns
    }
    updates = {**values, **updated}
    properties = CommitProperties(
        custom_metadata={"userMetadata": metadata},
        app_transactions=[Transaction(app_id, batch_id, int(time.time() * 1000))],
    )
    try:
        metrics: Mapping[str, int] = (
            table.merge(
                rows,
                matches,
                source_alias="s",
                target_alias="t",
                commit_properties=properties,
                post_commithook_properties=AFTER_COMMIT,
            )
            .when_matched_delete(predicate=f"{is_delete} AND {newer}")
            .when_matched_update(updates=updates, predicate=f"{not_delete} AND {newer}")
            .when_not_matched_insert(updates=values, predicate=not_delete)
            .execute()
        )
    except CommitFailedError as exc:
        raise TransientError(
            f"table {name}: another writer committed to it during the driver's MERGE; retry "
            "the batch, and make sure one apply job owns each table"
        ) from exc
    except DeltaError as exc:
        raise DriverMergeUnavailableError(f"delta-rs did not merge: {exc}") from exc
    return metrics


__all__ = [
    "SOURCE_OP",
    "WRITABLE_FEATURES",
    "DriverMergeUnavailableError",
    "DriverTables",
    "exact_instants",
    "merge_rows",
    "source_rows",
    "writable",
]
