"""A Kafka Connect worker we did not write reads the registry-framed topics: capture in
``CAPTURE_KAFKA__ENCODING=registry`` mode streams a table of several types through the
real Kafka into the real Apicurio Registry, and a standalone Connect worker with
Apicurio's ``AvroConverter`` (tests/plugins/connect.py) turns every record into a
Connect ``Struct`` that its ``FileStreamSinkConnector`` writes as one line.

``Struct``'s string form names every non-null field with its value, so a line holding a
row's id and text proves the converter found the schema by the record's id and decoded
the body with it; a record it could not read would fail the task (errors.tolerance is
``none``), which the worker's log would show.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from schemas.naming import table_topic
from tests.plugins.capture import CaptureThread, registry_settings
from tests.plugins.connect import file_sink_worker
from tests.plugins.services import Services
from tests.plugins.topics import wait_for_topic

Connection = psycopg.Connection[tuple[object, ...]]

pytestmark = pytest.mark.slow

# id, note, then a value per further column: decimal, timestamp, date, uuid, bytes,
# JSON, array and boolean logical/complex types all cross the converter.
_COLUMNS = """
    id int4 PRIMARY KEY,
    note text,
    amount numeric(12, 2),
    at timestamptz,
    day date,
    ref uuid,
    blob bytea,
    doc jsonb,
    tags int4[],
    ok boolean,
    ratio float8
"""
_ROWS = [
    (
        1,
        "first note",
        "12.50",
        "2024-01-02 03:04:05.123456+00",
        "2024-01-02",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        b"\x00\x01",
        '{"k": 1}',
        [1, 2],
        True,
        0.5,
    ),
    (2, "second note", "-3.00", None, None, None, None, None, [], False, -1.25),
    (3, "third note", None, None, None, None, None, None, None, None, None),
]


def test_connect_avro_converter_sinks_every_record(
    services: Services,
    pg: Connection,
    unique_name: str,
    schema_registry_url: str,
    connect_jars: Path,
    tmp_path: Path,
) -> None:
    table = sql.Identifier("public", unique_name)
    pg.execute(sql.SQL("CREATE TABLE {} ({})").format(table, sql.SQL(_COLUMNS)))
    try:
        settings = registry_settings(services, unique_name, schema_registry_url)
        settings = settings.model_copy(
            update={
                "postgres": settings.postgres.model_copy(
                    update={"tables": [f"public.{unique_name}"]}
                )
            }
        )
        topic = table_topic(unique_name, "public", unique_name)
        runner = CaptureThread(settings)
        runner.start(pg)
        try:
            for row in _ROWS:
                pg.execute(
                    sql.SQL("INSERT INTO {} VALUES ({})").format(
                        table, sql.SQL(", ").join(sql.Placeholder() * len(row))
                    ),
                    row,
                )
            # A key-only DELETE, and a TRUNCATE, whose key is the 5-byte header of the
            # field-less TableKey that Python's deserializer refuses (wire-contract.md).
            pg.execute(sql.SQL("DELETE FROM {} WHERE id = 3").format(table))
            pg.execute(sql.SQL("TRUNCATE {}").format(table))
            wait_for_topic(services.kafka_bootstrap_servers, topic)
            with file_sink_worker(
                tmp_path / "connect",
                bootstrap_servers=services.kafka_bootstrap_servers,
                registry_url=schema_registry_url,
                topic=topic,
                name=unique_name,
            ) as worker:
                lines = worker.wait_for_lines(len(_ROWS) + 2)
                log = worker.log()
        finally:
            runner.close(pg)
        assert not runner.errors, runner.errors
    finally:
        pg.execute(sql.SQL("DROP TABLE {}").format(table))

    assert len(lines) == len(_ROWS) + 2, lines
    assert all(line.startswith("Struct{op=") for line in lines), lines
    by_op: dict[str, list[str]] = {}
    for line in lines:
        by_op.setdefault(line.removeprefix("Struct{op=").split(",", 1)[0], []).append(line)
    assert sorted(by_op) == ["DELETE", "INSERT", "TRUNCATE"], lines
    assert len(by_op["DELETE"]) == len(by_op["TRUNCATE"]) == 1, lines
    assert "before=Struct{id=3}" in by_op["DELETE"][0]
    by_id: dict[int, str] = {}
    for line in by_op["INSERT"]:
        after = re.search(r"after=Struct\{id=(\d+),", line)
        assert after is not None, line
        by_id[int(after.group(1))] = line
    assert sorted(by_id) == [row[0] for row in _ROWS]
    for row in _ROWS:
        assert f"note={row[1]}" in by_id[row[0]]
    # A decimal arrives as Connect's Decimal, arrays as lists, uuid and JSON as their
    # text; a timestamp-micros is an int64 of microseconds (the converter maps only the
    # millis logical types), docs/wire-contract.md, Kafka Connect.
    expected = {
        1: [
            "amount=12.50",
            "at=1704164645123456",
            "ref=a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            'doc={"k": 1}',
            "tags=[1, 2]",
            "ok=true",
            "ratio=0.5",
        ],
        2: ["amount=-3.00", "tags=[]", "ok=false", "ratio=-1.25"],
    }
    missing = [(i, f) for i, fields in expected.items() for f in fields if f not in by_id[i]]
    assert not missing, (missing, lines)
    # The third row's other columns are NULL, which Struct's string form leaves out.
    assert "amount=" not in by_id[3].split("after=")[1]
    errors = [line for line in log.splitlines() if " ERROR " in line or "Exception" in line]
    assert not errors, "\n".join(errors)
