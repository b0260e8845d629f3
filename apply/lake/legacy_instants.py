"""Instants delta-rs would rewrite wrongly: INT96 values outside 1677-2262.

Spark writes instants as the legacy INT96 unless its session says otherwise (its
default, and Databricks'); apply's own session writes INT64 microseconds
(:mod:`apply.engine.spark_session`). delta-rs 1.6 reads INT96 as nanoseconds in 64 bits,
which hold only 1677-09-21 to 2262-04-11: a value outside (a BC year, a year after
2262, the contract's +-infinity sentinels) comes back as another instant, and a
delta-rs MERGE or compaction that rewrites the file writes that other instant back. A
table holds such files when it was written before apply's session wrote INT64
(2026-11-23), or when an operator's Spark session with the default rewrote it (an
``OPTIMIZE`` run elsewhere). The driver leaves such a table to Spark, which reads INT96
exactly, and Spark's compaction in apply's session rewrites the old files into INT64
ones over time (docs/apply.md, "Timestamps are INT64 microseconds").

Finding them costs nothing for a table without instants, and for the others one pass
over the statistics delta-rs already holds: a file is read only when its statistics do
not show its instants inside the range (an instant column past the table's indexed
columns, as apply's ``_cdc_commit_ts`` is in a table of more than 29 columns; an array
of instants; a value near or beyond the bounds). Then its footer says whether any column
is INT96, and only INT96 columns are read, as microseconds. A data file never changes
once written, so a file is not read again in the job (:class:`CheckedFiles`):
on an object store each read is a few requests, and a table is checked again after
every commit that is not the job's own (upkeep's compaction among them).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
from deltalake.fs import DeltaStorageHandler

INT96_MIN_MICROS = -(2**63) // 1000 + 1
"""The earliest instant, in microseconds since the epoch, that 64-bit nanoseconds hold
(1677-09-21T00:12:43.145225Z)."""
INT96_MAX_MICROS = (2**63 - 1) // 1000
"""The latest (2262-04-11T23:47:16.854775Z)."""
STATISTICS_MARGIN_MICROS = 1_000_000
"""How far inside the bounds a file's statistics must stay for the file to go unread:
Delta keeps instants' statistics truncated to milliseconds, so a maximum shown just
below the upper bound may stand for a value just above it."""

_INSTANT_TYPES = frozenset({"timestamp", "timestamp_ntz"})
_INT96 = "INT96"


@dataclass(frozen=True, slots=True)
class InstantColumns:
    """A table's columns that hold instants: ``plain`` ones (a top-level instant, whose
    statistics Delta may keep) and ``nested`` ones (arrays, maps or structs holding
    instants, which have none)."""

    plain: tuple[str, ...]
    nested: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.plain or self.nested)


def instant_columns(schema_json: str) -> InstantColumns:
    """The instant columns of a Delta schema, as its JSON (``schema().to_json()``)."""
    fields = json.loads(schema_json)["fields"]
    plain = tuple(f["name"] for f in fields if _is_instant(f["type"]))
    nested = tuple(
        f["name"] for f in fields if not _is_instant(f["type"]) and _holds_instant(f["type"])
    )
    return InstantColumns(plain, nested)


def _is_instant(data_type: Any) -> bool:
    return isinstance(data_type, str) and data_type in _INSTANT_TYPES


def _holds_instant(data_type: Any) -> bool:
    if isinstance(data_type, str):
        return _is_instant(data_type)
    kind = data_type.get("type")
    if kind == "array":
        return _holds_instant(data_type["elementType"])
    if kind == "map":
        return _holds_instant(data_type["keyType"]) or _holds_instant(data_type["valueType"])
    if kind == "struct":
        return any(_holds_instant(f["type"]) for f in data_type["fields"])
    return False


def unproven_files(actions: Sequence[Mapping[str, Any]], columns: InstantColumns) -> list[str]:
    """The files among ``actions`` (delta-rs's flattened add actions as rows: ``path``,
    ``num_records``, ``min.<column>``, ``max.<column>``, ``null_count.<column>``, instants
    as microseconds) whose statistics do not show every instant inside the range."""
    if not columns:
        return []
    if columns.nested:
        return [str(action["path"]) for action in actions]
    low = INT96_MIN_MICROS + STATISTICS_MARGIN_MICROS
    high = INT96_MAX_MICROS - STATISTICS_MARGIN_MICROS
    unproven = []
    for action in actions:
        for name in columns.plain:
            smallest, largest = action.get(f"min.{name}"), action.get(f"max.{name}")
            if smallest is None or largest is None:
                nulls, records = action.get(f"null_count.{name}"), action.get("num_records")
                if nulls is None or records is None or nulls < records:
                    unproven.append(str(action["path"]))  # values with no statistics
                    break
            elif smallest < low or largest > high:
                unproven.append(str(action["path"]))
                break
    return unproven


def outside_int96(values: Iterable[int | None]) -> bool:
    """Whether any instant (microseconds since the epoch; None for a null) lies where
    64-bit nanoseconds cannot hold it."""
    return any(
        value is not None and not INT96_MIN_MICROS <= value <= INT96_MAX_MICROS for value in values
    )


class CheckedFiles:
    """The data files of each table whose instants were read, by table location, each
    with what was found: None when delta-rs would rewrite them right, else the first
    column it would not. Only the table's live files are kept. A table left to Spark
    keeps its wrong file until something rewrites it, so its later checks read nothing.
    Safe for tables checked from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, dict[str, str | None]] = {}

    def of(self, location: str) -> Mapping[str, str | None]:
        with self._lock:
            return dict(self._files.get(location, {}))

    def keep(self, location: str, files: Mapping[str, str | None]) -> None:
        """``files`` are the table's checked files now (replacing the ones before)."""
        with self._lock:
            self._files[location] = dict(files)


