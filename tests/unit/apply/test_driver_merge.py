"""apply.lake.driver_merge: which tables the driver writes, its MERGE's rules and upkeep's
compaction of its tables (apply.lake.upkeep), against tables delta-rs itself writes (the
comparison with Spark's MERGE on every column type is
tests/integration/test_apply_driver_merge.py's)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from deltalake import ColumnProperties, DeltaTable, WriterProperties, write_deltalake
from pyspark.sql.types import LongType, StringType

from apply.errors import TableError
from apply.lake.delta_log import commit_file, parse_commit
from apply.lake.delta_schema import ColumnPlan, ColumnSpec
from apply.lake.driver_merge import (
    DriverMergeUnavailableError,
    DriverTables,
    merge_rows,
    source_rows,
    writable,
)
from apply.lake.driver_plan import DecodedChange
from apply.lake.driver_store import LOCAL
from apply.lake.history import newest_state
from apply.lake.legacy_instants import CheckedFiles
from apply.lake.positions import AppliedState, Position, encode_state
from apply.lake.table_lock import TABLE_LOCKS, UnheldTableLockError
from apply.lake.tables import TableId
from apply.lake.upkeep import TableUpkeep, clean_log, compact, compact_from_driver
from apply.settings import UpkeepSettings
from schemas.lsn import Lsn

COLUMNS = (ColumnSpec("id", LongType(), key=True), ColumnSpec("Note", StringType()))


def table_rows(rows: list[tuple[int, str, int, int]]) -> pa.Table:
    ids, notes, lsns, ordinals = zip(*rows, strict=True)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "Note": pa.array(notes, pa.string()),
            "_cdc_commit_lsn": pa.array(lsns, pa.int64()),
            "_cdc_ordinal": pa.array(ordinals, pa.int64()),
            "_cdc_commit_ts": pa.array([0] * len(ids), pa.timestamp("us", tz="UTC")),
        }
    )


def changed(op: str, key: int, note: str | None, lsn: int, ordinal: int) -> DecodedChange:
    return DecodedChange(0, 0, op, Position(Lsn(lsn), ordinal), 0, (), (key, note))


def merged(
    table: Any,
    changes: list[DecodedChange],
    *,
    path: str,
    batch_id: int,
    metadata: str = "{}",
    unchanged: frozenset[str] = frozenset(),
) -> Mapping[str, int]:
    """``changes`` MERGEd into ``table`` by the driver, holding its lock as the job does."""
    with TABLE_LOCKS.held(path):
        return merge_rows(
            table,
            source_rows(changes, COLUMNS),
            path=path,
            name="public.t",
            columns=COLUMNS,
            key_columns=("id",),
            app_id="app",
            batch_id=batch_id,
            metadata=metadata,
            unchanged_columns=unchanged,
        )


@pytest.mark.parametrize(
    ("configuration", "refused"),
    [
        ({}, None),
        ({"delta.enableDeletionVectors": "true"}, "deletionVectors"),
        ({"delta.enableChangeDataFeed": "true"}, "writer version 4"),
    ],
)
def test_only_a_table_delta_rs_writes_exactly_is_written_from_the_driver(
    tmp_path: Path, configuration: dict[str, str], refused: str | None
) -> None:
    write_deltalake(str(tmp_path), table_rows([(1, "a", 10, 0)]), configuration=configuration)
    table = DeltaTable(str(tmp_path))
    if refused is None:
        writable(table)
        assert DriverTables().at(str(tmp_path), 0).version() == 0
    else:
        with pytest.raises(DriverMergeUnavailableError, match=refused):
            writable(table)
        with pytest.raises(DriverMergeUnavailableError):
            DriverTables().at(str(tmp_path), 0)


def test_a_table_read_at_another_version_than_the_job_knows_is_left_to_spark(
    tmp_path: Path,
) -> None:
    write_deltalake(str(tmp_path), table_rows([(1, "a", 10, 0)]))
    write_deltalake(str(tmp_path), table_rows([(2, "b", 11, 0)]), mode="append")
    with pytest.raises(DriverMergeUnavailableError, match="reads version 1, the job knows 0"):
        DriverTables().at(str(tmp_path), 0)


def test_the_merge_applies_newer_changes_only_and_commits_state_and_transaction(
    tmp_path: Path,
) -> None:
    write_deltalake(str(tmp_path), table_rows([(1, "a", 10, 0), (2, "b", 10, 1), (3, "c", 30, 0)]))
    changes = [
        changed("UPDATE", 1, "a2", 20, 0),  # newer: updated
        changed("DELETE", 2, None, 20, 1),  # newer: deleted
        changed("DELETE", 3, None, 20, 2),  # older than the row: the row stays
        changed("INSERT", 4, "d", 20, 3),  # new: inserted
        changed("DELETE", 5, None, 20, 4),  # nothing to delete
    ]
    metrics = merged(
        DriverTables().at(str(tmp_path), 0),
        changes,
        path=str(tmp_path),
        batch_id=7,
        metadata='{"state": 1}',
    )

    assert (
        metrics["num_target_rows_inserted"],
        metrics["num_target_rows_updated"],
        metrics["num_target_rows_deleted"],
    ) == (1, 1, 1)
    found = DeltaTable(str(tmp_path)).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["Note"], r["_cdc_commit_lsn"]) for r in found) == [
        (1, "a2", 20),
        (3, "c", 30),
        (4, "d", 20),
    ]
    commit = parse_commit(1, Path(commit_file(str(tmp_path), 1)).read_text())
    assert (commit.operation, commit.user_metadata) == ("MERGE", '{"state": 1}')
    assert commit.written_by("app", 7)


def test_a_merge_without_the_table_lock_is_refused_and_commits_nothing(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path), table_rows([(1, "a", 10, 0)]))
    with pytest.raises(UnheldTableLockError, match="without its table lock"):
        merge_rows(
            DriverTables().at(str(tmp_path), 0),
            source_rows([changed("UPDATE", 1, "b", 20, 0)], COLUMNS),
            path=str(tmp_path) + "/",
            name="public.t",
            columns=COLUMNS,
            key_columns=("id",),
            app_id="app",
            batch_id=1,
            metadata="{}",
        )
    assert DeltaTable(str(tmp_path)).version() == 0


DEFAULTS = {
    "delta.logRetentionDuration": "interval 48 hours",
    # The session's default is overridden: the driver writes only tables without them.
    "delta.enableDeletionVectors": "false",
}


def test_the_driver_creates_a_table_as_spark_would_and_reads_it_back(tmp_path: Path) -> None:
    path = str(tmp_path / "public" / "t")
    table = TableId("public", "t")
    plan = ColumnPlan(columns=COLUMNS, added=(), key_columns=("id",), create=True)
    tables = DriverTables()
    assert tables.read(path, table) is None
    with pytest.raises(UnheldTableLockError):
        tables.create(path, table, plan, defaults=DEFAULTS)
    with TABLE_LOCKS.held(path):
        existing = tables.create(path, table, plan, defaults=DEFAULTS)
        assert (
            tables.create(path, table, plan, defaults=DEFAULTS) == existing
        )  # idempotent: no second commit
        merge_rows(
            tables.at(path, 0),
            source_rows([changed("INSERT", 1, "a", 20, 0)], COLUMNS),
            path=path,
            name="public.t",
            columns=COLUMNS,
            key_columns=("id",),
            app_id="app",
            batch_id=3,
            metadata=encode_state(
                AppliedState("public.t", {}, None, None, None, batch_id=3, txn_app_id="app")
            ),
        )
    assert (existing.columns, existing.key_columns, existing.has_timestamp_ntz) == (
        COLUMNS,
        ("id",),
        False,
    )
    created = DeltaTable(path)
    assert created.version() == 1
    assert created.metadata().configuration == {
        "pgdelta.table": "public.t",
        "pgdelta.keyColumns": '["id"]',
        "delta.enableDeletionVectors": "false",
        "delta.logRetentionDuration": "interval 48 hours",
    }
    known = DriverTables().read(path, table)
    assert known is not None
    assert known.existing == existing
    assert known.history.version == 1
    assert known.history.state is not None
    assert (known.history.state.batch_id, known.history.state.txn_app_id) == (3, "app")


def test_a_table_apply_did_not_create_is_refused_when_read_in_the_driver(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path), table_rows([(1, "a", 10, 0)]))
    with pytest.raises(TableError, match="apply did not create"):
        DriverTables().read(str(tmp_path), TableId("public", "t"))


@pytest.mark.parametrize("feature", ["delta.enableDeletionVectors", "delta.enableChangeDataFeed"])
def test_a_new_table_the_session_gives_a_feature_the_driver_cannot_write_is_left_to_spark(
    tmp_path: Path, feature: str
) -> None:
    path = str(tmp_path / "t")
    plan = ColumnPlan(columns=COLUMNS, added=(), key_columns=("id",), create=True)
    with TABLE_LOCKS.held(path), pytest.raises(DriverMergeUnavailableError, match=feature):
        DriverTables().create(path, TableId("public", "t"), plan, defaults={feature: "true"})
    assert not DeltaTable.is_deltatable(path)


def test_the_drivers_commits_leave_expired_log_files_to_upkeep(tmp_path: Path) -> None:
    """Cleaning expired commit files lists the whole log: the driver's commits skip it
    (apply.lake.driver_merge.AFTER_COMMIT), upkeep's compaction turn does it."""
    path = str(tmp_path)
    configuration = {
        "delta.logRetentionDuration": "interval 1 second",
        "delta.checkpointInterval": "2",
    }
    write_deltalake(path, table_rows([(1, "a", 10, 0)]), configuration=configuration)
    tables = DriverTables()

    def merge(batch_id: int) -> None:
        version = DeltaTable(path).version()
        merged(
            tables.at(path, version),
            [changed("UPDATE", 1, f"n{batch_id}", 20 + batch_id, 0)],
            path=path,
            batch_id=batch_id,
        )

    for batch_id in range(3):
        merge(batch_id)
    time.sleep(1.5)  # the first commits expire
    for batch_id in range(3, 6):
        merge(batch_id)
    log_dir = tmp_path / "_delta_log"
    assert (log_dir / f"{0:020d}.json").exists(), "the driver's commit cleaned the log"
    assert clean_log(path).endswith("expired log files cleaned")
    assert not (log_dir / f"{0:020d}.json").exists()
    assert DeltaTable(path).to_pyarrow_table().to_pylist()[0]["Note"] == "n5"


