"""Publication row filters and column lists against the real PostgreSQL and Kafka.

- A table published with a row filter and a column list is snapshotted and streamed
  with exactly the published rows and columns, under one writer schema: an UPDATE that
  moves a row out of the filter arrives as a DELETE, one that moves a row in as an
  INSERT (a key change under the default replica identity, any change under FULL).
- A column list without the replica identity's columns errors that table, with the fix.
- A row filter changed while capture runs resyncs the table online; a column list
  changed while capture is stopped is found at the next start, with no write to the
  table needed. Either way the topic then replays to what the publication lets through.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from capture.settings import CaptureSettings
from schemas.control import PublicationFilter, TableState
from schemas.headers import SCHEMA_FINGERPRINT
from schemas.reader import ContractReader
from tests.plugins.capture import (
    CaptureThread,
    capture_settings,
    confirmed_lsn,
    current_lsn,
    table_status,
)
from tests.plugins.services import Services
from tests.plugins.topics import read_to_end, replay, report_applied, schema_reader
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]


def _run(pg: Connection, statement: str, schema: str) -> None:
    pg.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))


def _state(settings: CaptureSettings, table: str) -> TableState | None:
    status = table_status(settings, table)
    return None if status is None else status.state


def _topic(
    settings: CaptureSettings, reader_schemas: int, topic: str
) -> tuple[ContractReader, list[Any]]:
    bootstrap = settings.kafka.bootstrap_servers
    reader = schema_reader(bootstrap, settings.kafka.schema_topic, reader_schemas)
    return reader, read_to_end(bootstrap, topic)


def _replayed(settings: CaptureSettings, topic: str) -> dict[Any, Any]:
    reader, messages = _topic(settings, 1, topic)
    return replay(reader, messages).get(topic, {})


def test_filtered_and_column_listed_tables_reach_kafka_with_exactly_the_published_rows(
    services: Services, pg: Connection, unique_name: str
) -> None:
    schema = unique_name
    for statement in [
        "CREATE SCHEMA {s}",
        # The default replica identity: the filter names key columns only, so PostgreSQL
        # allows UPDATEs, and a row moves in or out of it only with a key change.
        "CREATE TABLE {s}.keyed (tenant int, id int, a text, secret text, "
        "PRIMARY KEY (tenant, id))",
        # Several blocks: its snapshot is read in chunks, by worker processes.
        "INSERT INTO {s}.keyed SELECT t, g, 'a' || g, 'pii' || g "
        "FROM generate_series(1, 500) g, (VALUES (7), (8)) v(t)",
        "INSERT INTO {s}.keyed VALUES (8, 1000, 'moves in', 'pii')",
        # REPLICA IDENTITY FULL: any column may be filtered on; every UPDATE carries the
        # old row, so any change can move a row.
        "CREATE TABLE {s}.fullrow (id int PRIMARY KEY, tenant int, a text)",
        "ALTER TABLE {s}.fullrow REPLICA IDENTITY FULL",
        "INSERT INTO {s}.fullrow SELECT g, CASE WHEN g % 2 = 1 THEN 7 ELSE 8 END, 'a' || g "
        "FROM generate_series(1, 10) g",
        "CREATE TABLE {s}.unkeyed_list (id int PRIMARY KEY, a text, b text)",
    ]:
        _run(pg, statement, schema)
    pg.execute(
        sql.SQL(
            "CREATE PUBLICATION {p} FOR TABLE {s}.keyed (tenant, id, a) WHERE (tenant = 7), "
            "{s}.fullrow WHERE (tenant = 7), {s}.unkeyed_list (a, b)"
        ).format(p=sql.Identifier(unique_name), s=sql.Identifier(schema))
    )
    keyed, full, unkeyed = (f"{schema}.{t}" for t in ("keyed", "fullrow", "unkeyed_list"))
    settings = capture_settings(
        services, unique_name, [keyed, full, unkeyed], snapshot_mode="initial"
    ).model_copy(update={"snapshot_chunk_rows": 100, "snapshot_workers": 2})
    runner = CaptureThread(settings)
    try:
        runner.start(pg)
        wait_for(
            lambda: (
                _state(settings, keyed) is TableState.STREAMING
                and _state(settings, full) is TableState.STREAMING
            ),
            "the filtered tables never reached streaming",
            60,
        )
        status = table_status(settings, unkeyed)
        assert status is not None
        assert status.state is TableState.ERRORED
        assert "without its replica identity column id" in (status.message or "")
        assert f"python -m capture resync {unkeyed}" in (status.message or "")
        keyed_status = table_status(settings, keyed)
        assert keyed_status is not None
        assert keyed_status.publication == PublicationFilter("(tenant = 7)", ("tenant", "id", "a"))

        for statement in [
            "INSERT INTO {s}.keyed VALUES (7, 501, 'new', 'pii'), (8, 501, 'not published', 'x')",
            "UPDATE {s}.keyed SET tenant = 9 WHERE tenant = 7 AND id = 1",  # out: DELETE
            "UPDATE {s}.keyed SET tenant = 7 WHERE tenant = 8 AND id = 1000",  # in: INSERT
            "UPDATE {s}.keyed SET a = 'changed', secret = 'y' WHERE tenant = 7 AND id = 3",
            "UPDATE {s}.keyed SET a = 'unseen' WHERE tenant = 8 AND id = 5",
            "DELETE FROM {s}.keyed WHERE tenant = 7 AND id = 4",
            "UPDATE {s}.fullrow SET tenant = 8 WHERE id = 1",  # out: DELETE
            "UPDATE {s}.fullrow SET tenant = 7 WHERE id = 2",  # in: INSERT
            "UPDATE {s}.fullrow SET a = 'changed' WHERE id = 3",
            "UPDATE {s}.fullrow SET a = 'unseen' WHERE id = 4",
        ]:
            _run(pg, statement, schema)

        keyed_topic, full_topic = f"{unique_name}.{keyed}", f"{unique_name}.{full}"
        keyed_source = {
            (("id", i), ("tenant", t)): {"tenant": t, "id": i, "a": a}
            for t, i, a in pg.execute(
                sql.SQL("SELECT tenant, id, a FROM {s}.keyed WHERE tenant = 7").format(
                    s=sql.Identifier(schema)
                )
            ).fetchall()
        }
        full_source = {
            (("id", i),): {"id": i, "tenant": t, "a": a}
            for i, t, a in pg.execute(
                sql.SQL("SELECT id, tenant, a FROM {s}.fullrow WHERE tenant = 7").format(
                    s=sql.Identifier(schema)
                )
            ).fetchall()
        }
        wait_for(
            lambda: (
                _replayed(settings, keyed_topic) == keyed_source
                and _replayed(settings, full_topic) == full_source
            ),
            "the topics never replayed to the published rows",
            30,
        )

        reader, messages = _topic(settings, 2, keyed_topic)
        values = [reader.decode_value(m.value()) for m in messages]
        reads = [v["after"] for v in values if v["op"] == "READ"]
        assert sorted((r["tenant"], r["id"]) for r in reads) == [(7, i) for i in range(1, 501)]
        for value in values:
            for image in (value["before"], value["after"]):
                assert image is None or set(image) == {"tenant", "id", "a"}, image
        fingerprints = {dict(m.headers())[SCHEMA_FINGERPRINT] for m in messages}
        assert len(fingerprints) == 1, "the snapshot and the stream share one writer schema"
        changes = sorted(
            (v["op"], key["tenant"], key["id"])
            for v, m in zip(values, messages, strict=True)
            if v["op"] != "READ"
            for key in [reader.decode_key(m.key())]
        )
        assert changes == sorted(
            [
                ("INSERT", 7, 501),
                ("DELETE", 7, 1),  # moved out of the filter
                ("INSERT", 7, 1000),  # moved into it
                ("UPDATE", 7, 3),
                ("DELETE", 7, 4),
            ]
        )

        reader, messages = _topic(settings, 2, full_topic)
        values = [reader.decode_value(m.value()) for m in messages]
        assert sorted(v["after"]["id"] for v in values if v["op"] == "READ") == [1, 3, 5, 7, 9]
        moved = {v["op"]: v for v in values if v["op"] in ("INSERT", "DELETE")}
        assert set(moved) == {"INSERT", "DELETE"}
        assert moved["DELETE"]["before"] == {"id": 1, "tenant": 7, "a": "a1"}
        assert moved["INSERT"]["after"] == {"id": 2, "tenant": 7, "a": "a2"}
        assert [v["after"]["id"] for v in values if v["op"] == "UPDATE"] == [3]
    finally:
        runner.close(pg)
        pg.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(unique_name)))


def test_a_changed_row_filter_or_column_list_resyncs_the_table(
    services: Services, pg: Connection, unique_name: str
) -> None:
    schema = unique_name
    for statement in [
        "CREATE SCHEMA {s}",
        "CREATE TABLE {s}.t (id int PRIMARY KEY, a text, b text)",
        "INSERT INTO {s}.t SELECT g, 'a' || g, 'b' || g FROM generate_series(1, 20) g",
    ]:
        _run(pg, statement, schema)
    publication = sql.Identifier(unique_name)
    table = sql.Identifier(schema, "t")
    pg.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WHERE (id <= 10)").format(publication, table)
    )
    name = f"{schema}.t"
    topic = f"{unique_name}.{name}"
    settings = capture_settings(services, unique_name, [name], snapshot_mode="initial")

    def source(where: str, columns: tuple[str, ...]) -> dict[Any, Any]:
        rows = pg.execute(
            sql.SQL("SELECT {} FROM {} WHERE {}").format(
                sql.SQL(", ").join(map(sql.Identifier, columns)), table, sql.SQL(where)
            )
        ).fetchall()
        return {(("id", r[0]),): dict(zip(columns, r, strict=True)) for r in rows}

    runner = CaptureThread(settings)
    try:
        runner.start(pg)
        wait_for(
            lambda: _replayed(settings, topic) == source("id <= 10", ("id", "a", "b")),
            "the first snapshot never arrived",
            60,
        )

        # While running: the next change of the table brings its Relation again.
        pg.execute(
            sql.SQL("ALTER PUBLICATION {} SET TABLE {} WHERE (id > 5)").format(publication, table)
        )
        pg.execute(sql.SQL("INSERT INTO {} VALUES (21, 'a21', 'b21')").format(table))
        wait_for(
            lambda: _replayed(settings, topic) == source("id > 5", ("id", "a", "b")),
            "the table was not resynced under the new row filter",
            60,
        )
        status = table_status(settings, name)
        assert status is not None
        assert status.state is TableState.STREAMING
        assert (status.message or "").startswith("the publication's row filter changed")
        assert status.publication == PublicationFilter("(id > 5)", None)
        # Everything applied and confirmed: the next start streams nothing of the table,
        # so no Relation of it arrives and only the check at the start can find a change.
        _, messages = _topic(settings, 1, topic)
        report_applied(settings.kafka.bootstrap_servers, settings.kafka.control_topic, messages)
        written = current_lsn(pg)
        wait_for(
            lambda: confirmed_lsn(pg, unique_name) >= written,
            "the slot never passed the applied records",
            30,
        )
        runner.join()
        assert not runner.errors, runner.errors

        # While stopped, and nothing written since: found at the start.
        pg.execute(
            sql.SQL("ALTER PUBLICATION {} SET TABLE {} (id, a) WHERE (id > 5)").format(
                publication, table
            )
        )
        runner = CaptureThread(settings)
        runner.start(pg)
        wait_for(
            lambda: (
                (found := table_status(settings, name)) is not None
                and found.publication == PublicationFilter("(id > 5)", ("id", "a"))
                and found.state is TableState.STREAMING
            ),
            "the column list changed while stopped was not found at the start",
            60,
        )
        wait_for(
            lambda: _replayed(settings, topic) == source("id > 5", ("id", "a")),
            "the resync did not publish the rows without the column left out",
            30,
        )
        reader, messages = _topic(settings, 2, topic)
        reads = [reader.decode_value(m.value()) for m in messages]
        reads = [v for v in reads if v["op"] == "READ"]
        newest = max(v["commit_lsn"] for v in reads)
        assert {tuple(sorted(v["after"])) for v in reads if v["commit_lsn"] == newest} == {
            ("a", "id")
        }, "the last snapshot's writer schema has no column b"
    finally:
        runner.close(pg)
        pg.execute(sql.SQL("DROP PUBLICATION {}").format(publication))
