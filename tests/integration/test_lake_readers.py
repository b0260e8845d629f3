"""Every Delta reader reads the lake exactly: Spark, delta-rs and DuckDB against PostgreSQL.

The type-rich table of the type round trip (``tests/plugins/type_cases.py``: every type
of docs/type-mapping.md, its edge values: +-infinity, BC dates, the last representable
instant, NaN/+-Inf/-0 floats, numeric at precision 38, 2-D arrays and arrays with NULLs,
a row NULL throughout), plus a 100 kB TOASTed text, goes through the real capture and apply:
inserted, then updated without touching the TOASTed column (so its value must survive
an unchanged-TOAST update) and a row deleted, in a later batch, so the MERGE leaves
deletion vectors behind. Each reader's rows are turned into the contract's values
(:func:`tests.plugins.lake.contract_values`) and compared with PostgreSQL by the checks
of ``tests/plugins/type_cases.py``, value by value.

A table of ordinary values goes along (updated and deleted from in the later batch
too), for delta-rs's pyarrow reader, which fails on the type-rich table's extreme dates
whatever its deletion vectors. A second lake is built from the same topics by
``python -m apply`` with ``APPLY_LAKE__DELETION_VECTORS=false``: the reader matrix of
docs/apply.md is what the DV test below observes on both lakes.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from deltalake.exceptions import DeltaProtocolError
from psycopg import sql

from apply.settings import ApplySettings, LakeSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture.rows.typemap import libpq_options
from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.lake import (
    apply_running,
    contract_values,
    live_files,
    read_delta_rs_pyarrow,
    read_delta_rs_query,
    read_duckdb,
    timestamp_columns,
    wait_applied,
)
from tests.plugins.pipeline import Pipeline
from tests.plugins.services import Services
from tests.plugins.type_cases import (
    CASES,
    ROWS,
    agrees,
    create_table,
    expected_values,
    insert_rows,
)

pytestmark = pytest.mark.slow
Connection = psycopg.Connection[tuple[Any, ...]]

TABLE = "all_types"
SIMPLE = "simple"
"""A table of ordinary values beside it, for readers that fail on the edge values."""
DELETED_ID = 100
# Rows 0..ROWS-2 get their own ~100 kB of hex, which pglz cannot shrink below the TOAST
# threshold; STORAGE EXTERNAL keeps it out of line and uncompressed either way.
BIG_TEXT = (
    "(SELECT string_agg(md5(id::text || '.' || g::text), '') FROM generate_series(1, 3200) g)"
)


@dataclass(frozen=True)
class Lake:
    dsn: str
    schema: str
    with_dvs: str
    """The table as apply writes it by default: deletion vectors on."""
    without_dvs: str
    """The same table from the same topics, applied with deletion vectors off."""

    @property
    def table(self) -> sql.Composable:
        return sql.Identifier(self.schema, TABLE)


def _apply_settings(services: Services, name: str, root: Path) -> ApplySettings:
    return ApplySettings(
        kafka=ApplyKafka(
            bootstrap_servers=services.kafka_bootstrap_servers,
            topic_prefix=name,
            control_topic=f"{name}._control",
            schema_topic=f"{name}._schemas",
        ),
        lake=LakeSettings(
            root=str(root / "lake"), checkpoint_root=str(root / "cp"), deletion_vectors=True
        ),
        trigger=TriggerSettings(interval="1 second"),
    )


def _apply_without_deletion_vectors(services: Services, name: str, workdir: Path) -> None:
    """``python -m apply`` over the topics so far with ``APPLY_LAKE__DELETION_VECTORS=false``,
    as a process of its own: the setting reaches Delta through the session the entry
    point builds, which the shared test session cannot stand in for."""
    pipeline = Pipeline(name, services.postgres_dsn, services.kafka_bootstrap_servers, (), workdir)
    pipeline.apply.env.update(
        {
            "APPLY_LAKE__DELETION_VECTORS": "false",
            "APPLY_TRIGGER__MODE": "available_now",
            "APPLY_METRICS__ENABLED": "false",
        }
    )
    workdir.mkdir(parents=True, exist_ok=True)
    pipeline.apply.start()
    assert pipeline.apply.process is not None
    try:
        code = pipeline.apply.process.wait(900)
    except subprocess.TimeoutExpired:
        pipeline.apply.kill()
        raise AssertionError(f"apply never finished:\n{pipeline.apply.tail()}") from None
    assert code == 0, pipeline.apply.tail()


@pytest.fixture(scope="module")
def lake(
    services: Services, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lake]:
    name = f"t_lake_{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp(name)
    schema = sql.Identifier(name)
    with psycopg.connect(services.postgres_dsn, autocommit=True) as pg:
        pg.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        try:
            _run_pipeline(services, spark, pg, name, root)
            yield Lake(
                dsn=services.postgres_dsn,
                schema=name,
                with_dvs=str(root / "dvs" / "lake" / name / TABLE),
                without_dvs=str(root / "plain" / "lake" / name / TABLE),
            )
        finally:
            pg.execute("RESET search_path")
            pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(schema))


def _run_pipeline(services: Services, spark: Any, pg: Connection, name: str, root: Path) -> None:
    """The table through capture and apply into both lakes (module docstring)."""
    table = sql.Identifier(name, TABLE)
    pg.execute("CREATE EXTENSION IF NOT EXISTS hstore SCHEMA public")
    pg.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(name)))
    create_table(pg, table)
    pg.execute(sql.SQL("ALTER TABLE {} ADD COLUMN big text").format(table))
    pg.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN big SET STORAGE EXTERNAL").format(table))
    simple = sql.Identifier(name, SIMPLE)
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(simple))
    tables = [f"{name}.{TABLE}", f"{name}.{SIMPLE}"]
    runner = CaptureThread(capture_settings(services, name, tables))
    runner.start(pg)
    try:
        with apply_running(_apply_settings(services, name, root / "dvs"), spark) as errors:
            insert_rows(pg, table)
            pg.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a'), (2, 'b'), (3, 'c')").format(simple))
            pg.execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(table), [DELETED_ID])
            pg.execute(
                sql.SQL("UPDATE {} SET big = " + BIG_TEXT + " WHERE id < %s").format(table),
                [ROWS - 1],
            )
            wait_applied(pg, name, errors)
            # A later batch: the MERGE replaces rows of files already written.
            pg.execute(sql.SQL("UPDATE {} SET i2 = i2 WHERE id < 3").format(table))
            pg.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(table), [DELETED_ID])
            pg.execute(sql.SQL("UPDATE {} SET note = 'a2' WHERE id = 1").format(simple))
            pg.execute(sql.SQL("DELETE FROM {} WHERE id = 3").format(simple))
            wait_applied(pg, name, errors)
    finally:
        runner.close(pg)
    assert not runner.errors, runner.errors
    _apply_without_deletion_vectors(services, name, root / "plain")


def _read_spark(spark: Any) -> Callable[[str], pa.Table]:
    return lambda path: spark.read.format("delta").load(path).toArrow()


def _mismatches(lake: Lake, read: pa.Table) -> list[str]:
    """Every value the reader returned that differs from PostgreSQL's (module docstring)."""
    read = read.sort_by("id")
    assert read.column("id").to_pylist() == list(range(ROWS))
    mismatches = []
    with (
        psycopg.connect(lake.dsn, autocommit=True) as pg,
        psycopg.connect(lake.dsn, autocommit=True, options=libpq_options()) as session,
    ):
        for case in CASES:
            got = contract_values(read.column(case.column), case.column_type)
            want = expected_values(case, pg, session, lake.table)
            for row, (value, expected) in enumerate(zip(got, want, strict=True)):
                if not agrees(case, value, expected):
                    mismatches.append(
                        f"{case.column} row {row}: read {value!r}, PostgreSQL {expected!r}"
                    )
        big = pg.execute(sql.SQL("SELECT big FROM {} ORDER BY id").format(lake.table)).fetchall()
        expected_big = [row[0] for row in big]
    assert all(len(text) == 102_400 for text in expected_big[:-1])
    if read.column("big").to_pylist() != expected_big:
        mismatches.append("big: the TOASTed text differs")
    return mismatches


