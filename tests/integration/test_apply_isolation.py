"""Errored tables, the dead-letter table, ``reapply`` and concurrent tables, against a real
Kafka broker and Delta tables on disk.

Batches are built as in ``test_apply_batch.py`` (``tests/plugins/change_topics.py``). A
crash between the Delta commits and Spark's checkpoint is simulated by applying the same
offsets again, under the same batch id and under a later one (the checkpoint's offsets
were lost); an interrupted ``reapply`` by running its first step alone.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from apply.app import ApplyJob
from apply.batch import ApplyContext, apply_batch
from apply.batch.table_pool import table_session
from apply.control.progress import BatchResult, batch_progress
from apply.errors import SchemaChangeError
from apply.lake.dead_letter import errored_tables
from apply.lake.spark_merge import commit_settings
from apply.lake.tables import TableId, table_path
from apply.reapply import apply_parked, reapply_app_id, reapply_table
from apply.settings import ApplySettings, KafkaSettings, LakeSettings
from schemas import column_type as ct
from schemas.change_record import ChangeEncoder, Column, TableDescription, build_table_schemas
from schemas.control import AppliedProgress, ApplyTableStatus, decode_control
from schemas.lsn import Lsn
from schemas.schema_topic import TABLE_KEY_SCHEMA_MESSAGE, table_schema_messages
from schemas.single_object import format_fingerprint
from tests.plugins.change_topics import (
    INSERT,
    UPDATE,
    ChangeTopic,
    change,
    context,
    dead_letter_rows,
    rows,
    versions,
)
from tests.plugins.services import Services
from tests.plugins.topics import consume_all

pytestmark = pytest.mark.slow


def newest_txn(path: str, version: int) -> list[dict[str, Any]]:
    """The ``txn`` actions (Delta transaction ids) of one commit of the table at ``path``."""
    log = Path(path, "_delta_log", f"{version:020d}.json").read_text()
    return [json.loads(line)["txn"] for line in log.split("\n") if '"txn"' in line]


def progress(result: BatchResult) -> dict[tuple[str, int], tuple[Any, ...]]:
    def fields(m: AppliedProgress) -> tuple[Any, ...]:
        return (m.table, m.next_offset, m.commit_lsn, m.ordinal, m.table_lsn)

    return {(m.topic, m.partition): fields(m) for m in batch_progress(result)}


def test_errored_table_is_parked_while_the_others_apply_then_reapplied(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    key = Column("id", ct.LONG, nullable=False, key=True)
    broken, healthy = f"{unique_name}_b", f"{unique_name}_h"
    # The source retypes amount from bigint to text: the lake cannot follow by itself.
    v1 = build_table_schemas(TableDescription("public", broken, (key, Column("amount", ct.LONG))))
    v2 = build_table_schemas(TableDescription("public", broken, (key, Column("amount", ct.STRING))))
    other = build_table_schemas(
        TableDescription("public", healthy, (key, Column("note", ct.STRING)))
    )
    enc1, enc2, enc_h = ChangeEncoder(v1), ChangeEncoder(v2), ChangeEncoder(other)
    ctx = context(tmp_path, v1, v2, other)
    b_path = table_path(ctx.lake_root, TableId("public", broken))
    h_path = table_path(ctx.lake_root, TableId("public", healthy))
    b_topic, h_topic = ChangeTopic(services, broken, 1), ChangeTopic(services, healthy, 1)
    b_name, h_name = f"public.{broken}", f"public.{healthy}"

    def batch(start: tuple[dict[int, int], dict[int, int]], end: tuple[Any, Any]) -> Any:
        return b_topic.batch(spark, start[0], end[0]).unionByName(
            h_topic.batch(spark, start[1], end[1])
        )

    def mark() -> tuple[dict[int, int], dict[int, int]]:
        return b_topic.mark(), h_topic.mark()

    start = mark()
    b_topic.send(enc1, 0, change(INSERT, 0x100, 0, after={"id": 1, "amount": 10}))
    b_topic.send(enc1, 0, change(INSERT, 0x100, 1, after={"id": 2, "amount": 20}))
    h_topic.send(enc_h, 0, change(INSERT, 0x100, 2, after={"id": 1, "note": "one"}))
    first = mark()
    assert [r.table for r in apply_batch(batch(start, first), 0, ctx).applied] == [b_name, h_name]

    # Batch 1: the broken table's changes carry the retyped column.
    b_topic.send(enc2, 0, change(UPDATE, 0x200, 0, after={"id": 1, "amount": "ten"}))
    b_topic.send(enc2, 0, change(INSERT, 0x200, 1, after={"id": 3, "amount": "30"}))
    h_topic.send(enc_h, 0, change(INSERT, 0x200, 2, after={"id": 2, "note": "two"}))
    second = mark()
    b_version = versions(spark, b_path)[0]

    result = apply_batch(batch(first, second), 1, ctx)

    (applied,) = result.applied
    (parked,) = result.parked
    assert (applied.table, applied.committed, applied.rows_inserted) == (h_name, True, 1)
    assert (parked.table, parked.error_kind, parked.newly_errored) == (
        b_name,
        "SchemaChangeError",
        True,
    )
    assert "column amount changed type from bigint to string" in parked.error
    assert (parked.records, parked.parked) == (2, 2)
    assert rows(spark, h_path, "note") == {1: ("one",), 2: ("two",)}
    assert rows(spark, b_path, "amount") == {1: (10,), 2: (20,)}
    assert versions(spark, b_path) == [b_version]
    assert set(errored_tables(spark, ctx.dead_letter)) == {b_name}
    # The rule: offsets go past parked records (they are safe in the dead-letter table),
    # positions stay those of the lake table.
    assert progress(result) == {
        (h_topic.name, 0): (h_name, second[1][0], Lsn(0x200), 2, Lsn(0x200)),
        (b_topic.name, 0): (b_name, second[0][0], Lsn(0x100), 1, Lsn(0x100)),
    }
    parked_rows = dead_letter_rows(spark, ctx)
    fingerprint = format_fingerprint(v2.value_fingerprint)
    assert parked_rows == [
        (b_name, 0, first[0][0], fingerprint, 0x200, 0, 1, None),
        (b_name, 0, first[0][0] + 1, fingerprint, 0x200, 1, 1, None),
    ]

    # A crash after the commits, before Spark's checkpoint: the batch runs again under
    # its id, then its records come again under a later id (the checkpoint's offsets
    # were lost). Neither changes any table, the dead-letter table included.
    before = versions(spark, b_path, h_path, ctx.dead_letter)
    lake = (rows(spark, b_path, "amount"), rows(spark, h_path, "note"))
    for batch_id in (1, 2):
        again = apply_batch(batch(first, second), batch_id, ctx)
        assert [(r.table, r.committed) for r in again.applied] == [(h_name, False)]
        assert [(p.table, p.parked, p.newly_errored) for p in again.parked] == [(b_name, 0, False)]
        assert progress(again) == progress(result)
        assert versions(spark, b_path, h_path, ctx.dead_letter) == before
        assert (rows(spark, b_path, "amount"), rows(spark, h_path, "note")) == lake
        assert dead_letter_rows(spark, ctx) == parked_rows

    # Batch 3: the errored table stays parked, records behind the first failure.
    b_topic.send(enc2, 0, change(INSERT, 0x300, 0, after={"id": 4, "amount": "40"}))
    h_topic.send(enc_h, 0, change(INSERT, 0x300, 1, after={"id": 3, "note": "three"}))
    third = mark()
    later = apply_batch(batch(second, third), 3, ctx)
    assert [r.table for r in later.applied] == [h_name]
    assert [(p.table, p.parked, p.newly_errored) for p in later.parked] == [(b_name, 1, False)]
    assert later.parked[0].error == parked.error
    assert progress(later)[(b_topic.name, 0)] == (b_name, third[0][0], 0x100, 1, 0x100)

    # The cause is not fixed yet: reapply fails the same way and releases nothing.
    reapply_ctx = ApplyContext(
        ctx.lake_root, reapply_app_id(ctx.txn_app_id), ctx.writer_schemas, parallelism=1
    )
    with pytest.raises(SchemaChangeError, match="column amount changed type"):
        reapply_table(spark, b_name, reapply_ctx)
    assert errored_tables(spark, ctx.dead_letter)[b_name].records == 3

    # The operator retypes the lake column, keeping the rows and the table's history.
    from pyspark.sql import functions as sf  # noqa: PLC0415

    (
        spark.read.format("delta")
        .load(b_path)
        .withColumn("amount", sf.col("amount").cast("string"))
        .write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .save(b_path)
    )
    # reapply dies after its MERGE, before releasing the records.
    interrupted = apply_parked(spark, b_name, reapply_ctx)
    assert interrupted is not None
    assert (interrupted.records, interrupted.up_to_batch) == (3, 3)
    assert rows(spark, b_path, "amount") == {1: ("ten",), 2: ("20",), 3: ("30",), 4: ("40",)}
    assert b_name in errored_tables(spark, ctx.dead_letter)
    b_version = versions(spark, b_path)[0]

    outcome = reapply_table(spark, b_name, reapply_ctx)

    assert [(p.records, [r.committed for r in p.results]) for p in outcome.passes] == [(3, [False])]
    assert outcome.still_waiting == 0
    assert versions(spark, b_path) == [b_version], "the re-run commits nothing to the table"
    assert errored_tables(spark, ctx.dead_letter) == {}
    assert {r[-1] for r in dead_letter_rows(spark, ctx)} == {b_version}
    state = outcome.passes[0].results[0].state
    assert state.partitions[(b_topic.name, 0)].next_offset == third[0][0]
    assert (state.table_lsn, state.batch_id) == (0x300, 3)
    # Nothing waits any more: running it again does nothing.
    assert reapply_table(spark, b_name, reapply_ctx).passes == ()
    assert versions(spark, b_path) == [b_version]

    # Released, the table is applied like any other again.
    b_topic.send(enc2, 0, change(UPDATE, 0x400, 0, after={"id": 2, "amount": "twenty"}))
    fourth = mark()
    resumed = apply_batch(batch(third, fourth), 4, ctx)
    assert [(r.table, r.committed) for r in resumed.applied] == [(b_name, True)]
    assert resumed.parked == ()
    assert rows(spark, b_path, "amount")[2] == ("twenty",)


def test_a_lost_writer_schema_parks_only_its_table_until_the_schema_is_back(
    spark: Any,
    services: Services,
    unique_name: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Through :class:`ApplyJob`, as ``python -m apply`` runs it: the schema topic is read
    again once, then the table whose schema is still missing is parked alone; ``errored``
    lists it, and ``reapply`` applies it once the schema is published again (a capture
    restart does that) and tells capture on the control topic."""
    key = Column("id", ct.LONG, nullable=False, key=True)
    lost, healthy = f"{unique_name}_l", f"{unique_name}_h"
    lost_schemas = build_table_schemas(
        TableDescription("public", lost, (key, Column("note", ct.STRING)))
    )
    healthy_schemas = build_table_schemas(TableDescription("public", healthy, (key,)))
    bootstrap = services.kafka_bootstrap_servers
    settings = ApplySettings(
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap,
            topic_prefix="cdc",
            schema_topic=f"cdc_{unique_name}._schemas",
            control_topic=f"cdc_{unique_name}._control",
        ),
        lake=LakeSettings(root=str(tmp_path / "lake"), checkpoint_root=str(tmp_path / "cp")),
    )
    compacted = {"cleanup.policy": "compact"}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics(
        [
            NewTopic(settings.kafka.schema_topic, 1, 1, config=compacted),
            NewTopic(settings.kafka.control_topic, 1, 1, config=compacted),
        ]
    )
    for future in created.values():
        future.result(30)
    schema_producer = Producer({"bootstrap.servers": bootstrap})

    def publish_schemas(schemas: Any) -> None:
        for message in (TABLE_KEY_SCHEMA_MESSAGE, *table_schema_messages(schemas)):
            schema_producer.produce(settings.kafka.schema_topic, message.value, message.key)
        assert schema_producer.flush(30) == 0

    publish_schemas(healthy_schemas)  # the lost table's schema never reached the topic
    l_topic, h_topic = ChangeTopic(services, lost, 1), ChangeTopic(services, healthy, 1)
    l_start, h_start = l_topic.mark(), h_topic.mark()
    l_topic.send(
        ChangeEncoder(lost_schemas), 0, change(INSERT, 0x100, 0, after={"id": 1, "note": "a"})
    )
    h_topic.send(ChangeEncoder(healthy_schemas), 0, change(INSERT, 0x100, 1, after={"id": 7}))
    l_end, h_end = l_topic.mark(), h_topic.mark()
    batch = l_topic.batch(spark, l_start, l_end).unionByName(h_topic.batch(spark, h_start, h_end))
    job = ApplyJob(settings, spark)
    request.addfinalizer(job.close)
    l_name, h_name = f"public.{lost}", f"public.{healthy}"

    result = job.apply(batch, 0)

    assert [(r.table, r.committed) for r in result.applied] == [(h_name, True)]
    (parked,) = result.parked
    assert (parked.table, parked.error_kind, parked.parked) == (l_name, "MissingSchemaError", 1)
    assert format_fingerprint(lost_schemas.value_fingerprint) in parked.error
    assert f"python -m apply reapply {l_name}" in parked.error
    assert [(t.table, t.records) for t in job.errored()] == [(l_name, 1)]
    h_path = table_path(settings.lake.root, TableId("public", healthy))
    l_path = table_path(settings.lake.root, TableId("public", lost))
    assert rows(spark, h_path) == {7: ()}
    assert not Path(l_path).exists()

    publish_schemas(lost_schemas)
    outcome = job.reapply(l_name)

    assert outcome.still_waiting == 0
    assert job.errored() == []
    assert rows(spark, l_path, "note") == {1: ("a",)}
    # Capture hears of both tables: the parked offset at once, the lake position after
    # the reapply; the newest message per partition is what counts (compacted topic).
    # 3 progress messages, and the lost table's apply status after parking and reapply.
    newest: dict[tuple[str, int], AppliedProgress] = {}
    statuses: list[ApplyTableStatus] = []
    for message in consume_all(bootstrap, [settings.kafka.control_topic], expected=5):
        decoded = decode_control(message.key(), message.value())
        if isinstance(decoded, AppliedProgress):
            newest[(decoded.topic, decoded.partition)] = decoded
        elif isinstance(decoded, ApplyTableStatus):
            statuses.append(decoded)
    assert [(s.table, s.errored, s.parked) for s in statuses] == [
        (l_name, True, 1),
        (l_name, False, 0),
    ]
    assert {tp: (m.next_offset, m.commit_lsn, m.ordinal) for tp, m in newest.items()} == {
        (h_topic.name, 0): (h_end[0], Lsn(0x100), 1),
        (l_topic.name, 0): (l_end[0], Lsn(0x100), 0),
    }