def test_a_column_a_change_leaves_unchanged_keeps_the_tables_value(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path), table_rows([(1, "big toasted", 10, 0), (2, "other", 10, 1)]))
    changes = [
        DecodedChange(0, 0, "UPDATE", Position(Lsn(20), 0), 0, ("Note",), (1, None)),
        DecodedChange(0, 1, "UPDATE", Position(Lsn(20), 1), 0, (), (2, "changed")),
        DecodedChange(0, 2, "UPDATE", Position(Lsn(20), 2), 0, ("Note",), (3, None)),
    ]
    merged(
        DriverTables().at(str(tmp_path), 0),
        changes,
        path=str(tmp_path),
        batch_id=1,
        unchanged=frozenset({"Note"}),
    )
    found = DeltaTable(str(tmp_path)).to_pyarrow_table().to_pylist()
    # A row the table lacks is inserted with what the change has, as Spark's MERGE does.
    assert sorted((r["id"], r["Note"], r["_cdc_commit_lsn"]) for r in found) == [
        (1, "big toasted", 20),
        (2, "changed", 20),
        (3, None, 20),
    ]


def test_upkeep_compacts_a_driver_table_with_delta_rs_and_keeps_its_state_and_transaction(
    tmp_path: Path,
) -> None:
    """Spark's OPTIMIZE costs seconds even when it finds nothing; a table the driver
    writes is compacted by delta-rs, as any OPTIMIZE commit: no apply metadata, every
    row as it was, the query's transaction version kept."""
    path = str(tmp_path)
    write_deltalake(path, table_rows([(1, "a", 10, 0)]))
    for key in range(2, 6):
        write_deltalake(path, table_rows([(key, "b", 10, key)]), mode="append")
    merged(
        DriverTables().at(path, 4),
        [changed("UPDATE", 5, "b2", 20, 0)],
        path=path,
        batch_id=7,
        metadata='{"state": 7}',
    )
    before = DeltaTable(path)
    rows = sorted(map(str, before.to_pyarrow_table().to_pylist()))
    files = len(before.file_uris())
    assert files == 5

    no_spark = cast(Any, None)  # any use of Spark would raise
    with TABLE_LOCKS.held(path):
        done = compact(no_spark, path, 128)

    assert done.startswith(f"rewrote {files} files into 1 (delta-rs); ")
    after = DeltaTable(path)
    assert after.version() == 6
    assert len(after.file_uris()) == 1
    assert sorted(map(str, after.to_pyarrow_table().to_pylist())) == rows
    commit = parse_commit(6, Path(commit_file(path, 6)).read_text())
    assert (commit.operation, commit.user_metadata) == ("OPTIMIZE", None)
    assert newest_state("public.t", after.history()) is None  # history passes over it
    assert after.transaction_version("app") == 7

    with TABLE_LOCKS.held(path):
        again = compact(no_spark, path, 128)
    assert again.startswith("found nothing to rewrite (delta-rs); ")
    assert DeltaTable(path).version() == 6


