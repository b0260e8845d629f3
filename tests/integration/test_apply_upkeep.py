"""Table upkeep in the apply batch, against real Delta tables on disk.

The micro-batches are DataFrames with the columns of Spark's Kafka source, made from
records the contract's own encoder wrote: the survey, decoding and MERGE cannot tell
them from a Kafka read, and no broker is needed. A table gets small batches with a
compaction due every 2 versions and a vacuum every 6; before the vacuum, its deleted-file
retention is cut to 0 hours so the vacuum has something to delete (Delta then also
refuses time travel to the versions before).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from apply.batch import ApplyContext, apply_batch
from apply.lake.history import recover_state
from apply.lake.spark_merge import transaction_app_id
from apply.lake.table_lock import TABLE_LOCKS
from apply.lake.tables import TableId, table_path
from apply.lake.upkeep import TableUpkeep, turn_offset, vacuum
from apply.metrics import ApplyMetrics
from apply.settings import UpkeepSettings
from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from schemas.lsn import Lsn
from schemas.naming import table_topic
from schemas.operation import Operation

pytestmark = pytest.mark.slow

COMMIT_TS = 1_715_941_815_000_000
KAFKA_COLUMNS = "topic string, partition int, offset long, key binary, value binary"


class Records:
    """The records of one single-partition change topic, offset by offset."""

    def __init__(self, table: str) -> None:
        schemas = build_table_schemas(
            TableDescription(
                "public",
                table,
                (Column("id", ct.LONG, nullable=False, key=True), Column("note", ct.STRING)),
            )
        )
        self.schemas = schemas
        self.encoder = ChangeEncoder(schemas)
        self.topic = table_topic("cdc", "public", table)
        self.offset = 0

    def batch(self, spark: Any, lsn: int, notes: dict[int, str]) -> Any:
        """One transaction at ``lsn`` writing ``notes`` by id: inserts or updates."""
        rows = []
        for ordinal, (id_, note) in enumerate(sorted(notes.items())):
            item = Change(
                Operation.INSERT,
                Lsn(lsn),
                Lsn(lsn + ordinal),
                lsn,
                COMMIT_TS + lsn,
                ordinal,
                after={"id": id_, "note": note},
            )
            key, value = self.encoder.encode_key(item), self.encoder.encode_value(item)
            rows.append((self.topic, 0, self.offset, key, value))
            self.offset += 1
        return spark.createDataFrame(rows, KAFKA_COLUMNS)


def content(spark: Any, path: str, version: int | None = None) -> dict[int, str]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return {row["id"]: row["note"] for row in reader.load(path).collect()}


def commits(spark: Any, path: str, since: int) -> list[tuple[int, str, Any, Any]]:
    from delta.tables import DeltaTable  # noqa: PLC0415 - pyspark only when Spark runs

    history = DeltaTable.forPath(spark, path).history().where(f"version >= {since}")
    return sorted(
        (row["version"], row["operation"], row["operationMetrics"], row["userMetadata"])
        for row in history.collect()
    )


def files_on_disk(path: str) -> tuple[int, int]:
    """Data files and deletion-vector files under the table, its log left out."""
    data = list(Path(path).glob("*.parquet"))
    vectors = list(Path(path).glob("deletion_vector_*.bin"))
    return len(data), len(vectors)


def on_the_multiples(prefix: str, every: int) -> str:
    """A table name starting with ``prefix`` whose upkeep turns fall on the multiples of
    ``every`` themselves (:func:`apply.lake.upkeep.turn_offset` 0), so that the versions
    the test below names are its turns."""
    return next(
        f"{prefix}_{i}"
        for i in itertools.count()
        if turn_offset(f"public.{prefix}_{i}", every) == 0
    )


def test_upkeep_bounds_files_and_leaves_the_applied_state(
    spark: Any, unique_name: str, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable  # noqa: PLC0415

    unique_name = on_the_multiples(unique_name, 6)  # compaction every 2, vacuum every 6
    records = Records(unique_name)
    metrics = ApplyMetrics()
    ctx = ApplyContext(
        lake_root=str(tmp_path / "lake"),
        txn_app_id=transaction_app_id(str(tmp_path / "checkpoint")),
        writer_schemas={records.schemas.value_fingerprint: records.schemas.value_schema_json},
        upkeep=TableUpkeep(
            UpkeepSettings(compact_every_commits=2, vacuum_every_commits=6), observer=metrics
        ),
        # Spark's MERGE with deletion vectors: the vectors are what upkeep must bound too.
        deletion_vectors=True,
    )
    path = table_path(ctx.lake_root, TableId("public", unique_name))

    def detail() -> int:
        row = DeltaTable.forPath(spark, path).detail().head()
        assert row is not None
        return int(row["numFiles"])

    # Batch 0 creates the table (version 0) and merges (1): not a turn.
    first = apply_batch(records.batch(spark, 0x100, dict.fromkeys(range(40), "a")), 0, ctx)
    assert first.applied[0].version == 1
    # Batch 1 updates rows of batch 0's files (deletion vectors) at version 2: a turn.
    expected = dict.fromkeys(range(40), "a") | dict.fromkeys(range(0, 40, 4), "b")
    second = apply_batch(records.batch(spark, 0x200, dict.fromkeys(range(0, 40, 4), "b")), 1, ctx)
    merged = second.applied[0]
    assert (merged.committed, merged.version) == (True, 2)

    [(_, merge_op, _, merge_meta), (_, optimize_op, optimized, optimize_meta)] = commits(
        spark, path, since=2
    )
    assert (merge_op, optimize_op) == ("MERGE", "OPTIMIZE")
    assert merge_meta is not None
    assert optimize_meta is None, "upkeep carries no apply state"
    assert int(optimized["numRemovedFiles"]) >= 2
    assert int(optimized["numDeletionVectorsRemoved"]) >= 1
    assert detail() == 1, "a table below the target size is one file, without vectors"
    assert content(spark, path, version=2) == content(spark, path, version=3) == expected
    assert recover_state(spark, path, f"public.{unique_name}") == merged.state

    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
        "('delta.deletedFileRetentionDuration' = 'interval 0 hours')"
    )  # version 4
    # Batches 2 and 3 (versions 5 and 6): 6 is a turn for both compaction and vacuum.
    apply_batch(records.batch(spark, 0x300, dict.fromkeys(range(1, 40, 4), "c")), 2, ctx)
    expected |= dict.fromkeys(range(1, 40, 4), "c") | dict.fromkeys(range(2, 50, 4), "d")
    last_batch = records.batch(spark, 0x400, dict.fromkeys(range(2, 50, 4), "d"))
    last = apply_batch(last_batch, 3, ctx).applied[0]
    assert (last.committed, last.version) == (True, 6)
    assert [(v, op) for v, op, _, meta in commits(spark, path, since=6) if meta is None] == [
        (7, "OPTIMIZE"),
        (8, "VACUUM START"),
        (9, "VACUUM END"),
    ]
    # Every file the compactions replaced is gone from disk; what is left reads whole.
    assert files_on_disk(path) == (detail(), 0) == (1, 0)
    assert content(spark, path) == expected
    state = recover_state(spark, path, f"public.{unique_name}")
    assert state == last.state
    assert state is not None
    assert state.batch_id == 3

    # A replay after upkeep commits nothing, and Delta still knows the query's
    # transaction version (an append under it is skipped): upkeep kept both guards of
    # exactly-once.
    replay = apply_batch(last_batch, 3, ctx).applied[0]
    assert (replay.committed, replay.version, replay.state) == (False, 9, last.state)
    (
        spark.read.format("delta")
        .load(path)
        .limit(1)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", ctx.txn_app_id)
        .option("txnVersion", "3")
        .save(path)
    )
    assert commits(spark, path, since=10) == []
    assert content(spark, path) == expected

    done = metrics.registry.get_sample_value
    table = f"public.{unique_name}"
    for operation, runs in (("compact", 2), ("vacuum", 1)):
        labels = {"table": table, "operation": operation, "outcome": "done"}
        assert done("cdc_apply_upkeep_runs_total", labels) == runs


def test_a_vacuum_lite_refused_for_a_cleaned_log_lists_every_file(
    spark: Any, tmp_path: Path
) -> None:
    """VACUUM LITE finds the files to delete in the commits since the previous vacuum;
    when the log no longer holds them (expired commits cleaned, here by delta-rs behind
    its checkpoint), Delta refuses it, and upkeep lists every file instead."""
    import pyarrow as pa  # type: ignore[import-untyped]  # noqa: PLC0415
    from deltalake import write_deltalake  # noqa: PLC0415

    path = str(tmp_path / "cleaned")
    rows = pa.table({"id": pa.array([1], pa.int64())})
    write_deltalake(
        path,
        rows,
        configuration={
            "delta.logRetentionDuration": "interval 1 second",
            "delta.deletedFileRetentionDuration": "interval 0 seconds",
            "delta.checkpointInterval": "2",
        },
    )
    # Each overwrite removes the files before it: files a vacuum may delete.
    for _ in range(3):
        write_deltalake(path, rows, mode="overwrite")
    time.sleep(1.5)  # the first commits' retention passes; the next checkpoint cleans them
    for _ in range(3):
        write_deltalake(path, rows, mode="overwrite")
    assert not Path(path, "_delta_log", "00000000000000000000.json").exists()
    with TABLE_LOCKS.held(path):
        outcome = vacuum(spark, path)
    assert outcome.startswith("listed every file")
    data_files = [p for p in Path(path).iterdir() if p.suffix == ".parquet"]
    assert len(data_files) == 1, "every removed file is deleted, the live one kept"
