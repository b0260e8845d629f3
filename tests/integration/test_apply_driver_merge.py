"""The driver's MERGE against Spark's it stands in for (apply.lake.driver_plan,
apply.lake.driver_merge). The same batches of every column type, from a real Kafka topic,
applied to a lake of each path; the tables, the applied states and the results must be
equal column by column, and the driver's commits must really be delta-rs's.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from apply.batch import ApplyContext, apply_batch, recorded_state
from apply.lake.decode import RECORD_COLUMNS, survey, survey_held
from apply.lake.delta_log import commit_file
from apply.lake.driver_merge import DriverTables
from apply.lake.history import recover_state
from apply.lake.known_tables import KnownTables
from apply.lake.tables import TableId, table_path
from schemas.change_record import ChangeEncoder, TableDescription, build_table_schemas
from tests.plugins.change_topics import (
    DELETE,
    INSERT,
    TRUNCATE,
    UPDATE,
    ChangeTopic,
    change,
    context,
)
from tests.plugins.column_types import EVERY_TYPE, EVERY_VALUE, EXTREMES
from tests.plugins.services import Services

pytestmark = pytest.mark.slow

NOTE = ("_pg_Order_20Note",)
"""The text column an UPDATE may leave unchanged (TOAST), by its Avro name."""

# Every column as exact text, so that no value is converted on the way to Python.
EXACT = [
    "id",
    "string(flag)",
    "string(small)",
    "string(ratio)",
    "string(score)",
    "hex(blob)",
    "_pg_Order_20Note",
    "string(amount)",
    "string(wide)",
    "string(unix_date(day))",
    "string(clock)",
    "string(unix_micros(at))",
    "string(unix_micros(cast(local as timestamp)))",
    "ref",
    "to_json(tags)",
    "to_json(grid)",
    "_cdc_commit_lsn",
    "_cdc_ordinal",
    "string(unix_micros(_cdc_commit_ts))",
]


def exact_rows(spark: Any, path: str, *extra: str) -> list[tuple[Any, ...]]:
    frame = spark.read.format("delta").load(path)
    found = [tuple(row) for row in frame.selectExpr(*EXACT, *extra).collect()]
    return sorted(found, key=lambda row: [(value is None, str(value)) for value in row])


def written_by_delta_rs(path: str, version: int) -> bool:
    info = next(
        json.loads(line)["commitInfo"]
        for line in Path(commit_file(path, version)).read_text().split("\n")
        if "commitInfo" in line
    )
    return "delta-rs" in json.dumps(info)


def test_the_driver_merges_what_spark_merges(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    """The same batches MERGEd by Spark alone
    and by the driver where it can (apply.lake.driver_merge); tables, states and results
    equal. (That the driver leaves a table with deletion vectors to Spark is
    tests/unit/apply/test_driver_merge.py's.)"""
    schemas = build_table_schemas(TableDescription("public", unique_name, EVERY_TYPE))
    enc = ChangeEncoder(schemas)
    table = TableId("public", unique_name)
    topic = ChangeTopic(services, unique_name, 2)
    base = context(tmp_path, schemas)

    def lake(name: str, records: int) -> ApplyContext:
        return dataclasses.replace(
            base,
            lake_root=str(tmp_path / name),
            known=KnownTables(),
            driver_tables=DriverTables(),
            driver_write_records=records,
        )

    by_spark, driver = lake("spark", 0), lake("driver", 10_000)
    batches = [
        # The first batch creates the table: the driver with delta-rs, as Spark does
        # (then MERGEs into it); from the second on the job knows it.
        [
            (0, change(INSERT, 0x100, 0, after={"id": 1, **EVERY_VALUE})),
            (1, change(INSERT, 0x100, 1, after={"id": 2})),
            (1, change(INSERT, 0x100, 2, after={"id": 6, "small": 6})),
        ],
        [(0, change(INSERT, 0x200, 0, after={"id": 3, **EVERY_VALUE}))],
        [
            (1, change(UPDATE, 0x300, 0, after={"id": 2, **EVERY_VALUE, "small": 8})),
            (1, change(INSERT, 0x300, 2, after={"id": 5, "small": 1})),
            (1, change(UPDATE, 0x300, 3, after={"id": 5, "small": 2})),
            (0, change(DELETE, 0x250, 0, before={"id": 3}, before_key_only=True)),
            (0, change(DELETE, 0x250, 1, before={"id": 77}, before_key_only=True)),
        ],
        # Older than the rows they touch, on a partition not yet past them: the position
        # guard keeps the rows (an update and a delete).
        [
            (0, change(UPDATE, 0x280, 0, after={"id": 2, "small": -1})),
            (0, change(DELETE, 0x280, 1, before={"id": 5}, before_key_only=True)),
            (0, change(UPDATE, 0x380, 0, after={"id": 1, **EVERY_VALUE, "small": 9})),
        ],
        # delta-rs cannot compute statistics of infinite dates: Spark merges these.
        [(0, change(INSERT, 0x400, 0, after={"id": 4, **EXTREMES}))],
        [(1, change(DELETE, 0x500, 0, before={"id": 5}, before_key_only=True))],
        # A TRUNCATE is Spark's.
        [
            (1, change(INSERT, 0x600, 0, after={"id": 7})),
            (0, change(TRUNCATE, 0x600, 1)),
            (1, change(INSERT, 0x600, 2, after={"id": 8, **EVERY_VALUE})),
        ],
        [(1, change(UPDATE, 0x700, 0, after={"id": 8, "small": 3, NOTE[0]: "kept"}))],
        # Unchanged TOAST values: id 8 keeps the table's note; id 1 (not in the table
        # since the TRUNCATE) takes the note its first UPDATE of the batch carried.
        [
            (1, change(UPDATE, 0x750, 0, after={"id": 8, "small": 4}, unchanged_columns=NOTE)),
            (0, change(UPDATE, 0x750, 1, after={"id": 1, "small": 5, NOTE[0]: "carried"})),
            (0, change(UPDATE, 0x750, 2, after={"id": 1, "small": 6}, unchanged_columns=NOTE)),
        ],
    ]
    from_driver = {0, 1, 2, 3, 5, 7, 8}
    marks = [topic.mark()]
    for batch in batches:
        for partition, item in batch:
            topic.send(enc, partition, item)
        marks.append(topic.mark())

    for batch_id in range(len(batches)):
        records = topic.batch(spark, marks[batch_id], marks[batch_id + 1])
        held = records.select(*RECORD_COLUMNS).collect()
        assert survey_held(tuple(row) for row in held) == survey(records)
        expected = apply_batch(records, batch_id, by_spark).applied[0]
        got = apply_batch(records, batch_id, driver).applied[0]
        assert got.state == expected.state, f"batch {batch_id}"
        # Equal but for where the lake is (the states compared above).
        assert dataclasses.replace(got, path="", state=expected.state) == dataclasses.replace(
            expected, path=""
        ), f"batch {batch_id}"
        assert written_by_delta_rs(got.path, got.version) is (batch_id in from_driver)
        assert not written_by_delta_rs(expected.path, expected.version)
        assert exact_rows(spark, got.path) == exact_rows(spark, expected.path), f"batch {batch_id}"
    final = exact_rows(spark, table_path(driver.lake_root, table))
    assert sorted(row[0] for row in final) == [1, 8]
    assert [row[6] for row in final] == ["carried", "kept"]

    # Spark replays the last batch: the state covers it, nothing is written.
    last = topic.batch(spark, marks[-2], marks[-1])
    replayed = apply_batch(last, len(batches) - 1, driver).applied[0]
    assert replayed.committed is False
    # A restarted job (nothing known) reads the driver's commit back as its state.
    restarted = dataclasses.replace(driver, known=None, driver_tables=None)
    again = apply_batch(last, len(batches) - 1, restarted).applied[0]
    assert (again.committed, again.state) == (False, replayed.state)
    # So does one that reads the table in the driver (apply.lake.driver_merge.DriverTables.read).
    read_by_driver = dataclasses.replace(driver, known=KnownTables(), driver_tables=DriverTables())
    again = apply_batch(last, len(batches) - 1, read_by_driver).applied[0]
    assert (again.committed, again.state) == (False, replayed.state)
    # A job's start reads every table's state (apply.batch.read.recorded_state): by
    # delta-rs, what Spark reads, and remembered for the table's first batch; without the
    # driver's tables it is Spark's read.
    starting = dataclasses.replace(driver, known=KnownTables(), driver_tables=DriverTables())
    path = table_path(driver.lake_root, table)
    assert recover_state(spark, path, str(table)) == replayed.state
    assert recorded_state(spark, table, starting) == replayed.state
    assert starting.known is not None
    assert starting.known.current(spark, path) is not None
    assert recorded_state(spark, table, restarted) == replayed.state
