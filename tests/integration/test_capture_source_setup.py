"""Source setup against the real PostgreSQL: tables, replica identity, publication, slot."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from capture.errors import ConfigError
from capture.source.publication import column_list_problem, read_filter
from capture.source.setup import (
    TableRef,
    check_server,
    check_tables,
    ensure_publication,
    ensure_slot,
    resolve_tables,
)
from schemas.control import PublicationFilter
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
