"""The apply job's micro-batch against a real Kafka broker and Delta tables on disk.

Records are made by the contract's own encoder, produced to a topic, and read back with
``spark.read.format("kafka")`` between explicit offsets: exactly the DataFrame
``foreachBatch`` hands over. A capture restart is simulated by producing the same
changes again (same positions, new offsets), a Spark replay by applying the same
offsets under the same batch id, a job restart by calling ``apply_batch`` again: it
keeps nothing in memory, so every call starts from what Delta recorded.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from apply.batch import ApplyContext, apply_batch
from apply.control.progress import applied_progress, batch_progress
from apply.errors import BadRecordError, ConfigError, UnknownSchemaError
from apply.lake.dead_letter import discard, errored_tables
from apply.lake.delta_schema import COMMIT_LSN_COLUMN, COMMIT_TS_COLUMN, ORDINAL_COLUMN
from apply.lake.history import TableHistory, read_history, recover_state
from apply.lake.known_tables import KnownTables
from apply.lake.positions import PartitionProgress, Position
from apply.lake.spark_merge import TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF
from apply.lake.tables import TableId, table_path
from apply.reapply import reapply_app_id, reapply_table
from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from schemas.column_type import ColumnType
from schemas.lsn import Lsn
from schemas.single_object import format_fingerprint, header
from tests.plugins.change_topics import (
    COMMIT_TS,
    DELETE,
    INSERT,
    TRUNCATE,
    UPDATE,
    ChangeTopic,
    change,
    context,
    dead_letter_rows,
    rows,
)
from tests.plugins.column_types import EVERY_TYPE, EVERY_VALUE, EXTREMES
from tests.plugins.services import Services

pytestmark = pytest.mark.slow


def test_changes_replays_and_restart(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable  # noqa: PLC0415 - pyspark only when Spark runs

    schemas = build_table_schemas(
        TableDescription(
            "public",
            unique_name,
            (
                Column("id", ct.LONG, nullable=False, key=True),
                Column("note", ct.STRING),
                Column("amount", ColumnType.decimal(12, 2)),
            ),
        )
    )
    enc = ChangeEncoder(schemas)
    ctx = context(tmp_path, schemas)
    path = table_path(ctx.lake_root, TableId("public", unique_name))
    # Keys live in partition id % 2; partition 2 is only used to break the contract below.
    topic = ChangeTopic(services, unique_name, 3)
    start = topic.mark()

    def row(id_: int, note: str | None, amount: str) -> dict[str, Any]:
        return {"id": id_, "note": note, "amount": Decimal(amount)}

    update_2 = change(UPDATE, 0x200, 0, after=row(2, None, "2.50"), unchanged_columns=("note",))
    delete_3 = change(DELETE, 0x200, 1, before={"id": 3}, before_key_only=True)
    insert_5 = change(INSERT, 0x300, 0, after=row(5, "five", "5.00"))
    update_5 = change(UPDATE, 0x300, 1, after=row(5, None, "5.50"), unchanged_columns=("note",))
    topic.send(enc, 1, change(INSERT, 0x100, 0, after=row(1, "n1", "1.00")))
    topic.send(enc, 0, change(INSERT, 0x100, 1, after=row(2, "n2", "2.00")))
    topic.send(enc, 1, change(INSERT, 0x100, 2, after=row(3, "n3", "3.00")))
    topic.send(enc, 0, change(INSERT, 0x100, 3, after=row(4, "n4", "4.00")))
    topic.send(enc, 0, update_2, update_2)  # a duplicate inside the batch
    topic.send(enc, 1, delete_3, insert_5, update_5)
    first = topic.mark()

    result = apply_batch(topic.batch(spark, start, first), 0, ctx)

    assert len(result.applied) == 1
    assert result.parked == ()
    applied = result.applied[0]
    assert (applied.table, applied.topic, applied.path) == (
        f"public.{unique_name}",
        topic.name,
        path,
    )
    assert applied.committed
    assert applied.table_created
    assert (applied.records, applied.tombstones, applied.replays) == (10, 1, 0)
    assert (applied.source_rows, applied.superseded) == (5, 4)
    assert (applied.rows_inserted, applied.rows_updated, applied.rows_deleted) == (4, 0, 0)
    # Unchanged TOAST: row 2 keeps the note of its INSERT from the same batch, and so
    # does row 5, updated right after its INSERT.
    assert rows(spark, path, "note", "amount", COMMIT_LSN_COLUMN, ORDINAL_COLUMN) == {
        1: ("n1", Decimal("1.00"), 0x100, 0),
        2: ("n2", Decimal("2.50"), 0x200, 0),
        4: ("n4", Decimal("4.00"), 0x100, 3),
        5: ("five", Decimal("5.50"), 0x300, 1),
    }
    assert applied.state.partitions == {
        (topic.name, 0): PartitionProgress(4, Position(Lsn(0x200), 0)),
        (topic.name, 1): PartitionProgress(6, Position(Lsn(0x300), 1)),
    }
    assert (applied.state.table_lsn, applied.state.commit_ts) == (0x300, COMMIT_TS + 0x300)
    for conf in (TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF):
        assert spark.conf.get(conf, None) is None, f"{conf} must not outlive the MERGE"

    # The capture restarts and publishes transactions 0x200 and 0x300 again; then new
    # changes arrive, among them an UPDATE of row 4 whose note is unchanged TOAST. A
    # stale UPDATE of row 2 on a partition with no history breaks the contract on
    # purpose: only the MERGE's position guard stands between it and row 2.
    topic.send(enc, 0, update_2)
    topic.send(enc, 1, delete_3, insert_5, update_5)
    topic.send(enc, 1, change(UPDATE, 0x400, 0, after=row(1, "n1b", "1.00")))
    topic.send(
        enc, 0, change(UPDATE, 0x400, 1, after=row(4, None, "4.40"), unchanged_columns=("note",))
    )
    topic.send(enc, 2, change(UPDATE, 0x150, 0, after=row(2, "stale", "0.00")))
    second = topic.mark()

    result = apply_batch(topic.batch(spark, first, second), 1, ctx)

    applied = result.applied[0]
    assert applied.committed
    assert (applied.records, applied.tombstones, applied.replays) == (8, 1, 4)
    assert (applied.source_rows, applied.superseded) == (3, 0)
    assert (applied.rows_inserted, applied.rows_updated, applied.rows_deleted) == (0, 2, 0)
    expected_rows = {
        1: ("n1b", Decimal("1.00"), 0x400, 0),
        2: ("n2", Decimal("2.50"), 0x200, 0),
        4: ("n4", Decimal("4.40"), 0x400, 1),
        5: ("five", Decimal("5.50"), 0x300, 1),
    }
    assert rows(spark, path, "note", "amount", COMMIT_LSN_COLUMN, ORDINAL_COLUMN) == expected_rows
    assert rows(spark, path, f"unix_micros({COMMIT_TS_COLUMN})")[1] == (COMMIT_TS + 0x400,)
    expected_state = applied.state
    assert expected_state.partitions == {
        (topic.name, 0): PartitionProgress(first[0] + 2, Position(Lsn(0x400), 1)),
        (topic.name, 1): PartitionProgress(first[1] + 5, Position(Lsn(0x400), 0)),
        (topic.name, 2): PartitionProgress(1, Position(Lsn(0x150), 0)),
    }
    assert [(m.partition, m.next_offset, m.commit_lsn) for m in applied_progress(applied)] == [
        (0, first[0] + 2, 0x400),
        (1, first[1] + 5, 0x400),
        (2, 1, 0x150),
    ]

    # Spark replays micro-batch 1 after a crash between the Delta commit and its
    # checkpoint: the table's state covers every offset of the batch, so nothing is
    # written, no new version.
    versions = DeltaTable.forPath(spark, path).history().count()
    replayed = apply_batch(topic.batch(spark, first, second), 1, ctx).applied[0]
    assert not replayed.committed
    assert replayed.version == applied.version
    assert replayed.state == expected_state
    assert DeltaTable.forPath(spark, path).history().count() == versions

    # A new job (nothing in memory) gets the same records under a new batch id, as after
    # a lost checkpoint: Delta's history alone tells it they are all applied. Nothing is
    # committed, and the progress it reports is the recorded one.
    restarted = apply_batch(topic.batch(spark, first, second), 2, ctx).applied[0]
    assert not restarted.committed
    assert restarted.version == applied.version
    assert (restarted.replays, restarted.source_rows) == (7, 0)
    assert restarted.state == expected_state
    assert applied_progress(restarted) == applied_progress(applied)
    assert rows(spark, path, "note", "amount", COMMIT_LSN_COLUMN, ORDINAL_COLUMN) == expected_rows
    assert recover_state(spark, path, f"public.{unique_name}") == expected_state
    assert DeltaTable.forPath(spark, path).history().count() == versions

    # Replays among new records: the records the state covers are dropped by the replay
    # filter, the new one commits, under the later batch id.
    topic.send(enc, 0, update_2)
    topic.send(enc, 1, change(UPDATE, 0x450, 0, after=row(1, "n1c", "1.00")))
    third = topic.mark()
    mixed = apply_batch(topic.batch(spark, second, third), 2, ctx).applied[0]
    assert mixed.committed
    assert (mixed.replays, mixed.source_rows, mixed.rows_updated) == (1, 1, 1)
    assert rows(spark, path, "note")[1] == ("n1c",)

    # Tombstones alone still move their partition's next offset, in a commit of their own.
    topic.raw(1, enc.encode_key(delete_3), None)
    fourth = topic.mark()
    tombstones = apply_batch(topic.batch(spark, third, fourth), 3, ctx).applied[0]
    assert tombstones.committed
    assert (tombstones.records, tombstones.tombstones, tombstones.source_rows) == (1, 1, 0)
    assert tombstones.state.partitions[(topic.name, 1)] == PartitionProgress(
        third[1] + 1, Position(Lsn(0x450), 0)
    )

    # A checkpoint reset in place restarts batch ids under the same txnAppId: Delta would
    # skip every batch up to the old id, so the job refuses instead of losing them,
    # whether the batch holds records applied before or new ones.
    with pytest.raises(ConfigError, match="use a new checkpoint location"):
        apply_batch(topic.batch(spark, third, fourth), 0, ctx)
    topic.send(enc, 0, change(UPDATE, 0x500, 0, after=row(2, "n2b", "2.00")))
    fifth = topic.mark()
    with pytest.raises(ConfigError, match="use a new checkpoint location"):
        apply_batch(topic.batch(spark, fourth, fifth), 1, ctx)
    assert rows(spark, path, "note")[2] == ("n2",)


def test_a_batch_takes_what_the_job_committed_until_another_commit_follows(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    """apply.lake.known_tables: after a MERGE the job keeps the table's version, state and
    columns, and the next batch uses them instead of asking Delta, until any other
    commit follows; both ways land the same rows and the same state as Delta holds."""
    schemas = build_table_schemas(
        TableDescription(
            "public",
            unique_name,
            (Column("id", ct.LONG, nullable=False, key=True), Column("note", ct.STRING)),
        )
    )
    enc = ChangeEncoder(schemas)
    known = KnownTables()
    ctx = dataclasses.replace(context(tmp_path, schemas), known=known)
    name = f"public.{unique_name}"
    path = table_path(ctx.lake_root, TableId("public", unique_name))
    topic = ChangeTopic(services, unique_name, 1)
    marks = [topic.mark()]

    def apply_next(batch_id: int, *changes: Change) -> Any:
        topic.send(enc, 0, *changes)
        marks.append(topic.mark())
        result = apply_batch(topic.batch(spark, marks[-2], marks[-1]), batch_id, ctx)
        return result.applied[0]

    created = apply_next(
        0,
        change(INSERT, 0x100, 0, after={"id": 1, "note": "n1"}),
        change(INSERT, 0x100, 1, after={"id": 2, "note": "n2"}),
    )
    assert created.table_created
    # Kept from the batch that created the table (its columns read once), so the next
    # batch can be written from the driver (apply.lake.driver_merge).
    first = known.current(spark, path)
    assert first is not None
    assert first.history == TableHistory(created.version, created.state)
    assert first.history == read_history(spark, path, name), "the entry is what Delta holds"

    updated = apply_next(1, change(UPDATE, 0x200, 0, after={"id": 1, "note": "n1b"}))
    kept = known.current(spark, path)
    assert kept is not None
    assert kept.history == TableHistory(updated.version, updated.state)
    assert kept.history == read_history(spark, path, name), "the entry is what Delta holds"

    # Spark replays batch 1: the kept state covers it, nothing is committed or read.
    replayed = apply_batch(topic.batch(spark, marks[-2], marks[-1]), 1, ctx).applied[0]
    assert (replayed.committed, replayed.version) == (False, updated.version)

    # Another commit follows (an operator's): the entry no longer holds.
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('owner.note' = 'ops')")
    assert known.current(spark, path) is None

    after_other = apply_next(2, change(UPDATE, 0x300, 0, after={"id": 2, "note": "n2b"}))
    assert (after_other.committed, after_other.version) == (True, updated.version + 2)
    # And once more from the kept entry: the MERGE's figures come from its commit file.
    from_kept = apply_next(
        3,
        change(DELETE, 0x400, 0, before={"id": 1}, before_key_only=True),
        change(INSERT, 0x400, 1, after={"id": 3, "note": "n3"}),
    )
    assert (from_kept.committed, from_kept.version) == (True, after_other.version + 1)
    assert (from_kept.rows_inserted, from_kept.rows_updated, from_kept.rows_deleted) == (1, 0, 1)
    assert rows(spark, path, "note") == {2: ("n2b",), 3: ("n3",)}
    assert read_history(spark, path, name) == TableHistory(from_kept.version, from_kept.state)
    kept = known.current(spark, path)
    assert kept is not None
    assert kept.history == TableHistory(from_kept.version, from_kept.state)


def test_truncate_and_added_columns(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    columns = (Column("id", ct.LONG, nullable=False, key=True), Column("note", ct.STRING))
    v1 = build_table_schemas(TableDescription("public", unique_name, columns))
    v2 = build_table_schemas(
        TableDescription(
            "public",
            unique_name,
            (
                *columns,
                Column("seen_at", ct.LOCAL_TIMESTAMP_MICROS),
                Column("tags", ColumnType.array(ct.STRING)),
            ),
        )
    )
    enc1, enc2 = ChangeEncoder(v1), ChangeEncoder(v2)
    ctx = context(tmp_path, v1, v2)
    path = table_path(ctx.lake_root, TableId("public", unique_name))
    topic = ChangeTopic(services, unique_name, 3)
    start = topic.mark()
    topic.send(enc1, 1, change(INSERT, 0x100, 0, after={"id": 1, "note": "one"}))
    topic.send(enc1, 0, change(INSERT, 0x100, 1, after={"id": 2, "note": "two"}))
    first = topic.mark()
    apply_batch(topic.batch(spark, start, first), 0, ctx)

    # TRUNCATE at (0x300, 0) in partition 1; the same transaction inserts row 3 after
    # it. Partition 0 still holds changes from before the TRUNCATE (0x200, 0x250),
    # then row 4 from after it.
    topic.send(enc1, 0, change(UPDATE, 0x200, 0, after={"id": 2, "note": "zwei"}))
    topic.send(enc1, 0, change(INSERT, 0x250, 0, after={"id": 5, "note": "late"}))
    topic.send(enc1, 1, change(TRUNCATE, 0x300, 0))
    topic.send(enc1, 1, change(INSERT, 0x300, 1, after={"id": 3, "note": "three"}))
    topic.send(enc1, 0, change(INSERT, 0x400, 0, after={"id": 4, "note": "four"}))
    second = topic.mark()

    truncated = apply_batch(topic.batch(spark, first, second), 1, ctx).applied[0]

    assert rows(spark, path, "note") == {3: ("three",), 4: ("four",)}
    assert truncated.truncates == 1
    assert (truncated.source_rows, truncated.superseded) == (2, 2)
    assert (truncated.rows_inserted, truncated.rows_deleted, truncated.rows_truncated) == (
        2,
        2,
        2,
    )
    assert truncated.state.truncated_at == Position(Lsn(0x300), 0)

    # One batch with two writer schemas: v2 adds two columns mid-batch. A change from
    # before the TRUNCATE arrives late on partition 2 and must stay erased.
    topic.send(enc1, 1, change(UPDATE, 0x500, 0, after={"id": 3, "note": "drei"}))
    topic.send(
        enc2,
        0,
        change(INSERT, 0x600, 0, after={"id": 6, "note": "six", "seen_at": 86_400_000_000}),
        change(UPDATE, 0x600, 1, after={"id": 4, "note": "vier", "tags": ["a", None]}),
    )
    topic.send(enc1, 2, change(INSERT, 0x280, 0, after={"id": 7, "note": "erased"}))
    third = topic.mark()

    evolved = apply_batch(topic.batch(spark, second, third), 2, ctx).applied[0]

    assert evolved.columns_added == ("seen_at", "tags")
    table = spark.read.format("delta").load(path)
    assert {f.name: f.dataType.simpleString() for f in table.schema.fields} == {
        "id": "bigint",
        "note": "string",
        "seen_at": "timestamp_ntz",
        "tags": "array<string>",
        COMMIT_LSN_COLUMN: "bigint",
        ORDINAL_COLUMN: "bigint",
        COMMIT_TS_COLUMN: "timestamp",
    }
    assert rows(spark, path, "note", "cast(seen_at as string)", "tags") == {
        3: ("drei", None, None),
        4: ("vier", None, ["a", None]),
        6: ("six", "1970-01-02 00:00:00", None),
    }
    assert evolved.superseded == 1  # row 7, changed before the TRUNCATE
    assert evolved.state.truncated_at == Position(Lsn(0x300), 0)


def test_every_column_type_lands_in_delta(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    schemas = build_table_schemas(TableDescription("public", unique_name, EVERY_TYPE))
    enc = ChangeEncoder(schemas)
    ctx = context(tmp_path, schemas)
    path = table_path(ctx.lake_root, TableId("public", unique_name))
    topic = ChangeTopic(services, unique_name, 1)
    start = topic.mark()
    full = {"id": 1, **EVERY_VALUE}
    # PostgreSQL's infinities and 24:00:00 land exactly.
    extremes = {"id": 2, **EXTREMES}
    topic.send(
        enc, 0, change(INSERT, 0x100, 0, after=full), change(INSERT, 0x100, 1, after=extremes)
    )
    end = topic.mark()

    apply_batch(topic.batch(spark, start, end), 0, ctx)

    table = spark.read.format("delta").load(path)
    assert {f.name: f.dataType.simpleString() for f in table.schema.fields} == {
        "id": "bigint",
        "flag": "boolean",
        "small": "int",
        "ratio": "float",
        "score": "double",
        "blob": "binary",
        "_pg_Order_20Note": "string",
        "amount": "decimal(12,2)",
        "wide": "decimal(38,10)",
        "day": "date",
        "clock": "bigint",
        "at": "timestamp",
        "local": "timestamp_ntz",
        "ref": "string",
        "tags": "array<string>",
        "grid": "array<array<int>>",
        COMMIT_LSN_COLUMN: "bigint",
        ORDINAL_COLUMN: "bigint",
        COMMIT_TS_COLUMN: "timestamp",
    }
    got = rows(
        spark,
        path,
        "flag",
        "small",
        "ratio",
        "score",
        "blob",
        "_pg_Order_20Note",
        "amount",
        "wide",
        "unix_date(day)",
        "clock",
        "unix_micros(at)",
        "unix_micros(cast(local as timestamp))",
        "ref",
        "tags",
        "grid",
    )
    assert got[1][:4] == (True, -7, 0.5, 2.25)
    assert bytes(got[1][4]) == b"\x00\xff"
    assert got[1][5:] == (
        EVERY_VALUE["_pg_Order_20Note"],
        Decimal("1234.50"),
        Decimal("-1234567890123456789012345678.0123456789"),
        19_782,
        37_815_123_456,
        1_715_941_815_123_456,
        1_715_941_815_123_456,
        "5f0c7a6e-7c3e-4c1e-9a39-2a4b2f0d2f11",
        ["a", None, ""],
        [[1, None], []],
    )
    assert got[2][8:12] == (
        ct.DATE_POSITIVE_INFINITY,
        86_400_000_000,
        ct.TIMESTAMP_NEGATIVE_INFINITY,
        ct.TIMESTAMP_POSITIVE_INFINITY,
    )


def test_undecodable_records_park_their_table(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    schemas = build_table_schemas(
        TableDescription("public", unique_name, (Column("id", ct.LONG, key=True),))
    )
    enc = ChangeEncoder(schemas)
    ctx = context(tmp_path, schemas)
    path = Path(table_path(ctx.lake_root, TableId("public", unique_name)))
    topic = ChangeTopic(services, unique_name, 1)
    start = topic.mark()
    topic.send(enc, 0, change(INSERT, 0x100, 0, after={"id": 1}))
    good = topic.mark()
    # An operation index beyond the enum, under the header of a known schema.
    topic.raw(0, b"k", header(schemas.value_fingerprint) + b"\x14")
    cut = topic.mark()
    topic.raw(0, b"k", b"not avro")
    end = topic.mark()

    unknown = context(tmp_path)  # no writer schemas loaded yet
    with pytest.raises(UnknownSchemaError, match=format_fingerprint(schemas.value_fingerprint)):
        apply_batch(topic.batch(spark, start, good), 0, unknown)
    assert not Path(ctx.dead_letter).exists(), "a transient failure parks nothing"

    malformed = apply_batch(topic.batch(spark, start, cut), 0, ctx)
    assert malformed.applied == ()
    (parked,) = malformed.parked
    assert (parked.error_kind, parked.newly_errored, parked.records, parked.parked) == (
        "BadRecordError",
        True,
        2,
        2,
    )
    assert f"{topic.name}/0 offset {good[0]} does not decode" in parked.error
    assert parked.next_offsets == {(topic.name, 0): cut[0]}
    assert parked.state is None
    # The table is errored now: the next batch parks its records without trying them,
    # and a record without header is parked as it is.
    headless = apply_batch(topic.batch(spark, cut, end), 1, ctx)
    (parked_again,) = headless.parked
    assert (parked_again.newly_errored, parked_again.parked) == (False, 1)
    assert parked_again.error == parked.error
    assert not path.exists()
    fingerprint = format_fingerprint(schemas.value_fingerprint)
    assert dead_letter_rows(spark, ctx) == [
        (f"public.{unique_name}", 0, 0, fingerprint, 0x100, 0, 0, None),
        (f"public.{unique_name}", 0, 1, fingerprint, None, None, 0, None),
        (f"public.{unique_name}", 0, 2, None, None, None, 1, None),
    ]
    assert {m.next_offset for m in batch_progress(headless)} == {end[0]}

    # The two bad records can never be applied: reapply fails on them until the operator
    # discards them, by the coordinates the error names; then the good one lands.
    name = f"public.{unique_name}"
    reapply_ctx = ApplyContext(
        ctx.lake_root, reapply_app_id(ctx.txn_app_id), ctx.writer_schemas, parallelism=1
    )
    with pytest.raises(BadRecordError, match=f"python -m apply discard {name} {topic.name}/0/"):
        reapply_table(spark, name, reapply_ctx)
    for offset in (cut[0] - 1, end[0] - 1):
        assert discard(spark, ctx.dead_letter, name, topic=topic.name, partition=0, offset=offset)
    # Nothing waits there any more: a second discard, or one of a record never parked,
    # finds nothing.
    assert not discard(spark, ctx.dead_letter, name, topic=topic.name, partition=0, offset=1)
    assert not discard(spark, ctx.dead_letter, name, topic=topic.name, partition=0, offset=99)

    outcome = reapply_table(spark, name, reapply_ctx)

    assert [p.records for p in outcome.passes] == [1]
    assert outcome.still_waiting == 0
    assert rows(spark, str(path)) == {1: ()}
    assert errored_tables(spark, ctx.dead_letter) == {}
    # The discarded records stay, marked, with their bytes; the good one is re-applied.
    marks = (
        spark.read.format("delta")
        .load(ctx.dead_letter)
        .selectExpr("offset", "discarded_at IS NOT NULL", "reapplied_at IS NOT NULL", "value")
        .collect()
    )
    assert sorted((r[0], r[1], r[2]) for r in marks) == [
        (0, False, True),
        (1, True, False),
        (2, True, False),
    ]
    assert {r[0]: bytes(r[3]) for r in marks}[2] == b"not avro"
