"""Source setup against the real PostgreSQL: tables, replica identity, publication, slot,
the server's identity and the standby slots it would wait for."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from capture.errors import ConfigError
from capture.metrics import CaptureMetrics
from capture.source.publication import column_list_problem, read_filter
from capture.source.server_identity import read_source_server
from capture.source.setup import (
    TableRef,
    adopt_slot,
    check_server,
    check_tables,
    ensure_publication,
    ensure_slot,
    resolve_tables,
)
from capture.source.standby_slots import (
    StandbySlotState,
    assess,
    check_standby_slots,
    read_standby_slots,
    slot_states,
)
from schemas.control import PublicationFilter, ServerIdentity
from schemas.lsn import Lsn
from tests.plugins.services import Services

Connection = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def schema(pg: Connection, unique_name: str) -> str:
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(unique_name)))
    for ddl in [
        "CREATE TABLE {}.orders (id bigint PRIMARY KEY, note text)",
        "CREATE TABLE {}.keyless (a int, b text)",
        "CREATE TABLE {}.full_identity (a int, b text)",
        "ALTER TABLE {}.full_identity REPLICA IDENTITY FULL",
    ]:
        pg.execute(sql.SQL(ddl).format(sql.Identifier(unique_name)))
    return unique_name


def _drop_slot(pg: Connection, name: str) -> None:
    pg.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
        [name],
    )


def test_server_is_ready_for_logical_replication(pg: Connection) -> None:
    check_server(pg)


def test_keyless_table_is_rejected_with_the_fix_and_others_pass(
    pg: Connection, schema: str
) -> None:
    tables = resolve_tables(pg, [], [schema])
    assert [t.name for t in tables] == ["full_identity", "keyless", "orders"]

    problems = check_tables(pg, tables)

    assert list(problems) == [TableRef(schema, "keyless")]
    message = str(problems[TableRef(schema, "keyless")])
    assert f"ALTER TABLE {schema}.keyless REPLICA IDENTITY FULL" in message
    assert "primary key" in message


def test_missing_or_unqualified_table_is_a_config_error(pg: Connection, schema: str) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_tables(pg, [f"{schema}.nope"], [])
    with pytest.raises(ConfigError, match="schema-qualified"):
        resolve_tables(pg, ["orders"], [])
    with pytest.raises(ConfigError, match="nothing to capture"):
        resolve_tables(pg, [], [])


def test_publication_is_created_then_adopted_and_extended(
    pg: Connection, schema: str, unique_name: str
) -> None:
    orders, full = TableRef(schema, "orders"), TableRef(schema, "full_identity")
    ensure_publication(pg, unique_name, [orders])
    ensure_publication(pg, unique_name, [orders, full])
    ensure_publication(pg, unique_name, [orders, full])

    published = pg.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1",
        [unique_name],
    ).fetchall()
    assert [r[0] for r in published] == ["full_identity", "orders"]


def test_an_adopted_publication_keeps_its_row_filters_and_column_lists(
    pg: Connection, schema: str, unique_name: str
) -> None:
    s = sql.Identifier(schema)
    pg.execute(sql.SQL("CREATE TABLE {}.listed (id int PRIMARY KEY, a text, pii text)").format(s))
    pg.execute(
        sql.SQL(
            "CREATE PUBLICATION {} FOR TABLE {}.orders (note) WHERE (id > 10), "
            "{}.full_identity (a), {}.listed (id, a) WHERE (id % 2 = 0)"
        ).format(sql.Identifier(unique_name), s, s, s)
    )
    orders, full, listed = (TableRef(schema, t) for t in ("orders", "full_identity", "listed"))
    keyless_full = TableRef(schema, "keyless")
    pg.execute(sql.SQL("ALTER TABLE {}.keyless REPLICA IDENTITY FULL").format(s))

    ensure_publication(pg, unique_name, [orders, full, listed, keyless_full])

    assert read_filter(pg, unique_name, orders.qualified) == PublicationFilter(
        "(id > 10)", ("note",)
    )
    assert read_filter(pg, unique_name, listed.qualified) == PublicationFilter(
        "((id % 2) = 0)", ("id", "a")
    )
    assert read_filter(pg, unique_name, keyless_full.qualified) == PublicationFilter()
    # The key must be listed, and under REPLICA IDENTITY FULL no list is allowed.
    without_key = column_list_problem(pg, unique_name, orders.qualified)
    assert without_key is not None
    assert "without its replica identity column id:" in str(without_key)
    under_full = column_list_problem(pg, unique_name, full.qualified)
    assert under_full is not None
    assert "REPLICA IDENTITY FULL" in str(under_full)
    assert column_list_problem(pg, unique_name, listed.qualified) is None
    assert column_list_problem(pg, unique_name, keyless_full.qualified) is None
    # What PostgreSQL itself says of them.
    with pytest.raises(psycopg.errors.InvalidColumnReference):
        pg.execute(sql.SQL("UPDATE {}.orders SET note = 'x'").format(s))
    with pytest.raises(psycopg.errors.InvalidColumnReference):
        pg.execute(sql.SQL("UPDATE {}.full_identity SET b = 'x'").format(s))
    pg.execute(sql.SQL("UPDATE {}.listed SET pii = 'x'").format(s))


def test_slot_is_created_then_adopted(pg: Connection, unique_name: str) -> None:
    try:
        first = ensure_slot(pg, unique_name)
        second = ensure_slot(pg, unique_name)
    finally:
        _drop_slot(pg, unique_name)
    assert first.created
    assert not second.created
    assert second.confirmed_flush == first.confirmed_flush
    assert first.confirmed_flush > 0


def test_slot_of_another_plugin_is_refused(pg: Connection, unique_name: str) -> None:
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [unique_name])
    try:
        with pytest.raises(ConfigError, match="test_decoding"):
            ensure_slot(pg, unique_name)
    finally:
        _drop_slot(pg, unique_name)


def test_a_role_that_may_not_extend_the_publication_is_told_what_the_dba_runs(
    pg: Connection, schema: str, unique_name: str, services: Services
) -> None:
    orders, full = TableRef(schema, "orders"), TableRef(schema, "full_identity")
    ensure_publication(pg, unique_name, [orders])  # created by the superuser (a DBA)
    role = f"{unique_name}_r"
    pg.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    try:
        dsn = make_conninfo(services.postgres_dsn, user=role)
        with psycopg.connect(dsn, autocommit=True) as conn:
            with pytest.raises(ConfigError, match=r"ALTER PUBLICATION .* ADD TABLE .*owner"):
                ensure_publication(conn, unique_name, [orders, full])
            ensure_publication(conn, unique_name, [orders])  # nothing to add: no DDL
    finally:
        pg.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_server_identifies_itself_as_its_control_file_says(
    pg: Connection, services: Services
) -> None:
    server = read_source_server(services.postgres_dsn, None, recorded=None)
    row = pg.execute(
        "SELECT s.system_identifier, c.timeline_id "
        "FROM pg_control_system() s, pg_control_checkpoint() c"
    ).fetchone()
    assert row is not None
    # pg_control_system() shows the unsigned identifier as a signed bigint.
    assert server.identity == ServerIdentity(int(str(row[0])) % 2**64, int(str(row[1])))
    assert server.history == (), "no history is read when no timeline was recorded"
    if server.identity.timeline > 1:  # a server that was promoted or recovered once
        earlier = ServerIdentity(server.identity.system_identifier, server.identity.timeline - 1)
        recovered = read_source_server(services.postgres_dsn, None, recorded=earlier)
        assert [s.timeline for s in recovered.history][-1] == earlier.timeline


def test_a_checkpoint_of_another_cluster_is_refused_before_a_slot_is_made(
    pg: Connection, services: Services, unique_name: str
) -> None:
    server = read_source_server(services.postgres_dsn, None, recorded=None)
    other = ServerIdentity(server.identity.system_identifier ^ 1, server.identity.timeline)
    with pytest.raises(ConfigError) as refused:
        adopt_slot(
            pg,
            unique_name,
            server=server,
            recorded=other,
            position=Lsn(0x100),
            checkpoint=Lsn(0x100),
            applied_topics=[],
            streamed_tables=[],
            warn_retained_bytes=0,
            metrics=CaptureMetrics(),
        )
    assert f"system identifier {other.system_identifier}" in str(refused.value)
    assert f"system identifier {server.identity.system_identifier}" in str(refused.value)
    made = pg.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [unique_name]
    ).fetchone()
    assert made is None, "no slot may be left on a server capture refused"


def test_slots_named_for_standbys_are_told_apart_in_the_real_catalog(
    pg: Connection, unique_name: str
) -> None:
    physical, logical, missing = f"{unique_name}_p", f"{unique_name}_l", f"{unique_name}_m"
    # Not reserved: a physical slot that holds back no WAL of the shared server.
    pg.execute("SELECT pg_create_physical_replication_slot(%s)", [physical])
    try:
        pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [logical])
        states = slot_states(pg, [physical, logical, missing])
        assert [(s.name, s.state) for s in states] == [
            (physical, StandbySlotState.INACTIVE),
            (logical, StandbySlotState.LOGICAL),
            (missing, StandbySlotState.MISSING),
        ]
        with pytest.raises(ConfigError, match="ALTER SYSTEM RESET synchronized_standby_slots") as e:
            assess(states, slot=unique_name)
        assert f'"{missing}" does not exist' in str(e.value)
        assert f'"{logical}" is a logical slot' in str(e.value)
    finally:
        _drop_slot(pg, physical)
        _drop_slot(pg, logical)


def test_a_server_that_waits_for_no_standby_passes(pg: Connection, unique_name: str) -> None:
    # The run's servers set no synchronized_standby_slots (tests that need one start a
    # server of their own): on 15 the setting does not exist, on 18 it is empty.
    assert read_standby_slots(pg) == []
    check_standby_slots(pg, unique_name)