def test_spark_reads_every_value_exactly(lake: Lake, spark: Any) -> None:
    assert _mismatches(lake, _read_spark(spark)(lake.with_dvs)) == []


def test_delta_rs_reads_every_value_exactly(lake: Lake) -> None:
    """Through its query engine; its pyarrow reader fails on this table (the DV test)."""
    assert _mismatches(lake, read_delta_rs_query(lake.with_dvs)) == []
    assert _mismatches(lake, read_delta_rs_query(lake.without_dvs)) == []


def test_duckdb_reads_every_value_exactly(lake: Lake) -> None:
    assert _mismatches(lake, read_duckdb(lake.with_dvs)) == []
    assert _mismatches(lake, read_duckdb(lake.without_dvs)) == []


def _deletion_vectors(path: str) -> tuple[set[str], int]:
    """The table's reader features and how many deletion vectors its log ever added."""
    features: set[str] = set()
    vectors = 0
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().split("\n"):
            if not line:
                continue
            action = json.loads(line)
            if "protocol" in action:
                features = set(action["protocol"].get("readerFeatures", []))
            if action.get("add", {}).get("deletionVector"):
                vectors += 1
    return features, vectors


def test_deletion_vectors_and_which_readers_read_them(lake: Lake, spark: Any) -> None:
    features, vectors = _deletion_vectors(lake.with_dvs)
    assert "deletionVectors" in features
    assert vectors > 0, "the update batch left no deletion vector: the matrix proves nothing"
    features, vectors = _deletion_vectors(lake.without_dvs)
    assert "deletionVectors" not in features
    assert vectors == 0

    # Deleted and replaced rows stay in their files; a reader that ignored the vectors
    # would return them (the deleted id, or the updated rows twice).
    readers: dict[str, Callable[[str], pa.Table]] = {
        "spark": _read_spark(spark),
        "delta-rs QueryBuilder": read_delta_rs_query,
        "duckdb": read_duckdb,
    }
    for reader, read in readers.items():
        ids = sorted(read(lake.with_dvs).column("id").to_pylist())
        assert ids == list(range(ROWS)), reader

    # delta-rs's usual reader refuses deletion vectors, reads the same table without them,
    # and panics on any table whose file statistics hold a date or instant past year 9999
    # or before year 0 (the +-infinity sentinels): it cannot parse Spark's extended-year
    # statistics (+5881580-07-11), with or without deletion vectors.
    simple_with_dvs = str(Path(lake.with_dvs).parent / SIMPLE)
    assert _deletion_vectors(simple_with_dvs)[1] > 0
    with pytest.raises(DeltaProtocolError, match=r"deletionVectors.*not yet supported"):
        read_delta_rs_pyarrow(simple_with_dvs)
    simple = read_delta_rs_pyarrow(str(Path(lake.without_dvs).parent / SIMPLE)).sort_by("id")
    assert simple.select(["id", "note"]).to_pydict() == {"id": [1, 2], "note": ["a2", "b"]}
    panic: BaseException | None = None
    try:
        read_delta_rs_pyarrow(lake.without_dvs)
    except BaseException as exc:  # pyo3's PanicException derives from BaseException
        panic = exc
    assert type(panic).__name__ == "PanicException", panic


def test_instants_are_int64_microseconds_in_every_file_apply_wrote(lake: Lake, spark: Any) -> None:
    utc = ("INT64", {"isAdjustedToUTC": True, "timeUnit": "microseconds"})
    local = ("INT64", {"isAdjustedToUTC": False, "timeUnit": "microseconds"})
    files = live_files(spark, lake.with_dvs)
    assert files
    for parquet_file in files:
        assert timestamp_columns(parquet_file) == {
            "ts": local,
            "tstz": utc,
            "tza.list.element": utc,
            "_cdc_commit_ts": utc,
        }, parquet_file.name
