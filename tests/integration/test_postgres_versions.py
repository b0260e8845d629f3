"""What differs between the PostgreSQL major versions capture supports, on the real servers.

This module runs once per version (``[pg15]``, ``[pg18]``: :mod:`tests.plugins.
postgres_versions`), and each test states what that version does with what capture
relies on (docs/capture.md, "PostgreSQL versions"):

- the pgoutput protocol versions a server accepts (``proto_version``): 1 to 3 on 15, 1
  to 4 from 16; capture asks for 1, which every supported version serves;
- a schema change reaches the stream as a new Relation message before the next change
  of the table, whatever the version;
- failover slots (``failover`` of ``pg_create_logical_replication_slot``, 17+), which
  capture adopts like any other pgoutput slot of its database;
- generated columns, which pgoutput leaves out everywhere except a publication that asks
  for them (``publish_generated_columns = stored``, 18+): capture's snapshot always
  leaves them out, so such a publication would send columns its snapshot never had.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import psycopg
import pytest
from psycopg import sql

from capture.errors import ConfigError
from capture.pgoutput.decode import decode
from capture.pgoutput.messages import Commit, Insert, Message, Relation
from capture.source.setup import TableRef, ensure_publication, ensure_slot
from capture.source.wal_safety import read_slot_wal
from tests.plugins.replication_stream import read_payloads
from tests.plugins.services import Services

Connection = psycopg.Connection[tuple[object, ...]]

INT4, INT8, TEXT = 23, 20, 25
"""Built-in type OIDs (pg_type.dat)."""
COMMIT = ord("C")


@pytest.fixture
def major(pg: Connection) -> int:
    """The server's major version, read from the server itself."""
    return pg.info.server_version // 10000


@pytest.fixture
def slots(services: Services) -> Iterator[list[str]]:
    """Names of slots the test created, dropped afterwards: ``DROP_REPLICATION_SLOT ..
    WAIT`` lets the server wait for the walsender of a closed stream to let go."""
    created: list[str] = []
    yield created
    with psycopg.connect(services.postgres_dsn, autocommit=True, replication="database") as conn:
        for slot in created:
            conn.execute(sql.SQL("DROP_REPLICATION_SLOT {} WAIT").format(sql.Identifier(slot)))


def _start(dsn: str, slot: str, publication: str, proto: int) -> psycopg.Connection[Any]:
    """A replication connection streaming ``slot`` with pgoutput ``proto_version``; closed
    with ``close()``, not ``with``: leaving a ``with`` block would send a query."""
    repl = psycopg.connect(dsn, autocommit=True, replication="database")
    try:
        repl.execute(
            sql.SQL(
                "START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version {}, publication_names {})"
            ).format(sql.Identifier(slot), sql.Literal(str(proto)), sql.Literal(publication))
        )
    except psycopg.Error:
        repl.close()
        raise
    return repl


def _messages(repl: psycopg.Connection[Any], commits: int, timeout_s: float = 30) -> list[Message]:
    """Decoded pgoutput messages up to the ``commits``-th Commit."""
    payloads = read_payloads(
        repl, lambda got: sum(p[0] == COMMIT for p in got) >= commits, timeout_s
    )
    messages = [decode(p) for p in payloads]
    assert sum(isinstance(m, Commit) for m in messages) == commits, messages
    return messages


def _table_with_slot(pg: Connection, name: str, columns: str, slots: list[str], **pub: str) -> None:
    """Table ``name`` with ``columns``, a publication of it (``WITH`` the ``pub``
    options) and a pgoutput slot, all named ``name``."""
    table = sql.Identifier(name)
    pg.execute(sql.SQL("CREATE TABLE {} ({})").format(table, sql.SQL(columns)))
    options = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(k), sql.Literal(v)) for k, v in pub.items()
    )
    with_options = sql.SQL(" WITH ({})").format(options) if pub else sql.SQL("")
    pg.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}{}").format(table, table, with_options))
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [name])
    slots.append(name)


def test_the_server_accepts_the_protocol_versions_of_its_major_version(
    services: Services, pg: Connection, major: int, unique_name: str, slots: list[str]
) -> None:
    """pgoutput 2 (streaming, 14), 3 (two-phase, 15) and 4 (parallel streaming, 16)."""
    newest = 3 if major == 15 else 4
    _table_with_slot(pg, unique_name, "id int PRIMARY KEY", slots)
    for proto in (1, 2, 3, 4, 5):
        slot = f"{unique_name}_{proto}"
        pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        slots.append(slot)
        if proto <= newest:
            _start(services.postgres_dsn, slot, unique_name, proto).close()
            continue
        # 15 says "we only support", 18 "server only supports".
        with pytest.raises(
            psycopg.errors.FeatureNotSupported, match=f"only supports? protocol {newest} or lower"
        ):
            _start(services.postgres_dsn, slot, unique_name, proto)


