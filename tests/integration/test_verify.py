"""verify against the real pipeline: PostgreSQL -> capture -> Kafka -> apply -> Delta.

A type-rich table (every type of docs/type-mapping.md, edge values included) goes
through the real capture and apply, so the lake's positions are real; verify must call
it equal, then name exactly the keys a test corrupts in the lake. A row changed at the
source after the verify point must not be reported once the pipeline applied it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from delta.tables import DeltaTable
from psycopg import sql

from apply.settings import ApplySettings, LakeSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture import admin
from capture.errors import ConfigError
from capture.settings import CaptureSettings
from pipeline.verify import TableStatus, verify_tables
from pipeline.verify.compare import Outcome
from pipeline.verify.report import format_human
from schemas.control import TableState
from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.lake import apply_running
from tests.plugins.services import Services
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow
Connection = psycopg.Connection[tuple[object, ...]]

LONG_TEXT = ('a,b\\c \\N "q" ü€ ' * 1500)[:20_000]

COLUMNS = """
    id int PRIMARY KEY,
    b boolean, i2 smallint, i4 int, i8 bigint, o oid,
    r real, d double precision,
    n numeric(38,10), n2 numeric(5,2), nu numeric, dm {s}.amount,
    t text, vc varchar(10), c char(5), nm name, ch "char",
    by bytea, dt date, tm time, ts timestamp, tz timestamptz, ttz timetz, iv interval,
    u uuid, j json, jb jsonb, x xml, m money, ip inet, cd cidr, mac macaddr, mac8 macaddr8,
    e {s}.mood, comp {s}.pair, rng int4range,
    ai int[], at text[], a2 int[][], a2t text[][], ad date[], af float8[], anum numeric(10,2)[],
    ats timestamptz[], ain inet[]
