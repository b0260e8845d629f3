"""Copy-on-write against deletion vectors: what one MERGE commit costs each write mode.

Usage: ``.venv/bin/python -m bench.lake_write_modes [--rows 100000 1000000]
[--batches 10 1000 100000] [--keys random hot] [--modes delta-rs spark-cow spark-dv]
[--repeat 3] [--reads 3] [--file-rows N]``

For each table size (``--rows``) a ``pgbench_accounts``-shaped table (``aid`` int key,
``bid`` int, ``abalance`` int, ``filler`` char(84), plus apply's position and commit-time
columns) is written once as apply leaves it after upkeep's compaction: sorted by key, in
files of ``--file-rows`` rows (default 10,000,000: about what OPTIMIZE's 128 MB target
packs for this shape, 1.2 MB per 100,000 rows; so the default tables are one file each,
and a smaller ``--file-rows`` shows a table of several). For each batch of updates
by key (``--batches`` sizes times ``--keys`` distributions), each write mode MERGEs
``--repeat`` such batches, one commit each, into its own fresh copy of that table:

- ``random``: keys drawn uniformly over the whole table (pgbench's access pattern);
- ``hot``: keys drawn from the newest ``--hot-share`` of the table (1 % by default, at
  least the batch's size): recent rows are hot.

The write modes:

- **(a) delta-rs** (baseline): apply's driver writer, :func:`apply.lake.driver_merge.
  merge_rows` on a ``DeltaTable`` opened before the first commit and kept between
  commits, as :class:`~apply.lake.driver_merge.DriverTables` keeps it. Copy-on-write:
  every file a MERGE touches is rewritten whole;
- **(b) Spark, copy-on-write**: apply's Spark MERGE, :func:`apply.lake.spark_merge.
  merge_into`, with the table's ``delta.enableDeletionVectors=false`` (apply's default);
- **(c) Spark, deletion vectors**: the same MERGE on a copy given
  ``delta.enableDeletionVectors=true`` before the first commit: Delta marks the replaced
  rows deleted in a vector beside their file and writes only the changed rows.

Per commit: wall time of the MERGE call; CPU of this process and its descendants (the
Spark JVM) from ``/proc``, for every mode (apply's process always holds the JVM); bytes
and count of the new data files (the commit's ``add`` actions for paths it does not also
``remove``: a deletion-vector MERGE re-adds an untouched file with its new vector),
bytes of new deletion vectors, and rows copied (the commit's ``operationMetrics``). The
source batch is built before the clock starts (an Arrow table for delta-rs, a Spark
frame made from it for Spark): only the MERGE is timed, not apply's decoding.

After each mode's commits of a case: the bytes the table leaves on disk before VACUUM
(every file under its directory, log included: copy-on-write leaves the rewritten files
behind until VACUUM), and a full-scan read of the table as a reader pays it until an
OPTIMIZE purges the vectors, with delta-rs's DataFusion reader
(``QueryBuilder ... SELECT *``, every column; wall and CPU, median of ``--reads``), each
checked against the row count and balance sum the updates leave. Whether delta-rs's pyarrow reader
(``to_pyarrow_table``) reads the deletion-vector table is printed once.

A Spark MERGE is run on a scratch table first, so no mode pays the JVM's warm-up. Medians
over the repeats; every ratio is against (a) in the same run, same case. Everything runs
in one local Spark session (``local[2]``) with apply's configuration
(:mod:`apply.engine.spark_session`); ``--conf`` adds settings on top. The scratch
directory is deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any

from apply.lake.delta_log import commit_file
from bench.pipeline_run import process_cpu_s

SEED = 20261202
APP_ID = "bench-lake-write-modes"
FILLER = " " * 84
FIRST_LSN = 0x1_0000_0000
FIRST_TS = 1_795_000_000_000_000  # 2026-11-18, µs since 1970 UTC
DEFAULT_ROWS = (100_000, 1_000_000)
DEFAULT_BATCHES = (10, 1_000, 100_000)
DEFAULT_FILE_ROWS = 10_000_000
DEFAULT_HOT_SHARE = 0.01
ROWS_COPIED = ("numTargetRowsCopied", "num_target_rows_copied")
"""The name Spark's and delta-rs's MERGE give the rows they rewrote unchanged."""


class Mode(StrEnum):
    """How a batch reaches the table (module docstring)."""

    DELTA_RS = "delta-rs"
    SPARK_COW = "spark-cow"
    SPARK_DV = "spark-dv"

    @property
    def label(self) -> str:
        """The mode as the report prints it, with the module docstring's letter."""
        return LABELS[self]