def test_tables_of_a_batch_commit_concurrently_each_with_its_own_transaction(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    key = Column("id", ct.LONG, nullable=False, key=True)
    names = [f"{unique_name}_{index}" for index in range(4)]
    schemas = [build_table_schemas(TableDescription("public", n, (key,))) for n in names]
    ctx = context(tmp_path, *schemas)
    topics = [ChangeTopic(services, name, 1) for name in names]
    starts = [topic.mark() for topic in topics]
    for index, (topic, table_schemas) in enumerate(zip(topics, schemas, strict=True)):
        topic.send(
            ChangeEncoder(table_schemas),
            0,
            *[change(INSERT, 0x100 + index, i, after={"id": i}) for i in range(index + 1)],
        )
    ends = [topic.mark() for topic in topics]
    frames = [t.batch(spark, s, e) for t, s, e in zip(topics, starts, ends, strict=True)]
    batch = frames[0]
    for frame in frames[1:]:
        batch = batch.unionByName(frame)

    result = apply_batch(batch, 7, ctx)

    assert [r.table for r in result.applied] == [f"public.{n}" for n in sorted(names)]
    for name in names:
        path = table_path(ctx.lake_root, TableId("public", name))
        (applied,) = [r for r in result.applied if r.table == f"public.{name}"]
        # Each commit carries its own table's state and the batch's transaction id: no
        # other thread's session settings leaked into it.
        metadata = json.loads(
            spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").head()["userMetadata"]
        )
        assert metadata["table"] == f"public.{name}"
        assert metadata["partitions"][f"{applied.topic}/0"]["next_offset"] == applied.records
        assert [(t["appId"], t["version"]) for t in newest_txn(path, applied.version)] == [
            (ctx.txn_app_id, 7)
        ]
        assert sorted(rows(spark, path)) == list(range(names.index(name) + 1))


def test_table_sessions_hold_commit_settings_side_by_side(spark: Any, tmp_path: Path) -> None:
    """Two threads inside ``commit_settings`` at the same moment (a barrier holds both
    there), each writing its own table: each commit records its own settings."""
    barrier = threading.Barrier(2, timeout=120)
    paths = [str(tmp_path / f"t{index}") for index in range(2)]
    for path in paths:
        spark.range(0).write.format("delta").save(path)

    def write(index: int) -> None:
        session = table_session(spark)
        with commit_settings(session, f"app-{index}", 10 + index, f"meta-{index}"):
            barrier.wait()
            session.range(3).write.format("delta").mode("append").save(paths[index])
            barrier.wait()

    threads = [threading.Thread(target=write, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    for index, path in enumerate(paths):
        newest = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").head()
        assert newest["userMetadata"] == f"meta-{index}"
        (txn,) = newest_txn(path, int(newest["version"]))
        assert (txn["appId"], txn["version"]) == (f"app-{index}", 10 + index)
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None