def test_a_table_the_driver_does_not_write_is_left_to_sparks_optimize(tmp_path: Path) -> None:
    path = str(tmp_path)
    configuration = {"delta.enableDeletionVectors": "true"}
    write_deltalake(path, table_rows([(1, "a", 10, 0)]), configuration=configuration)
    write_deltalake(path, table_rows([(2, "b", 10, 0)]), mode="append")
    assert compact_from_driver(path, 128 * 1024 * 1024, LOCAL) is None
    assert DeltaTable(path).version() == 1


class _SparkAsked(Exception):
    """Raised by :class:`_NoSpark` at its first use."""


class _NoSpark:
    def __getattr__(self, name: str) -> Any:
        raise _SparkAsked(name)


def test_with_the_driver_writer_off_compaction_is_sparks(tmp_path: Path) -> None:
    """``APPLY_LAKE__DRIVER_WRITE_RECORDS=0``: nothing but Spark rewrites data files."""
    path = str(tmp_path)
    write_deltalake(path, table_rows([(1, "a", 10, 0)]))
    write_deltalake(path, table_rows([(2, "b", 10, 0)]), mode="append")
    with TABLE_LOCKS.held(path), pytest.raises(_SparkAsked):
        compact(cast(Any, _NoSpark()), path, 128, LOCAL, from_driver=False)
    assert DeltaTable(path).version() == 1