LABELS = {
    Mode.DELTA_RS: "a delta-rs cow",
    Mode.SPARK_COW: "b spark cow",
    Mode.SPARK_DV: "c spark dv",
}


class Keys(StrEnum):
    """Which keys a batch updates (module docstring)."""

    RANDOM = "random"
    HOT = "hot"


# -- what a commit wrote (pure) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitWrites:
    """What one Delta commit added to the table's storage."""

    data_bytes: int
    """Bytes of the data files the commit added (not re-added with a new vector)."""
    data_files: int
    dv_bytes: int
    """Bytes of the deletion vectors the commit wrote to files (inline ones excluded)."""
    rows_copied: int | None
    """Target rows rewritten unchanged, from the commit's metrics; None when absent."""


def commit_writes(actions: Iterable[Mapping[str, Any]]) -> CommitWrites:
    """What the commit whose actions (one JSON object a line of its log file) are
    ``actions`` wrote. A data file is new unless the same commit removes its path: a
    deletion-vector MERGE removes a file and adds it back with its new vector, and that
    file's ``size`` was written long before."""
    adds: list[Mapping[str, Any]] = []
    removed: set[str] = set()
    rows_copied: int | None = None
    for action in actions:
        if "add" in action:
            adds.append(action["add"])
        elif "remove" in action:
            removed.add(action["remove"]["path"])
        elif "commitInfo" in action:
            metrics = action["commitInfo"].get("operationMetrics") or {}
            for name in ROWS_COPIED:
                if name in metrics:
                    rows_copied = int(metrics[name])
    new = [add for add in adds if add["path"] not in removed]
    vectors = [add["deletionVector"] for add in adds if add.get("deletionVector")]
    return CommitWrites(
        data_bytes=sum(int(add["size"]) for add in new),
        data_files=len(new),
        dv_bytes=sum(int(dv["sizeInBytes"]) for dv in vectors if dv["storageType"] != "i"),
        rows_copied=rows_copied,
    )


def read_commit(table: Path, version: int) -> CommitWrites:
    # Newline-delimited JSON: split on "\n" only (a string may hold U+2028 raw).
    lines = Path(commit_file(str(table), version)).read_text("utf-8").split("\n")
    return commit_writes(json.loads(line) for line in lines if line.strip())


