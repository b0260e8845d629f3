"""The lake as other engines read it: delta-rs, DuckDB's delta extension, and the values
they return in the contract's form, plus an in-process apply job for the lake tests.

Readers hand back Arrow. :func:`contract_values` turns an Arrow column into the values
:class:`~schemas.reader.ContractReader` gives for the same column type, so the lake can be
compared with PostgreSQL by the checks of ``tests/plugins/type_cases.py``:
dates, times and timestamps are read as their integers first (days, microseconds) and
converted by the contract's own rules, since ``+-infinity`` (the integer extremes) and
years past 9999 have no Python ``datetime``; a UUID, a string in the lake, becomes a
``UUID``.

DuckDB's delta extension comes from the ``duckdb-ext-delta`` wheel, which ships the
binary for its DuckDB release: the connection points ``extension_directory`` at it and
never installs or auto-loads anything from the network.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pyarrow as pa  # type: ignore[import-untyped]

from apply.app import ApplyJob
from apply.settings import ApplySettings
from schemas import reader
from schemas.column_type import AvroKind, ColumnType
from schemas.lsn import parse_lsn
from tests.plugins.pipeline import slot_confirmed
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]

_FROM_INTEGER: dict[AvroKind, Callable[[int], Any]] = {
    AvroKind.DATE: reader._date,
    AvroKind.TIME_MICROS: reader._time,
    AvroKind.TIMESTAMP_MICROS: reader._timestamp,
    AvroKind.LOCAL_TIMESTAMP_MICROS: reader._local_timestamp,
}


def _as_integers(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with every date and timestamp leaf replaced by its integer."""
    if pa.types.is_date32(data_type):
        return pa.int32()
    if pa.types.is_timestamp(data_type):
        return pa.int64()
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        item = data_type.value_field.with_type(_as_integers(data_type.value_type))
        return pa.list_(item)
    return data_type


def _require_micros(column: pa.ChunkedArray) -> pa.ChunkedArray:
    unit = getattr(column.type, "unit", None)
    if unit == "us":
        return column
    raise AssertionError(f"a timestamp read as {column.type}, not microseconds")


def contract_values(column: pa.ChunkedArray, column_type: ColumnType) -> list[Any]:
    """The column's values as the contract's reader decodes them (module docstring)."""
    if pa.types.is_timestamp(column.type):
        column = _require_micros(column)
    values = column.cast(_as_integers(column.type)).to_pylist()
    return [_contract_value(value, column_type) for value in values]


def _contract_value(value: Any, column_type: ColumnType) -> Any:
    if value is None:
        return None
    if column_type.kind is AvroKind.ARRAY:
        assert column_type.items is not None
        return [_contract_value(item, column_type.items) for item in value]
    if column_type.kind is AvroKind.UUID:
        return uuid.UUID(value)
    convert = _FROM_INTEGER.get(column_type.kind)
    return value if convert is None else convert(value)


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the delta extension of the ``duckdb-ext-delta`` wheel."""
    extensions = Path(str(metadata.distribution("duckdb-ext-delta").locate_file("duckdb_ext")))
    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET extension_directory = ?", [str(extensions / "extensions")])
    con.execute("LOAD delta")
    return con


def read_duckdb(path: str) -> pa.Table:
    with duckdb_connection() as con:
        return con.execute("SELECT * FROM delta_scan(?)", [path]).fetch_arrow_table()


def read_delta_rs_query(path: str) -> pa.Table:
    """The table through delta-rs's DataFusion query engine (``QueryBuilder``)."""
    from deltalake import DeltaTable, QueryBuilder  # noqa: PLC0415

    result = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT * FROM t")
    table = pa.table(result.read_all())
    # DataFusion hands strings and binaries out as views, which pyarrow cannot sort.
    return table.cast(
        pa.schema([field.with_type(_without_views(field.type)) for field in table.schema])
    )


def _without_views(data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(data_type):
        return pa.string()
    if pa.types.is_binary_view(data_type):
        return pa.binary()
    if (
        pa.types.is_list(data_type)
        or pa.types.is_large_list(data_type)
        or pa.types.is_list_view(data_type)
    ):
        return pa.list_(data_type.value_field.with_type(_without_views(data_type.value_type)))
    return data_type


def read_delta_rs_pyarrow(path: str) -> pa.Table:
    """The table through delta-rs's ``to_pyarrow_table``, its usual Python reader."""
    from deltalake import DeltaTable  # noqa: PLC0415

    return DeltaTable(path).to_pyarrow_table()


@contextmanager
def apply_running(settings: ApplySettings, spark: Any) -> Iterator[list[BaseException]]:
    """The apply job in a thread for the duration of the block; its errors fail the test.
    The block gets the list the errors land in, for :func:`wait_applied` to give up early."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        job = ApplyJob(settings, spark)
        try:
            job.run(stop)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            job.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join(120)
    assert not errors, "\n".join(map(str, errors))


def wait_applied(
    pg: Connection, slot: str, errors: Sequence[BaseException] = (), timeout_s: float = 300
) -> None:
    """Wait until the slot is confirmed past the WAL written so far: capture confirms
    only what apply has in Delta, so the lake then holds every change committed before.
    ``errors`` are the apply job's (:func:`apply_running`): one ends the wait.

    The target is the WAL *insert* position: with ``synchronous_commit=off`` (the local
    stack) a commit returns before its WAL is written, and the write position
    (``pg_current_wal_lsn``) can still be before it, which the slot may have passed."""
    row = pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    target = parse_lsn(str(row[0]))

    def applied() -> bool:
        assert not errors, "\n".join(map(str, errors))
        confirmed = slot_confirmed(pg, slot)
        return confirmed is not None and confirmed >= target

    wait_for(applied, f"slot {slot} to pass {target}", timeout_s)


def live_files(spark: Any, path: str) -> list[Path]:
    """The Parquet files of the table's current version."""
    uris = spark.read.format("delta").load(path).inputFiles()
    return [Path(uri.removeprefix("file://")) for uri in uris]


def timestamp_columns(parquet_file: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each column of the file whose values are instants: physical type and Parquet
    logical type (empty for INT96, which has none)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # noqa: PLC0415

    schema = pq.ParquetFile(parquet_file).metadata.schema
    columns = {}
    for index in range(len(schema)):
        column = schema.column(index)
        logical = json.loads(column.logical_type.to_json())
        if column.physical_type == "INT96" or logical.get("Type") == "Timestamp":
            kept = {k: logical[k] for k in ("isAdjustedToUTC", "timeUnit") if k in logical}
            columns[column.path] = (column.physical_type, kept)
    return columns
