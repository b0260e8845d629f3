"""Planning a batch whose records a TRUNCATE superseded (apply.batch.superseded): pure."""

from __future__ import annotations

import pytest
from pyspark.sql.types import LongType, StringType

from apply.batch.superseded import Supersession, plan_table
from apply.errors import SchemaChangeError
from apply.lake.delta_schema import ColumnSpec, ExistingTable, ValueSchema, parse_value_schema
from apply.lake.positions import AppliedState, Position
from apply.lake.tables import TableId
from schemas import column_type as ct
from schemas.change_record import Column, TableDescription, build_table_schemas
from schemas.lsn import Lsn

TABLE = TableId("public", "t")
KEY = Column("id", ct.LONG, nullable=False, key=True)


def schema(*columns: Column, key: Column = KEY) -> ValueSchema:
    built = build_table_schemas(TableDescription("public", "t", (key, *columns)))
    return parse_value_schema(TABLE, built.value_fingerprint, built.value_schema_json)


V1 = schema(Column("v", ct.LONG))
V2 = schema(Column("v", ct.STRING))
V3 = schema(Column("v", ct.STRING), Column("extra", ct.LONG))
LAKE_V1 = ExistingTable(
    columns=(ColumnSpec("id", LongType(), key=True), ColumnSpec("v", LongType())),
    key_columns=("id",),
    has_timestamp_ntz=False,
)


def at(lsn: int, ordinal: int = 0) -> Position:
    return Position(Lsn(lsn), ordinal)


def state(truncated_at: Position | None) -> AppliedState:
    return AppliedState("public.t", {}, None, None, truncated_at, 0)


def test_without_a_truncate_a_retyped_column_stays_an_error() -> None:
    mixed = Supersession(truncate=None, newest={V1.fingerprint: at(1), V2.fingerprint: at(2)})
    with pytest.raises(SchemaChangeError, match="column v changed type"):
        plan_table(TABLE, LAKE_V1, [V1, V2], mixed, None)
    with pytest.raises(SchemaChangeError, match="column v changed type"):
        plan_table(TABLE, None, [V1, V2], mixed, None)


def test_records_before_the_batchs_truncate_do_not_take_part_in_planning() -> None:
    # The resync: old-schema records, then its TRUNCATE and rows in the new schema.
    resync = Supersession(truncate=at(5), newest={V1.fingerprint: at(2), V2.fingerprint: at(6)})

    replaced = plan_table(TABLE, LAKE_V1, [V1, V2], resync, None)
    assert replaced.replace
    assert replaced.superseded == {V1.fingerprint}
    assert [(c.name, c.data_type) for c in replaced.columns.columns] == [
        ("id", LongType()),
        ("v", StringType()),
    ]

    # The lake table was deleted: created from the surviving schema, nothing replaced.
    created = plan_table(TABLE, None, [V1, V2], resync, None)
    assert (created.replace, created.columns.create) == (False, True)
    assert created.superseded == {V1.fingerprint}
    assert created.columns.column("v").data_type == StringType()


def test_the_truncates_own_schema_survives_even_without_rows_after_it() -> None:
    only_truncate = Supersession(
        truncate=at(5), newest={V1.fingerprint: at(2), V2.fingerprint: at(5)}
    )
    plan = plan_table(TABLE, LAKE_V1, [V1, V2], only_truncate, None)
    assert plan.replace
    assert plan.columns.column("v").data_type == StringType()


def test_a_compatible_surviving_schema_evolves_the_table_without_replacing_it() -> None:
    evolve = Supersession(truncate=at(5), newest={V1.fingerprint: at(9)})
    plan = plan_table(TABLE, LAKE_V1, [V1], evolve, None)
    assert (plan.replace, plan.superseded, plan.columns.added) == (False, frozenset(), ())


def test_a_superseded_schema_adds_no_column() -> None:
    lake_v2 = ExistingTable(
        columns=(ColumnSpec("id", LongType(), key=True), ColumnSpec("v", StringType())),
        key_columns=("id",),
        has_timestamp_ntz=False,
    )
    truncated = Supersession(truncate=at(5), newest={V3.fingerprint: at(3), V2.fingerprint: at(7)})
    plan = plan_table(TABLE, lake_v2, [V3, V2], truncated, None)
    assert plan.columns.added == ()
    assert plan.superseded == {V3.fingerprint}


def test_a_truncate_applied_before_supersedes_but_does_not_replace() -> None:
    # Only records after the TRUNCATE in the lake's state survive; yet the batch holds no
    # TRUNCATE of its own, so rows the lake wrote after it would be lost by a replacement.
    late = Supersession(truncate=None, newest={V1.fingerprint: at(2), V2.fingerprint: at(8)})
    assert late.surviving(state(at(5))) == {V2.fingerprint}
    with pytest.raises(SchemaChangeError, match="column v changed type"):
        plan_table(TABLE, LAKE_V1, [V1, V2], late, state(at(5)))
    plan = plan_table(TABLE, None, [V1, V2], late, state(at(5)))
    assert plan.superseded == {V1.fingerprint}


def test_a_changed_key_after_the_truncate_replaces_the_table() -> None:
    rekeyed = schema(Column("id", ct.LONG), key=Column("code", ct.STRING, key=True))
    resync = Supersession(truncate=at(5), newest={rekeyed.fingerprint: at(6)})
    plan = plan_table(TABLE, LAKE_V1, [rekeyed], resync, None)
    assert plan.replace
    assert plan.columns.key_columns == ("code",)


def test_nothing_surviving_plans_a_new_table_from_every_schema() -> None:
    # Only replays: the table is still created, so its offsets can be recorded.
    replays = Supersession(truncate=None, newest={})
    plan = plan_table(TABLE, None, [V2], replays, None)
    assert (plan.replace, plan.columns.create, plan.superseded) == (False, True, frozenset())