def test_a_schema_change_arrives_as_a_new_relation_before_the_next_change(
    services: Services, pg: Connection, unique_name: str, slots: list[str]
) -> None:
    _table_with_slot(pg, unique_name, "id int PRIMARY KEY, v int, gone text", slots)
    table = sql.Identifier(unique_name)
    for ddl, row in [
        ("SELECT 1", "(1, 1, 'a')"),
        ("ALTER TABLE {} ADD COLUMN added text DEFAULT 'x'", "(2, 2, 'b', 'y')"),
        ("ALTER TABLE {} ALTER COLUMN v TYPE bigint", "(3, 3, 'c', 'z')"),
        ("ALTER TABLE {} DROP COLUMN gone", "(4, 4, 'w')"),
    ]:
        pg.execute(sql.SQL(ddl).format(table))
        pg.execute(sql.SQL("INSERT INTO {} VALUES " + row).format(table))
    with closing(_start(services.postgres_dsn, unique_name, unique_name, 1)) as repl:
        messages = _messages(repl, commits=4)
    relations = [
        [(c.name, c.type_oid) for c in m.columns] for m in messages if isinstance(m, Relation)
    ]
    assert relations == [
        [("id", INT4), ("v", INT4), ("gone", TEXT)],
        [("id", INT4), ("v", INT4), ("gone", TEXT), ("added", TEXT)],
        [("id", INT4), ("v", INT8), ("gone", TEXT), ("added", TEXT)],
        [("id", INT4), ("v", INT8), ("added", TEXT)],
    ]
    kinds = [type(m).__name__ for m in messages if isinstance(m, Relation | Insert)]
    assert kinds == ["Relation", "Insert"] * 4, "each schema came before its table's next row"


def test_a_failover_slot_is_made_from_17_and_adopted_by_capture(
    pg: Connection, major: int, unique_name: str, slots: list[str]
) -> None:
    create = "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)"
    if major < 17:
        with pytest.raises(psycopg.errors.UndefinedFunction):
            pg.execute(create, [unique_name])
        return
    pg.execute(create, [unique_name])
    slots.append(unique_name)
    row = pg.execute(
        "SELECT failover, synced FROM pg_replication_slots WHERE slot_name = %s", [unique_name]
    ).fetchone()
    assert row == (True, False)
    slot = ensure_slot(pg, unique_name)
    assert not slot.created
    assert not slot.active


def test_generated_columns_are_streamed_only_when_the_publication_asks_from_18(
    services: Services, pg: Connection, major: int, unique_name: str, slots: list[str]
) -> None:
    columns = "id int PRIMARY KEY, v int, doubled int GENERATED ALWAYS AS (v * 2) STORED"
    _table_with_slot(pg, unique_name, columns, slots)
    asked = f"{unique_name}_gen"
    if major < 18:
        with pytest.raises(psycopg.errors.SyntaxError, match="publish_generated_columns"):
            _table_with_slot(pg, asked, columns, slots, publish_generated_columns="stored")
        names = [(unique_name, ["id", "v"])]
    else:
        _table_with_slot(pg, asked, columns, slots, publish_generated_columns="stored")
        stored = pg.execute(
            "SELECT pubgencols FROM pg_publication WHERE pubname = %s", [asked]
        ).fetchone()
        assert stored == ("s",)
        names = [(unique_name, ["id", "v"]), (asked, ["id", "v", "doubled"])]
    for name, expected in names:
        pg.execute(sql.SQL("INSERT INTO {} (id, v) VALUES (1, 21)").format(sql.Identifier(name)))
        with closing(_start(services.postgres_dsn, name, name, 1)) as repl:
            messages = _messages(repl, commits=1)
        relation = next(m for m in messages if isinstance(m, Relation))
        insert = next(m for m in messages if isinstance(m, Insert))
        assert [c.name for c in relation.columns] == expected
        assert len(insert.new.kinds) == len(expected)


def test_capture_refuses_a_publication_that_streams_generated_columns(
    pg: Connection, major: int, unique_name: str, slots: list[str]
) -> None:
    """Its snapshot would lack the columns the stream sends: refused with the fix."""
    columns = "id int PRIMARY KEY, v int, doubled int GENERATED ALWAYS AS (v * 2) STORED"
    _table_with_slot(pg, unique_name, columns, slots)
    table = TableRef("public", unique_name)
    ensure_publication(pg, unique_name, [table])  # without the option: adopted
    if major < 18:
        return
    pg.execute(
        sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = stored)").format(
            sql.Identifier(unique_name)
        )
    )
    with pytest.raises(ConfigError, match="publish_generated_columns = none"):
        ensure_publication(pg, unique_name, [table])
    pg.execute(
        sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = none)").format(
            sql.Identifier(unique_name)
        )
    )
    ensure_publication(pg, unique_name, [table])


def test_capture_reads_a_slots_wal_facts_and_its_invalidation_reason_from_17(
    pg: Connection, major: int, unique_name: str, slots: list[str]
) -> None:
    """``invalidation_reason`` (17+) names why a lost slot was lost (``idle_timeout`` on
    18 as well as ``wal_removed``): read where it exists, None before."""
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [unique_name])
    slots.append(unique_name)
    reading = read_slot_wal(pg, unique_name)
    assert reading is not None
    assert reading.wal_status == "reserved"
    assert reading.invalidation_reason is None
    columns = {
        str(r[0])
        for r in pg.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'pg_replication_slots'::regclass"
        ).fetchall()
    }
    assert ("invalidation_reason" in columns) == (major >= 17)


def test_capture_creates_its_slot_as_a_failover_slot_from_17(
    pg: Connection, major: int, unique_name: str, slots: list[str]
) -> None:
    slot = ensure_slot(pg, unique_name)
    slots.append(unique_name)
    assert slot.created
    if major < 17:
        return  # no failover slots: nothing a standby could keep
    row = pg.execute(
        "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", [unique_name]
    ).fetchone()
    assert row == (True,)