def bytes_on_disk(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def jvm_cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds of ``pids`` so far; a process gone counts nothing."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += process_cpu_s(pid)
    return total


def ratio(value: float | None, baseline: float | None) -> str:
    if value is None or baseline is None or baseline <= 0:
        return "-"
    return f"{value / baseline:.2f}x"


# -- workload (pure) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    rows: int
    keys: Keys
    batch: int

    def __str__(self) -> str:
        return f"{self.rows:,} rows, {self.batch:,} {self.keys} keys"


def hot_range(rows: int, batch: int, share: float) -> int:
    """How many of the newest keys a hot batch draws from: ``share`` of the table, at
    least the batch, at most the table."""
    return min(rows, max(batch, int(rows * share)))


def batch_keys(case: Case, rng: random.Random, hot_share: float) -> list[int]:
    """``case.batch`` distinct keys of a table with keys 1..``case.rows``, sorted."""
    if case.batch > case.rows:
        raise ValueError(f"a batch of {case.batch:,} keys in a table of {case.rows:,} rows")
    if case.keys is Keys.HOT:
        low = case.rows - hot_range(case.rows, case.batch, hot_share) + 1
    else:
        low = 1
    return sorted(rng.sample(range(low, case.rows + 1), case.batch))


@dataclass
class Updates:
    """The batches of one case, the same for every mode, and what they leave."""

    batches: list[tuple[list[int], list[int]]] = field(default_factory=list)
    """Per commit: the keys and their new balances."""

    def balance_sum(self) -> int:
        final: dict[int, int] = {}
        for keys, balances in self.batches:
            final.update(zip(keys, balances, strict=True))
        return sum(final.values())


def updates_for(case: Case, repeat: int, hot_share: float) -> Updates:
    rng = random.Random(f"{SEED}-{case.rows}-{case.keys}-{case.batch}")
    updates = Updates()
    for _ in range(repeat):
        keys = batch_keys(case, rng, hot_share)
        updates.batches.append((keys, [rng.randint(-5000, 5000) for _ in keys]))
    return updates


# -- measurement ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitMeasure:
    wall_s: float
    cpu_s: float
    writes: CommitWrites


@dataclass(frozen=True, slots=True)
class ReadMeasure:
    wall_s: float
    cpu_s: float
    exact: bool


@dataclass
class CaseResult:
    commits: list[CommitMeasure]
    disk_bytes: int
    read: ReadMeasure

    def median(self, pick: Callable[[CommitMeasure], float]) -> float:
        return statistics.median(pick(commit) for commit in self.commits)

    def rows_copied(self) -> float | None:
        copied = [c.writes.rows_copied for c in self.commits if c.writes.rows_copied is not None]
        return statistics.median(copied) if copied else None


def accounts_columns() -> tuple[Any, ...]:
    """The ``pgbench_accounts``-shaped table's columns as apply plans them (module
    docstring)."""
    from pyspark.sql.types import IntegerType, StringType  # noqa: PLC0415 - pyspark is heavy

    from apply.lake.delta_schema import ColumnSpec  # noqa: PLC0415

    return (
        ColumnSpec("aid", IntegerType(), key=True),
        ColumnSpec("bid", IntegerType()),
        ColumnSpec("abalance", IntegerType()),
        ColumnSpec("filler", StringType()),
    )


def seed_accounts(path: Path, columns: Sequence[Any], rows: int, file_rows: int) -> None:
    """A table of ``rows`` rows at ``path`` with apply's table properties, sorted by key in
    files of ``file_rows`` rows, as upkeep's compaction leaves it (module docstring)."""
    import pyarrow as pa  # type: ignore[import-untyped]  # noqa: PLC0415
    from deltalake import DeltaTable, write_deltalake  # noqa: PLC0415

    from apply.lake.delta_schema import table_properties  # noqa: PLC0415
    from apply.lake.driver_plan import table_arrow_types  # noqa: PLC0415
    from apply.lake.tables import TableId  # noqa: PLC0415

    types = table_arrow_types(columns)
    schema = pa.schema([pa.field(name, arrow) for name, arrow in types.items()])
    DeltaTable.create(
        str(path),
        schema,
        configuration=table_properties(
            TableId("bench", "accounts"), ("aid",), deletion_vectors=False
        ),
        raise_if_key_not_exists=False,
    )
    for low in range(1, rows + 1, file_rows):
        keys = range(low, min(rows, low + file_rows - 1) + 1)
        count = len(keys)
        table = pa.table(
            {
                "aid": pa.array(keys, pa.int32()),
                "bid": pa.array([(k - 1) // 100_000 + 1 for k in keys], pa.int32()),
                "abalance": pa.array([0] * count, pa.int32()),
                "filler": pa.array([FILLER] * count, pa.string()),
                "_cdc_commit_lsn": pa.array([FIRST_LSN] * count, pa.int64()),
                "_cdc_ordinal": pa.array(keys, pa.int64()),
                "_cdc_commit_ts": pa.array([FIRST_TS] * count, types["_cdc_commit_ts"]),
            },
            schema=schema,
        )
        write_deltalake(str(path), table, mode="append")


def accounts_source(
    columns: Sequence[Any], keys: Sequence[int], balances: Sequence[int], lsn: int
) -> Any:
    """A batch of updates by key as apply's driver hands it to delta-rs (the columns of
    :func:`apply.lake.driver_merge.source_rows`)."""
    import pyarrow as pa  # noqa: PLC0415

    from apply.lake.driver_merge import SOURCE_OP, SOURCE_UNCHANGED  # noqa: PLC0415
    from apply.lake.driver_plan import table_arrow_types  # noqa: PLC0415

    types = table_arrow_types(columns)
    count = len(keys)
    return pa.table(
        {
            "aid": pa.array(keys, pa.int32()),
            "bid": pa.array([(k - 1) // 100_000 + 1 for k in keys], pa.int32()),
            "abalance": pa.array(balances, pa.int32()),
            "filler": pa.array([FILLER] * count, pa.string()),
            "_cdc_commit_lsn": pa.array([lsn] * count, pa.int64()),
            "_cdc_ordinal": pa.array(range(count), pa.int64()),
            "_cdc_commit_ts": pa.array(
                [FIRST_TS + lsn - FIRST_LSN] * count, types["_cdc_commit_ts"]
            ),
            SOURCE_OP: pa.array(["u"] * count, pa.string()),
            SOURCE_UNCHANGED: pa.array([[]] * count, pa.list_(pa.string())),
        }
    )


class Bench:
    """One Spark session, one scratch directory, every case and mode."""

    def __init__(self, arguments: argparse.Namespace, scratch: Path) -> None:
        from apply.engine.spark_jars import configured_jars  # noqa: PLC0415 - pyspark is heavy
        from apply.engine.spark_session import build_session  # noqa: PLC0415
        from apply.lake.delta_schema import ColumnPlan  # noqa: PLC0415
        from apply.settings import LakeSettings, SparkSettings  # noqa: PLC0415
        from bench.pipeline_run import ProcessTree  # noqa: PLC0415

        self.arguments = arguments
        self.scratch = scratch
        self.columns = accounts_columns()
        self.plan = ColumnPlan(self.columns, (), ("aid",), create=False)
        conf = {"spark.driver.memory": "2g", **dict(arguments.conf)}
        settings = SparkSettings(
            master="local[2]",
            app_name="bench-lake-write-modes",
            jars_dir=arguments.jars_dir,
            conf=conf,
        )
        self.spark = build_session(
            settings, configured_jars(settings), LakeSettings(root=str(scratch))
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        tree = ProcessTree(os.getpid())
        tree.sample()
        self.jvm_pids = [pid for pid in tree.cpu_s if pid != os.getpid()]

    def cpu_s(self) -> float:
        """CPU seconds so far of this process (every thread: delta-rs's too) and of the
        Spark JVM, read from ``/proc`` without walking the process table."""
        return time.process_time() + jvm_cpu_s(self.jvm_pids)

    # -- tables

    def seed(self, rows: int) -> Path:
        """The table of ``rows`` rows every case of that size copies (module docstring)."""
        path = self.scratch / f"seed-{rows}"
        seed_accounts(path, self.columns, rows, self.arguments.file_rows)
        return path

    def copy(self, seed: Path, mode: Mode, case: Case) -> Path:
        path = self.scratch / f"{case.rows}-{case.keys}-{case.batch}-{mode.name.lower()}"
        shutil.copytree(seed, path)
        if mode is Mode.SPARK_DV:
            self.spark.sql(
                f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                "('delta.enableDeletionVectors' = 'true')"
            )
        return path

    # -- sources

    def arrow_source(self, keys: Sequence[int], balances: Sequence[int], lsn: int) -> Any:
        """The batch as apply's driver hands it to delta-rs (``source_rows``' columns)."""
        return accounts_source(self.columns, keys, balances, lsn)

    def spark_source(self, arrow: Any) -> Any:
        """The same batch as Spark's MERGE takes it (:func:`apply.lake.spark_merge.
        source_schema`), made before the clock starts."""
        from pyspark.sql import functions as sf  # noqa: PLC0415

        from apply.lake.decode import COMMIT_LSN, COMMIT_TS, OP, ORDINAL, ROW, UNCHANGED  # noqa: PLC0415
        from apply.lake.driver_merge import SOURCE_OP, SOURCE_UNCHANGED  # noqa: PLC0415
        from apply.lake.spark_merge import MergeSource  # noqa: PLC0415

        flat = self.spark.createDataFrame(arrow)
        frame = flat.select(
            sf.col(SOURCE_OP).alias(OP),
            sf.col("_cdc_commit_lsn").alias(COMMIT_LSN),
            sf.col("_cdc_ordinal").alias(ORDINAL),
            sf.col("_cdc_commit_ts").alias(COMMIT_TS),
            sf.col(SOURCE_UNCHANGED).alias(UNCHANGED),
            sf.struct(*[sf.col(c.name) for c in self.columns]).alias(ROW),
        )
        return MergeSource(frame=frame, unchanged_columns=())

    # -- one case

    def run_case(self, seed: Path, mode: Mode, case: Case, updates: Updates) -> CaseResult:
        from deltalake import DeltaTable  # noqa: PLC0415

        from apply.lake.driver_merge import merge_rows, writable  # noqa: PLC0415
        from apply.lake.spark_merge import merge_into  # noqa: PLC0415
        from apply.lake.table_lock import TABLE_LOCKS  # noqa: PLC0415

        path = self.copy(seed, mode, case)
        version = DeltaTable(str(path)).version()
        driver_table = None
        if mode is Mode.DELTA_RS:
            driver_table = DeltaTable(str(path))
            writable(driver_table)
        commits = []
        for batch_id, (keys, balances) in enumerate(updates.batches):
            arrow = self.arrow_source(keys, balances, FIRST_LSN + batch_id + 1)
            metadata = json.dumps({"bench": APP_ID, "batch": batch_id})
            write: Callable[[], object]
            if driver_table is not None:
                write = partial(
                    merge_rows,
                    driver_table,
                    arrow,
                    path=str(path),
                    name="bench.accounts",
                    columns=self.columns,
                    key_columns=("aid",),
                    app_id=APP_ID,
                    batch_id=batch_id,
                    metadata=metadata,
                )
            else:
                write = partial(
                    merge_into,
                    self.spark,
                    path=str(path),
                    table="bench.accounts",
                    source=self.spark_source(arrow),
                    plan=self.plan,
                    truncate=None,
                    version_before=version,
                    app_id=APP_ID,
                    batch_id=batch_id,
                    metadata=metadata,
                )
            with TABLE_LOCKS.held(str(path)):
                cpu, start = self.cpu_s(), time.perf_counter()
                write()
                wall = time.perf_counter() - start
                cpu = self.cpu_s() - cpu
            if DeltaTable(str(path)).version() != version + 1:
                raise SystemExit(f"{mode} {case}: batch {batch_id} made no commit")
            version += 1
            commits.append(CommitMeasure(wall, cpu, read_commit(path, version)))
        read = self.read(path, case, updates)
        if not read.exact:
            raise SystemExit(f"{mode} {case}: the table does not hold what the batches left")
        return CaseResult(commits, bytes_on_disk(path), read)

    def read(self, path: Path, case: Case, updates: Updates) -> ReadMeasure:
        """A full scan, every column, with delta-rs's DataFusion reader (module docstring):
        the median of ``--reads`` scans, each checked."""
        import pyarrow as pa  # noqa: PLC0415
        import pyarrow.compute as pc  # type: ignore[import-untyped]  # noqa: PLC0415
        from deltalake import DeltaTable, QueryBuilder  # noqa: PLC0415

        walls, cpus, exact = [], [], True
        for _ in range(self.arguments.reads):
            cpu, start = self.cpu_s(), time.perf_counter()
            result = QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT * FROM t")
            table = pa.table(result.read_all())
            walls.append(time.perf_counter() - start)
            cpus.append(self.cpu_s() - cpu)
            total = pc.sum(table.column("abalance")).as_py() or 0
            exact &= table.num_rows == case.rows and total == updates.balance_sum()
            del table
        return ReadMeasure(statistics.median(walls), statistics.median(cpus), exact)

    def pyarrow_reads_vectors(self, seed: Path) -> str:
        """Whether delta-rs's pyarrow reader reads a table with deletion vectors."""
        from deltalake import DeltaTable  # noqa: PLC0415
        from deltalake.exceptions import DeltaError  # noqa: PLC0415

        probe = self.run_probe(seed)
        try:
            DeltaTable(str(probe)).to_pyarrow_table()
        except DeltaError as exc:
            return f"refused ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        return "read"

    def run_probe(self, seed: Path) -> Path:
        """A scratch copy of ``seed`` with deletion vectors, one Spark MERGE made: the
        JVM's warm-up, and a table with a vector for :meth:`pyarrow_reads_vectors`."""
        from apply.lake.spark_merge import merge_into  # noqa: PLC0415
        from apply.lake.table_lock import TABLE_LOCKS  # noqa: PLC0415

        case = Case(int(seed.name.split("-")[1]), Keys.RANDOM, 0)
        path = self.copy(seed, Mode.SPARK_DV, case)
        from deltalake import DeltaTable  # noqa: PLC0415

        version = DeltaTable(str(path)).version()
        arrow = self.arrow_source([1, 2, 3], [7, 8, 9], FIRST_LSN + 1)
        with TABLE_LOCKS.held(str(path)):
            merge_into(
                self.spark,
                path=str(path),
                table="bench.accounts",
                source=self.spark_source(arrow),
                plan=self.plan,
                truncate=None,
                version_before=version,
                app_id=APP_ID,
                batch_id=0,
                metadata="{}",
            )
        return path


# -- report ---------------------------------------------------------------------------------


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.2f}"


@dataclass(frozen=True, slots=True)
class Summary:
    """One mode's figures for one case: medians over its commits and reads."""

    wall_s: float
    cpu_s: float
    data_bytes: float
    data_files: float
    dv_bytes: float
    rows_copied: float | None
    disk_bytes: int
    read_s: float
    read_cpu_s: float

    @classmethod
    def of(cls, result: CaseResult) -> Summary:
        return cls(
            wall_s=result.median(lambda c: c.wall_s),
            cpu_s=result.median(lambda c: c.cpu_s),
            data_bytes=result.median(lambda c: c.writes.data_bytes),
            data_files=result.median(lambda c: c.writes.data_files),
            dv_bytes=result.median(lambda c: c.writes.dv_bytes),
            rows_copied=result.rows_copied(),
            disk_bytes=result.disk_bytes,
            read_s=result.read.wall_s,
            read_cpu_s=result.read.cpu_s,
        )


RATIOS = ("wall_s", "cpu_s", "data_bytes", "disk_bytes", "read_s")
"""The figures printed as ratios against the baseline mode."""


def report(results: Mapping[tuple[Case, Mode], CaseResult], baseline: Mode) -> None:
    header = (
        f"{'rows':>10} {'keys':>6} {'batch':>7} {'mode':<15} {'wall ms':>8} {'cpu ms':>8} "
        f"{'new MB':>8} {'files':>5} {'dv B':>7} {'copied':>9} {'disk MB':>8} "
        f"{'read ms':>8} {'rd cpu':>7} {'wall':>6} {'cpu':>6} {'new':>6} {'disk':>6} {'read':>6}"
    )
    print(header)
    print("-" * len(header))
    for (case, mode), result in results.items():
        mine = Summary.of(result)
        base = results.get((case, baseline))
        theirs = Summary.of(base) if base is not None else None
        ratios = " ".join(
            f"{ratio(getattr(mine, name), getattr(theirs, name) if theirs else None):>6}"
            for name in RATIOS
        )
        copied = "-" if mine.rows_copied is None else f"{mine.rows_copied:,.0f}"
        print(
            f"{case.rows:>10,} {case.keys:>6} {case.batch:>7,} {mode.label:<15} "
            f"{mine.wall_s * 1e3:>8.0f} {mine.cpu_s * 1e3:>8.0f} {_mb(mine.data_bytes):>8} "
            f"{mine.data_files:>5.0f} {mine.dv_bytes:>7,.0f} {copied:>9} "
            f"{_mb(mine.disk_bytes):>8} {mine.read_s * 1e3:>8.0f} {mine.read_cpu_s * 1e3:>7.0f} "
            f"{ratios}"
        )


def _conf(value: str) -> tuple[str, str]:
    key, sep, setting = value.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--conf takes KEY=VALUE, not {value!r}")
    return key, setting


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lake_write_modes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--rows", type=int, nargs="+", default=list(DEFAULT_ROWS), help="table sizes (rows)"
    )
    parser.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=list(DEFAULT_BATCHES),
        help="batch sizes (updated keys per commit)",
    )
    parser.add_argument(
        "--keys",
        type=Keys,
        nargs="+",
        default=list(Keys),
        choices=list(Keys),
        help="key distributions",
    )
    parser.add_argument(
        "--modes",
        type=Mode,
        nargs="+",
        default=list(Mode),
        choices=list(Mode),
        help="write modes (the first is the baseline of the ratios)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="commits per case and mode")
    parser.add_argument(
        "--reads",
        type=int,
        default=3,
        help="full-scan reads of each table after its commits (median)",
    )
    parser.add_argument(
        "--file-rows",
        type=int,
        default=DEFAULT_FILE_ROWS,
        help="rows per data file of the table before the batches",
    )
    parser.add_argument(
        "--hot-share",
        type=float,
        default=DEFAULT_HOT_SHARE,
        help="share of the newest keys a hot batch draws from",
    )
    parser.add_argument("--jars-dir", default=None, help="Spark jars (default: make jars')")
    parser.add_argument(
        "--conf",
        type=_conf,
        action="append",
        default=[],
        help="a Spark setting KEY=VALUE on top of apply's",
    )
    parser.add_argument("--scratch", default=None, help="directory for the tables")
    arguments = parser.parse_args(argv)
    if min(arguments.repeat, arguments.reads, arguments.file_rows) < 1:
        parser.error("--repeat, --reads and --file-rows must be at least 1")
    return arguments


def main(argv: Sequence[str] | None = None) -> None:
    from bench.pipeline_run import load_average, machine, say  # noqa: PLC0415

    arguments = parse_arguments(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-write-modes-", dir=arguments.scratch))
    started = time.monotonic()
    try:
        say(f"machine: {machine()}, load {load_average()}")
        bench = Bench(arguments, scratch)
        results: dict[tuple[Case, Mode], CaseResult] = {}
        for rows in arguments.rows:
            seed = bench.seed(rows)
            files = len(list(seed.glob("*.parquet")))
            say(f"table of {rows:,} rows: {files} files, {bytes_on_disk(seed) / 1e6:.1f} MB")
            if rows == arguments.rows[0]:
                say(
                    f"delta-rs's pyarrow reader on deletion vectors: "
                    f"{bench.pyarrow_reads_vectors(seed)}"
                )
            for keys in arguments.keys:
                for batch in arguments.batches:
                    if batch > rows:
                        continue
                    case = Case(rows, keys, batch)
                    updates = updates_for(case, arguments.repeat, arguments.hot_share)
                    for mode in arguments.modes:
                        results[(case, mode)] = bench.run_case(seed, mode, case, updates)
                        say(f"{case}, {mode}: done")
                    for path in scratch.glob(f"{rows}-{keys}-{batch}-*"):
                        shutil.rmtree(path)
        say(f"load {load_average()}, {time.monotonic() - started:.0f} s in all")
        print(
            f"medians over {arguments.repeat} commits; CPU = this process + the Spark JVM; "
            f"ratios against {arguments.modes[0].label}; new MB = data files the commit added; "
            "disk MB = the table after the commits, before VACUUM; read = median of "
            f"{arguments.reads} full scans (delta-rs QueryBuilder)"
        )
        report(results, arguments.modes[0])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
