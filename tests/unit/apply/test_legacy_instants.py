"""apply.lake.legacy_instants: the INT96 instants delta-rs would rewrite as other
instants, and the driver leaving a table that holds them to Spark (apply.lake.driver_merge,
apply.lake.upkeep), against tables whose INT96 files pyarrow writes as Spark's default
session does (tests/integration/test_lake_timestamps.py has Spark's own)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from deltalake import DeltaTable, convert_to_deltalake, write_deltalake

from apply.lake.driver_merge import DriverMergeUnavailableError, DriverTables, exact_instants
from apply.lake.driver_store import LOCAL
from apply.lake.legacy_instants import (
    INT96_MAX_MICROS,
    INT96_MIN_MICROS,
    STATISTICS_MARGIN_MICROS,
    CheckedFiles,
    InstantColumns,
    instant_columns,
    outside_int96,
    unproven_files,
    wrong_instants,
)
from apply.lake.table_lock import TABLE_LOCKS
from apply.lake.tables import TableId
from apply.lake.upkeep import compact_from_driver

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
YEAR_3000 = int((datetime(3000, 1, 1, tzinfo=UTC) - _EPOCH).total_seconds()) * 1_000_000
YEAR_2024 = int((datetime(2024, 2, 29, tzinfo=UTC) - _EPOCH).total_seconds()) * 1_000_000
POSITIVE_INFINITY = 2**63 - 1
TABLE = TableId("public", "t")


def test_the_bounds_are_what_64_bit_nanoseconds_hold() -> None:
    assert INT96_MIN_MICROS * 1000 >= -(2**63) > (INT96_MIN_MICROS - 1) * 1000
    assert INT96_MAX_MICROS * 1000 <= 2**63 - 1 < (INT96_MAX_MICROS + 1) * 1000
    assert not outside_int96([INT96_MIN_MICROS, INT96_MAX_MICROS, None, 0])
    assert outside_int96([0, INT96_MAX_MICROS + 1])
    assert outside_int96([INT96_MIN_MICROS - 1])
    assert outside_int96([POSITIVE_INFINITY])


def _schema(*fields: tuple[str, Any]) -> str:
    return json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": name, "type": kind, "nullable": True, "metadata": {}}
                for name, kind in fields
            ],
        }
    )


def test_instant_columns_are_found_plain_or_nested() -> None:
    array = {"type": "array", "elementType": "timestamp", "containsNull": True}
    struct = {"type": "struct", "fields": [{"name": "at", "type": "timestamp_ntz"}]}
    strings = {"type": "array", "elementType": "string", "containsNull": True}
    schema = _schema(
        ("id", "long"), ("at", "timestamp"), ("local", "timestamp_ntz"), ("ats", array),
        ("inner", struct), ("notes", strings), ("day", "date"),
    )  # fmt: skip
    assert instant_columns(schema) == InstantColumns(("at", "local"), ("ats", "inner"))
    assert not instant_columns(_schema(("id", "long"), ("day", "date")))


def _action(path: str, **columns: Any) -> dict[str, Any]:
    return {"path": path, "num_records": 2, **columns}


def test_only_files_whose_statistics_do_not_prove_the_range_are_read() -> None:
    plain = InstantColumns(("at",), ())
    low, high = INT96_MIN_MICROS, INT96_MAX_MICROS
    actions = [
        _action("inside", **{"min.at": 0, "max.at": YEAR_2024}),
        _action("after_2262", **{"min.at": 0, "max.at": YEAR_3000}),
        _action("before_1677", **{"min.at": low - 5, "max.at": 0}),
        # statistics truncated to milliseconds may hide a value just past the bound
        _action("near_the_end", **{"min.at": 0, "max.at": high - STATISTICS_MARGIN_MICROS + 1}),
        _action("all_null", **{"min.at": None, "max.at": None, "null_count.at": 2}),
        _action("unparsed", **{"min.at": None, "max.at": None, "null_count.at": 0}),
        _action("no_statistics"),
    ]
    assert unproven_files(actions, plain) == [
        "after_2262", "before_1677", "near_the_end", "unparsed", "no_statistics",
    ]  # fmt: skip
    nested = InstantColumns(("at",), ("ats",))
    assert unproven_files(actions[:1], nested) == ["inside"]  # arrays have no statistics
    assert unproven_files(actions, InstantColumns((), ())) == []


def _int96_table(path: Path, micros: list[int]) -> str:
    """A Delta table of one file whose instants are INT96, as Spark's default writes
    them: no Arrow schema in the footer (with one, delta-rs reads the INT96 values as
    the microseconds it names and rewrites them right) and no statistics for them (pyarrow
    writes none for INT96)."""
    path.mkdir()
    rows = pa.table(
        {
            "id": pa.array(range(len(micros)), pa.int64()),
            "at": pa.array(micros, pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(
        rows, path / "part-0.parquet", use_deprecated_int96_timestamps=True, store_schema=False
    )
    convert_to_deltalake(str(path))
    return str(path)


def test_an_int96_file_with_instants_outside_the_range_is_named(tmp_path: Path) -> None:
    path = _int96_table(tmp_path / "old", [YEAR_2024, YEAR_3000, POSITIVE_INFINITY])
    wrong = wrong_instants(DeltaTable(path), {})
    assert wrong is not None
    assert "part-0.parquet" in wrong
    assert "column at" in wrong


def test_int96_files_inside_the_range_and_int64_files_outside_it_are_fine(
    tmp_path: Path,
) -> None:
    inside = _int96_table(tmp_path / "inside", [YEAR_2024, 0, INT96_MAX_MICROS])
    assert wrong_instants(DeltaTable(inside), {}) is None
    int64 = str(tmp_path / "int64")
    rows = pa.table({"at": pa.array([YEAR_3000, POSITIVE_INFINITY], pa.timestamp("us"))})
    write_deltalake(int64, rows)
    assert wrong_instants(DeltaTable(int64), {}) is None


def test_delta_rs_would_rewrite_such_instants_as_others(tmp_path: Path) -> None:
    """Why the driver leaves such a table alone: delta-rs's compaction of an INT96 file
    writes other instants (if delta-rs ever reads them right, this fails and
    apply.lake.legacy_instants can go)."""
    path = _int96_table(tmp_path / "old", [YEAR_3000])
    write_deltalake(path, pa.table({"id": [1], "at": pa.array([0], pa.timestamp("us", tz="UTC"))}),
                    mode="append")  # fmt: skip
    DeltaTable(path).optimize.compact()
    read = DeltaTable(path).to_pyarrow_table().column("at").cast(pa.int64()).to_pylist()
    assert YEAR_3000 not in read


def test_the_driver_leaves_a_table_with_such_instants_to_spark(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _int96_table(tmp_path / "old", [YEAR_2024, YEAR_3000])
    tables = DriverTables()
    with caplog.at_level(logging.WARNING, logger="apply.lake.driver_merge"):
        with pytest.raises(DriverMergeUnavailableError, match="INT96 instants in column at"):
            tables.read(path, TABLE)
        with pytest.raises(DriverMergeUnavailableError, match="INT96 instants") as refused:
            tables.at(path, 0)  # remembered at this version: not opened again
        with pytest.raises(DriverMergeUnavailableError, match="INT96 instants"):
            tables.read(path, TABLE)
    # One warning when found; the batches' own log of the refusal is a debug line.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "is written by Spark: file part-0.parquet holds INT96" in warnings[0]
    assert refused.value.reported
    with TABLE_LOCKS.held(path):
        assert compact_from_driver(path, 128 * 1024 * 1024, LOCAL) is None
    assert DeltaTable(path).version() == 0


def test_a_table_whose_old_files_were_rewritten_is_the_drivers_again(tmp_path: Path) -> None:
    path = _int96_table(tmp_path / "old", [YEAR_2024, YEAR_3000])
    tables = DriverTables()
    with pytest.raises(DriverMergeUnavailableError):
        tables.read(path, TABLE)
    # The rewrite docs/apply.md describes, done here by an overwrite that keeps the rows
    # exactly (read as microseconds, written as INT64).
    rows = pq.read_table(Path(path) / "part-0.parquet", coerce_int96_timestamp_unit="us")
    write_deltalake(path, rows, mode="overwrite")
    assert tables.at(path, 1).version() == 1


def test_a_file_read_once_is_not_read_again_while_it_is_live(tmp_path: Path) -> None:
    """A data file never changes, and on an object store each read is requests: a file
    whose instants were read and found right is read once a job."""
    path = tmp_path / "no_statistics"
    path.mkdir()
    rows = pa.table({"at": pa.array([YEAR_3000], pa.timestamp("us", tz="UTC"))})
    pq.write_table(rows, path / "part-0.parquet", write_statistics=False)
    convert_to_deltalake(str(path))
    table = DeltaTable(str(path))
    checked = CheckedFiles()
    assert wrong_instants(table, {}, checked) is None  # INT64: read, and right
    assert checked.of(str(table.table_uri)) == {"part-0.parquet": None}

    (path / "part-0.parquet").unlink()  # a read now would fail
    assert wrong_instants(table, {}, checked) is None
    with pytest.raises(FileNotFoundError, match=r"part-0\.parquet"):
        wrong_instants(table, {})


def test_a_check_that_cannot_read_a_file_leaves_the_table_to_spark(tmp_path: Path) -> None:
    path = tmp_path / "unreadable"
    path.mkdir()
    rows = pa.table({"at": pa.array([YEAR_2024], pa.timestamp("us", tz="UTC"))})
    pq.write_table(rows, path / "part-0.parquet", write_statistics=False)
    convert_to_deltalake(str(path))
    (path / "part-0.parquet").write_bytes(b"not parquet")
    with pytest.raises(DriverMergeUnavailableError, match="instants were not checked"):
        exact_instants(DeltaTable(str(path)), {})


def test_a_wrong_file_is_read_once_and_named_until_it_is_gone(tmp_path: Path) -> None:
    path = _int96_table(tmp_path / "old", [YEAR_3000])
    checked = CheckedFiles()
    first = wrong_instants(DeltaTable(path), {}, checked)
    assert first is not None
    assert checked.of(str(DeltaTable(path).table_uri)) == {"part-0.parquet": "at"}

    data = Path(path) / "part-0.parquet"
    kept = data.read_bytes()
    data.unlink()  # a read now would fail
    assert wrong_instants(DeltaTable(path), {}, checked) == first
    data.write_bytes(kept)

    # Rewritten (an overwrite removes it from the live files): forgotten, and the new
    # file is read.
    rows = pq.read_table(data, coerce_int96_timestamp_unit="us")
    write_deltalake(path, rows, mode="overwrite")
    table = DeltaTable(path)
    assert wrong_instants(table, {}, checked) is None
    assert "part-0.parquet" not in checked.of(str(table.table_uri))
