"""A resync mends a table whose schema change the lake could not follow, against a real
Kafka broker and Delta tables on disk (batches built as in ``test_apply_batch.py``,
with ``tests/plugins/change_topics.py``).

The source retypes ``v`` from bigint to text: the table is parked with both writer
schemas. The resync's TRUNCATE, positioned after every parked record, then supersedes
them: a micro-batch holding it replaces the lake table (new schema, the rows from the
TRUNCATE on, one commit) and releases the table by itself; ``reapply`` of parked records
that mix both schemas and hold the TRUNCATE does the same, with the lake table kept or
deleted.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from apply.batch import apply_batch
from apply.lake.dead_letter import ParkRequest, errored_tables, park
from apply.lake.delta_schema import parse_value_schema
from apply.lake.tables import TableId, table_path
from apply.reapply import reapply_app_id, reapply_table
from schemas import column_type as ct
from schemas.change_record import ChangeEncoder, Column, TableDescription, build_table_schemas
from schemas.operation import Operation
from tests.plugins.change_topics import (
    DELETE,
    INSERT,
    TRUNCATE,
    UPDATE,
    ChangeTopic,
    change,
    context,
    dead_letter_rows,
    rows,
    versions,
)
from tests.plugins.services import Services

pytestmark = pytest.mark.slow
READ = Operation.READ
KEY = Column("id", ct.LONG, nullable=False, key=True)


def _schemas(table: str) -> tuple[Any, Any]:
    v1 = build_table_schemas(TableDescription("public", table, (KEY, Column("v", ct.LONG))))
    v2 = build_table_schemas(TableDescription("public", table, (KEY, Column("v", ct.STRING))))
    return v1, v2


def _lake_types(spark: Any, path: str) -> dict[str, str]:
    schema = spark.read.format("delta").load(path).schema
    return {field.name: field.dataType.simpleString() for field in schema.fields}


def test_a_resync_truncate_replaces_the_table_and_releases_it(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    v1, v2 = _schemas(unique_name)
    enc1, enc2 = ChangeEncoder(v1), ChangeEncoder(v2)
    ctx = context(tmp_path, v1, v2)
    name = f"public.{unique_name}"
    path = table_path(ctx.lake_root, TableId("public", unique_name))
    topic = ChangeTopic(services, unique_name, 2)

    start = topic.mark()
    for i in (1, 2, 3):
        topic.send(enc1, i % 2, change(INSERT, 0x100, i, after={"id": i, "v": i}))
    first = topic.mark()
    apply_batch(topic.batch(spark, start, first), 0, ctx)

    # The retype reaches apply mid-batch: both schemas in it, the table is parked.
    topic.send(enc1, 1, change(UPDATE, 0x200, 0, after={"id": 1, "v": 11}))
    topic.send(enc2, 0, change(UPDATE, 0x300, 0, after={"id": 2, "v": "two"}))
    second = topic.mark()
    parked = apply_batch(topic.batch(spark, first, second), 1, ctx)
    assert [(p.table, p.error_kind, p.newly_errored) for p in parked.parked] == [
        (name, "SchemaChangeError", True)
    ]
    topic.send(enc2, 1, change(DELETE, 0x400, 0, before={"id": 3}))
    third = topic.mark()
    assert [p.table for p in apply_batch(topic.batch(spark, second, third), 2, ctx).parked] == [
        name
    ]
    assert errored_tables(spark, ctx.dead_letter)[name].records == 4  # the tombstone too

    # The resync: a TRUNCATE, the snapshot rows, then a change streamed after it. The
    # TRUNCATE sits in partition 0, the rows in both; a late change from before the
    # TRUNCATE (0x450) in partition 1 arrives in the same batch and is superseded too.
    topic.send(enc2, 0, change(TRUNCATE, 0x4FF, 0))
    topic.send(enc2, 1, change(UPDATE, 0x450, 0, after={"id": 1, "v": "stale"}))
    topic.send(enc2, 1, change(READ, 0x4FF, 1, after={"id": 1, "v": "11"}))
    topic.send(enc2, 0, change(READ, 0x4FF, 2, after={"id": 2, "v": "two"}))
    topic.send(enc2, 0, change(INSERT, 0x500, 0, after={"id": 4, "v": "four"}))
    fourth = topic.mark()

    result = apply_batch(topic.batch(spark, third, fourth), 3, ctx)

    assert result.parked == ()
    (applied,) = result.applied
    assert (applied.table, applied.committed) == (name, True)
    assert _lake_types(spark, path)["v"] == "string"
    assert rows(spark, path, "v") == {1: ("11",), 2: ("two",), 4: ("four",)}
    assert errored_tables(spark, ctx.dead_letter) == {}
    assert {r[-1] for r in dead_letter_rows(spark, ctx)} == {applied.version}
    assert applied.state.truncated_at is not None
    assert applied.state.partitions[(topic.name, 1)].next_offset == fourth[1]
    # One commit replaced schema and rows, with the state and the transaction id.
    (history,) = (
        spark.sql(f"DESCRIBE HISTORY delta.`{path}`")
        .where(f"version = {applied.version}")
        .select("operation", "userMetadata")
        .collect()
    )
    assert history["operation"] == "WRITE"
    assert '"batch_id":3' in history["userMetadata"]

    # Replayed (the checkpoint was lost): nothing changes.
    before = versions(spark, path, ctx.dead_letter)
    again = apply_batch(topic.batch(spark, third, fourth), 3, ctx)
    assert [(r.table, r.committed) for r in again.applied] == [(name, False)]
    assert versions(spark, path, ctx.dead_letter) == before

    # Streaming on in the new schema.
    topic.send(enc2, 1, change(UPDATE, 0x600, 0, after={"id": 1, "v": "eleven"}))
    fifth = topic.mark()
    apply_batch(topic.batch(spark, fourth, fifth), 4, ctx)
    assert rows(spark, path, "v") == {1: ("eleven",), 2: ("two",), 4: ("four",)}


@pytest.mark.parametrize("lake_table", ["kept", "deleted"])
def test_reapply_of_parked_records_mixing_both_schemas_and_the_resync(
    spark: Any, services: Services, unique_name: str, tmp_path: Path, lake_table: str
) -> None:
    v1, v2 = _schemas(unique_name)
    enc1, enc2 = ChangeEncoder(v1), ChangeEncoder(v2)
    ctx = context(tmp_path, v1, v2)
    name = f"public.{unique_name}"
    table = TableId("public", unique_name)
    path = table_path(ctx.lake_root, table)
    topic = ChangeTopic(services, unique_name, 1)

    start = topic.mark()
    topic.send(enc1, 0, *(change(INSERT, 0x100, i, after={"id": i, "v": i}) for i in (1, 2, 3)))
    first = topic.mark()
    apply_batch(topic.batch(spark, start, first), 0, ctx)

    # Parked as they were before apply released tables by itself: both writer schemas,
    # then the resync's TRUNCATE and rows, all waiting.
    topic.send(enc1, 0, change(UPDATE, 0x200, 0, after={"id": 1, "v": 11}))
    topic.send(enc2, 0, change(UPDATE, 0x300, 0, after={"id": 2, "v": "two"}))
    topic.send(enc2, 0, change(TRUNCATE, 0x3FF, 0))
    topic.send(enc2, 0, change(READ, 0x3FF, 1, after={"id": 1, "v": "11"}))
    topic.send(enc2, 0, change(READ, 0x3FF, 2, after={"id": 2, "v": "two"}))
    topic.send(enc2, 0, change(UPDATE, 0x400, 0, after={"id": 2, "v": "deux"}))
    second = topic.mark()
    schemas = [
        parse_value_schema(table, s.value_fingerprint, s.value_schema_json) for s in (v1, v2)
    ]
    request = ParkRequest(name, topic.name, "column v changed type", "SchemaChangeError", schemas)
    assert park(spark, ctx.dead_letter, topic.batch(spark, first, second), 1, [request]) == {
        name: 6
    }
    if lake_table == "deleted":
        shutil.rmtree(path)

    reapply_ctx = type(ctx)(ctx.lake_root, reapply_app_id(ctx.txn_app_id), ctx.writer_schemas)
    outcome = reapply_table(spark, name, reapply_ctx)

    assert outcome.still_waiting == 0
    assert errored_tables(spark, ctx.dead_letter) == {}
    assert _lake_types(spark, path)["v"] == "string"
    assert rows(spark, path, "v") == {1: ("11",), 2: ("deux",)}
    (result,) = outcome.passes[0].results
    assert result.state.partitions[(topic.name, 0)].next_offset == second[0]
