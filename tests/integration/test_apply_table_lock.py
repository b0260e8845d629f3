"""Two writers racing on one table lose nothing (apply.lake.table_lock).

The driver MERGEs with delta-rs while Spark commits to the same table (appends, and
apply's own OPTIMIZE): on a local file system Delta's Spark writer checks that the next
commit file is absent and then renames over it, so without the table lock a delta-rs
commit landing in between is silently replaced. Both writers here take the table's lock
as the job does; every commit of both must be in the table's log, in one version each,
and every row either wrote must be in the table.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql.types import LongType, StringType

from apply.lake.delta_log import commit_file, parse_commit
from apply.lake.delta_schema import ColumnPlan, ColumnSpec, ensure_table, table_schema
from apply.lake.driver_merge import merge_rows, source_rows
from apply.lake.driver_plan import DecodedChange
from apply.lake.positions import Position
from apply.lake.table_lock import TABLE_LOCKS
from apply.lake.tables import TableId
from apply.lake.upkeep import compact
from schemas.lsn import Lsn

pytestmark = pytest.mark.slow

COLUMNS = (ColumnSpec("id", LongType(), key=True), ColumnSpec("Note", StringType()))
ROUNDS = 8
DRIVER_KEYS = 1_000
SPARK_KEYS = 2_000


def test_a_driver_merge_and_spark_commits_racing_on_one_table_lose_nothing(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "public" / "raced")
    plan = ColumnPlan(columns=COLUMNS, added=(), key_columns=("id",), create=True)
    with TABLE_LOCKS.held(path):
        ensure_table(spark, path, TableId("public", "raced"), plan, None)
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def driver() -> None:
        start.wait()
        for i in range(ROUNDS):
            change = DecodedChange(
                0, i, "INSERT", Position(Lsn(100 + i), 0), 0, (), (DRIVER_KEYS + i, f"d{i}")
            )
            with TABLE_LOCKS.held(path):
                merge_rows(
                    DeltaTable(path),
                    source_rows([change], COLUMNS),
                    path=path,
                    name="public.raced",
                    columns=COLUMNS,
                    key_columns=("id",),
                    app_id="driver",
                    batch_id=i,
                    metadata=f'{{"round": {i}}}',
                )

    def jvm() -> None:
        start.wait()
        for i in range(ROUNDS):
            row = (SPARK_KEYS + i, f"s{i}", 100 + i, 1, None)
            with TABLE_LOCKS.held(path):
                spark.createDataFrame([row], table_schema(COLUMNS)).write.format("delta").mode(
                    "append"
                ).save(path)
                if i % 4 == 3:
                    compact(spark, path, 128)

    def run(writer: Any) -> None:
        try:
            writer()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in (driver, jvm)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not failures, failures

    newest = DeltaTable(path).version()
    commits = [
        parse_commit(v, Path(commit_file(path, v)).read_text()) for v in range(1, newest + 1)
    ]
    driver_rounds = sorted(i for c in commits for i in range(ROUNDS) if c.written_by("driver", i))
    assert driver_rounds == list(range(ROUNDS)), "a driver commit was replaced"
    operations = [c.operation for c in commits]
    assert operations.count("MERGE") == ROUNDS
    assert operations.count("WRITE") == ROUNDS, "a Spark commit was replaced"
    writers = [op for op in operations if op in {"MERGE", "WRITE"}]
    turns = sum(1 for a, b in itertools.pairwise(writers) if a != b)
    assert turns >= 3, f"the writers did not race, they took turns {turns} times: {writers}"
    keys = sorted(row["id"] for row in spark.read.format("delta").load(path).collect())
    assert keys == [DRIVER_KEYS + i for i in range(ROUNDS)] + [
        SPARK_KEYS + i for i in range(ROUNDS)
    ]