"""

ROWS: list[dict[str, Any]] = [
    # Ordinary values.
    {
        "id": 1,
        "b": True,
        "i2": 1,
        "i4": 2,
        "i8": 3,
        "o": 4,
        "r": 1.5,
        "d": 0.1,
        "n": "123.4560000000",
        "n2": "1.25",
        "nu": "3.14159265358979323846264338327950288",
        "dm": "10.50",
        "t": "hello",
        "vc": "v",
        "c": "ab",
        "nm": "nm",
        "ch": "c",
        "by": b"\x00\xff",
        "dt": "2024-02-29",
        "tm": "12:34:56.789",
        "ts": "2024-02-29 12:34:56",
        "tz": "2024-02-29 12:34:56.5+00",
        "ttz": "12:34:56+05:30",
        "iv": "1 year 2 mons 3 days",
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "j": '{"b": 1,  "a": [1, 2]}',
        "jb": '{"b": 1, "a": [1, 2]}',
        "x": "<a>x</a>",
        "m": "-1234.5",
        "ip": "::1",
        "cd": "10.0.0.0/8",
        "mac": "08:00:2b:01:02:03",
        "mac8": "08:00:2b:01:02:03:04:05",
        "e": "happy",
        "comp": '(1,"a b")',
        "rng": "[1,10)",
        "ai": "{1,2,3}",
        "at": '{"a b",c}',
        "a2": "{{1,2},{3,4}}",
        "a2t": '{{"a,b",NULL},{c,d}}',
        "ad": "{2024-01-01}",
        "af": "{1.5,2.5}",
        "anum": "{1.00,NULL}",
        "ats": "{2024-01-01 00:00:00+00}",
        "ain": "{::1,10.0.0.1/8}",
    },
    # All NULL.
    {"id": 2},
    # Minima, negative zero, infinities, NULL elements, a long TOASTed text.
    {
        "id": 3,
        "b": False,
        "i2": -32768,
        "i4": -2147483648,
        "i8": -9223372036854775808,
        "o": 4294967295,
        "r": "-0",
        "d": "-0",
        "n": "-9999999999999999999999999999.9999999999",
        "n2": "-0.50",
        "nu": "NaN",
        "t": LONG_TEXT,
        "vc": "",
        "c": "",
        "by": b"",
        "dt": "infinity",
        "tm": "24:00:00",
        "ts": "infinity",
        "tz": "-infinity",
        "iv": "-1 days",
        "ai": "{1,NULL,3}",
        "at": '{"a,b","NULL",NULL,"x\\"y","\\\\N",""}',
        "a2": "{{1,2},{3,NULL}}",
        "ad": "{infinity,-infinity,NULL,0044-03-15 BC}",
        "af": "{NaN,-0,Infinity,-Infinity,NULL}",
        "ats": "{infinity,NULL}",
    },
    # Maxima, NaN, BC dates and timestamps, empty arrays.
    {
        "id": 4,
        "i2": 32767,
        "i4": 2147483647,
        "i8": 9223372036854775807,
        "r": "NaN",
        "d": "Infinity",
        "nu": "Infinity",
        "n": "9999999999999999999999999999.9999999999",
        "t": ",",
        "dt": "4714-11-24 BC",
        "ts": "4713-01-01 00:00:00 BC",
        "tz": "0044-03-15 12:00:00.000001+00 BC",
        "tm": "00:00:00",
        "ai": "{}",
        "at": "{}",
        "a2": "{}",
        "a2t": "{}",
        "ad": "{}",
        "af": "{}",
    },
    # Float extremes, microseconds, text that looks like markers.
    {
        "id": 5,
        "r": "3.4028235e+38",
        "d": "4.9e-324",
        "nu": "-Infinity",
        "t": "\\N",
        "vc": "\\",
        "c": "a b",
        "dt": "0001-01-01",
        "ts": "2024-02-29 12:34:56.123456",
        "tz": "1999-12-31 23:59:59.999999+05:30",
        "ai": "[0:2]={7,8,9}",
    },
]


def _insert(pg: Connection, schema: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        pg.execute(
            sql.SQL("INSERT INTO {}.typed ({}) VALUES ({})").format(
                sql.Identifier(schema),
                sql.SQL(", ").join(map(sql.Identifier, row)),
                sql.SQL(", ").join(sql.Placeholder() * len(row)),
            ),
            list(row.values()),
        )


def _apply_settings(services: Services, prefix: str, lake: Path) -> ApplySettings:
    return ApplySettings(
        kafka=ApplyKafka(
            bootstrap_servers=services.kafka_bootstrap_servers,
            topic_prefix=prefix,
            control_topic=f"{prefix}._control",
            schema_topic=f"{prefix}._schemas",
        ),
        lake=LakeSettings(root=str(lake / "lake"), checkpoint_root=str(lake / "cp")),
        trigger=TriggerSettings(interval="1 second"),
    )


def _streaming(settings: CaptureSettings) -> bool:
    return {s.state for s in admin.table_statuses(settings)} == {TableState.STREAMING}


def test_verify_proves_a_type_rich_table_and_names_corrupted_keys(
    spark: Any, services: Services, pg: Connection, unique_name: str, tmp_path: Path
) -> None:
    schema = unique_name
    s = sql.Identifier(schema)
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    pg.execute(
        sql.SQL(
            "CREATE TYPE {s}.mood AS ENUM ('sad', 'happy');"
            "CREATE TYPE {s}.pair AS (a int, b text);"
            "CREATE DOMAIN {s}.amount AS numeric(10,2);"
            "CREATE TABLE {s}.loose (a int, b text);"
            "ALTER TABLE {s}.loose REPLICA IDENTITY FULL;"
        ).format(s=s)
    )
    pg.execute(sql.SQL("CREATE TABLE {s}.typed (" + COLUMNS.format(s="{s}") + ")").format(s=s))
    _insert(pg, schema, ROWS[:4])  # through the initial snapshot
    pg.execute(sql.SQL("INSERT INTO {}.loose VALUES (1, 'x'), (2, NULL)").format(s))
    tables = [f"{schema}.typed", f"{schema}.loose"]
    settings = capture_settings(services, unique_name, tables, snapshot_mode="initial")
    apply_settings = _apply_settings(services, unique_name, tmp_path)
    runner = CaptureThread(settings)
    runner.start(pg)
    try:
        with apply_running(apply_settings, spark):
            wait_for(lambda: _streaming(settings), "the initial snapshot never finished", 90)
            # And through the stream.
            _insert(pg, schema, ROWS[4:])
            _insert(pg, schema, [{"id": 6, "t": "deleted soon"}])
            pg.execute(sql.SQL("DELETE FROM {}.typed WHERE id = 6").format(s))
            pg.execute(sql.SQL("UPDATE {}.typed SET i4 = 42 WHERE id = 1").format(s))
            pg.execute(sql.SQL("INSERT INTO {}.loose VALUES (3, 'y,z')").format(s))

            report = verify_tables(settings, apply_settings, spark, tables, timeout_s=120)
            assert [t.status for t in report.tables] == [TableStatus.OK, TableStatus.OK], (
                format_human(report)
            )
            assert report.ok
            typed = report.table(f"{schema}.typed")
            assert typed.rounds == 1
            assert typed.lake_versions
            assert typed.verify_points

            path = str(tmp_path / "lake" / schema / "typed")
            table = DeltaTable.forPath(spark, path)
            table.delete("id = 5")
            table.update("id = 1", {"t": "'corrupted'"})
            table.update("id = 3", {"d": "CAST(0.0 AS DOUBLE)"})  # -0 becomes 0
            spark.sql(
                f"INSERT INTO delta.`{path}` (id, _cdc_commit_lsn, _cdc_ordinal) VALUES (100, 1, 1)"
            )
            # Written "after" any verify point: changing, never definite.
            table.update("id = 4", {"t": "'late'", "_cdc_commit_lsn": str(2**62)})

            report = verify_tables(
                settings, apply_settings, spark, [f"{schema}.typed"], rounds=2, pause_s=0.1
            )
            typed = report.table(f"{schema}.typed")
            assert typed.status is TableStatus.DIFFERENT
            assert not report.ok
            found = {o: typed.keys[o].sample for o in typed.keys}
            assert found == {
                Outcome.MISSING: ["5"],
                Outcome.DIFFERENT: ["1", "3"],
                Outcome.EXTRA: ["100"],
                Outcome.CHANGING: ["4"],
            }
            assert typed.rounds == 2

            with pytest.raises(ConfigError, match="not in publication"):
                verify_tables(settings, apply_settings, spark, [f"{schema}.nope"])
    finally:
        runner.close(pg)
    assert not runner.errors, runner.errors


def _verify_slots(pg: Connection) -> int:
    row = pg.execute(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE %s",
        [f"verify\\_{os.getpid()}\\_%"],
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def test_a_change_after_the_verify_point_is_not_reported_once_applied(
    spark: Any, services: Services, pg: Connection, unique_name: str, tmp_path: Path
) -> None:
    schema = unique_name
    s = sql.Identifier(schema)
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(s))
    pg.execute(sql.SQL("CREATE TABLE {}.acct (id int PRIMARY KEY, v int)").format(s))
    pg.execute(sql.SQL("INSERT INTO {}.acct SELECT g, g FROM generate_series(1, 20) g").format(s))
    table = f"{schema}.acct"
    settings = capture_settings(services, unique_name, [table], snapshot_mode="initial")
    apply_settings = _apply_settings(services, unique_name, tmp_path)
    runner = CaptureThread(settings)
    runner.start(pg)
    try:
        with apply_running(apply_settings, spark):
            wait_for(lambda: _streaming(settings), "the initial snapshot never finished", 90)
            assert verify_tables(settings, apply_settings, spark, [table], timeout_s=120).ok
            # With capture stopped, the slot cannot reach a new verify point: verify
            # waits, and the update below commits after its verify point.
            runner.join()
            results: list[Any] = []
            worker = threading.Thread(
                target=lambda: results.append(
                    verify_tables(
                        settings, apply_settings, spark, [table], timeout_s=120, pause_s=0.1
                    )
                ),
                daemon=True,
            )
            before = _verify_slots(pg)
            worker.start()
            wait_for(lambda: _verify_slots(pg) > before, "verify took no verify point", 90)
            pg.execute(sql.SQL("UPDATE {}.acct SET v = -1 WHERE id = 7").format(s))
            pg.execute(sql.SQL("DELETE FROM {}.acct WHERE id = 8").format(s))
            runner = CaptureThread(settings)
            runner.start(pg)
            worker.join(180)
            assert results, "verify did not finish"
            report = results[0]
            assert report.ok, format_human(report)
            assert report.tables[0].rounds in (1, 2)

            # A retyped column: apply cannot follow, parks the table's records.
            pg.execute(sql.SQL("ALTER TABLE {}.acct ALTER COLUMN v TYPE bigint").format(s))
            pg.execute(sql.SQL("UPDATE {}.acct SET v = 5 WHERE id = 1").format(s))
            report = verify_tables(settings, apply_settings, spark, [table], rounds=1)
            acct = report.tables[0]
            assert acct.status is TableStatus.ERRORED, format_human(report)
            assert acct.errored is not None
            assert "changed type" in acct.errored
            assert any("column v is int in the lake" in note for note in acct.notes)
    finally:
        runner.close(pg)
    assert not runner.errors, runner.errors