def wrong_instants(
    table: Any, options: Mapping[str, str], checked: CheckedFiles | None = None
) -> str | None:
    """Why delta-rs would rewrite some instants of ``table`` (a ``deltalake.DeltaTable``)
    wrongly, naming a file and column to rewrite, or None when it would not; ``options``:
    the storage options ``table`` was opened with; ``checked``: the files read before,
    which are not read again, and where the files read now are added."""
    columns = instant_columns(table.schema().to_json())
    if not columns:
        return None
    rows = _rows(pa.table(table.get_add_actions(flatten=True)), columns)
    location = str(table.table_uri)
    known = checked.of(location) if checked is not None else {}
    live = {str(row["path"]) for row in rows}
    found = {path: column for path, column in known.items() if path in live}
    files = None
    try:
        for path in unproven_files(rows, columns):
            if path not in found:
                if files is None:
                    files = pafs.PyFileSystem(DeltaStorageHandler(location, dict(options)))
                found[path] = _int96_outside(files, path)
            column = found[path]
            if column is not None:
                return (
                    f"file {path} holds INT96 instants in column {column} outside "
                    "1677-09-21..2262-04-11, which delta-rs would rewrite as other instants"
                )
    finally:
        if checked is not None:
            checked.keep(location, found)
    return None


def _rows(actions: Any, columns: InstantColumns) -> list[dict[str, Any]]:
    """The add actions as rows, instants as microseconds since the epoch."""
    wanted = ["path", "num_records"] + [
        f"{kind}.{name}" for name in columns.plain for kind in ("min", "max", "null_count")
    ]
    kept = {}
    for name in wanted:
        if name in actions.column_names:
            column = actions.column(name)
            if pa.types.is_timestamp(column.type):
                column = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64())
            kept[name] = column
    return pa.table(kept).to_pylist() if kept else []


def _int96_outside(files: Any, path: str) -> str | None:
    """The first INT96 column of the data file at ``path`` with an instant outside the
    range, or None."""
    with files.open_input_file(path) as source:
        parquet = pq.ParquetFile(source, coerce_int96_timestamp_unit="us")
        schema = parquet.metadata.schema
        int96: list[str] = sorted(
            {
                str(schema.column(index).path).split(".")[0]
                for index in range(len(schema))
                if schema.column(index).physical_type == _INT96
            }
        )
        if not int96:
            return None
        try:
            read = parquet.read(columns=int96)
        except pa.ArrowInvalid:
            return int96[0]  # not even as microseconds: surely outside
    for name in int96:
        if outside_int96(_instants(read.column(name))):
            return name
    return None


def _instants(column: Any) -> Iterator[int | None]:
    """Every instant in ``column``, nested in lists, maps or structs or not, as
    microseconds."""
    data_type = column.type
    if pa.types.is_timestamp(data_type):
        bounds = pc.min_max(column.cast(pa.int64()))
        yield bounds["min"].as_py()
        yield bounds["max"].as_py()
    elif pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        yield from _instants(pc.list_flatten(column))
    elif pa.types.is_map(data_type):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        for chunk in chunks:
            yield from _instants(chunk.keys)
            yield from _instants(chunk.items)
    elif pa.types.is_struct(data_type):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        for chunk in chunks:
            for index in range(data_type.num_fields):
                yield from _instants(chunk.field(index))


__all__ = [
    "INT96_MAX_MICROS",
    "INT96_MIN_MICROS",
    "STATISTICS_MARGIN_MICROS",
    "CheckedFiles",
    "InstantColumns",
    "instant_columns",
    "outside_int96",
    "unproven_files",
    "wrong_instants",
]