class _Runs:
    """An :class:`apply.lake.upkeep.UpkeepObserver` that keeps what it is told."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str, bool]] = []

    def upkeep(self, table: str, operation: str, duration_s: float, *, failed: bool) -> None:
        self.runs.append((table, operation, failed))


def test_a_batch_on_its_compaction_turn_has_delta_rs_compact_the_drivers_table(
    tmp_path: Path,
) -> None:
    """The route a batch takes after its commit (``TableUpkeep.after_commit``, as
    ``apply.batch.write`` calls it): on the table's turn, delta-rs compacts it and the
    files it reads are remembered; Spark is never asked."""
    path = str(tmp_path)
    # The first file without statistics, so the check of its instants reads it.
    no_statistics = WriterProperties(
        default_column_properties=ColumnProperties(statistics_enabled="NONE")
    )
    write_deltalake(path, table_rows([(1, "a", 10, 1)]), writer_properties=no_statistics)
    for key in range(2, 6):
        write_deltalake(path, table_rows([(key, "a", 10, key)]), mode="append")
    assert len(DeltaTable(path).file_uris()) == 5
    every = 4
    runs, checked = _Runs(), CheckedFiles()
    upkeep = TableUpkeep(
        UpkeepSettings(compact_every_commits=every, vacuum_every_commits=1_000_000),
        runs,
        LOCAL,
        checked=checked,
    )
    # Versions 0 to 4 hold the five writes; a span of `every` versions holds one turn.
    with TABLE_LOCKS.held(path):
        done = upkeep.after_commit(
            cast(Any, _NoSpark()), table="public.t", path=path, version_before=0,
            version_after=every,
        )  # fmt: skip
    assert [(run.task.value, run.failed) for run in done] == [("compact", False)]
    assert runs.runs == [("public.t", "compact", False)]
    after = DeltaTable(path)
    assert len(after.file_uris()) == 1
    assert sorted(after.to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3, 4, 5]
    commit = parse_commit(after.version(), Path(commit_file(path, after.version())).read_text())
    assert commit.operation == "OPTIMIZE"
    # Checked before compaction rewrote them: the file without statistics was read.
    assert list(checked.of(str(after.table_uri)).values()) == [None]
