"""A day of commits on one table, sped up: does the lake stay as cheap and as small?

``python -m bench.lake_soak --commits 20000 --charts docs/charts/lake_soak`` drives
apply's own route for one table, commit after commit, as fast as it goes, with no Kafka
and no PostgreSQL: 20,000 commits are a day at apply's 5 s trigger.

The table is shaped like ``pgbench_accounts`` (``aid`` key, ``bid``, ``abalance``,
``filler``), ``--rows`` rows (100,000) loaded by a first batch of INSERTs. Each later
commit is one batch of ``--min-changes`` to ``--max-changes`` changes (50 to 500) spread
over the keys, about 80 % UPDATEs, 10 % INSERTs of new keys and 10 % DELETEs, encoded
as capture publishes them (:class:`schemas.change_record.ChangeEncoder`) on three
partitions, and handed to :func:`apply.batch.table.apply_table` as a batch the driver
holds, exactly as :mod:`apply.batch.micro_batch` hands it: read, plan, the driver's
MERGE with delta-rs (:func:`apply.batch.write.merge_from_driver`, one commit with the
batch's state as ``userMetadata`` and the ``txn`` action), then
:func:`apply.batch.write.after_commit` (the commits flushed, the table remembered, the
upkeep due: a compaction every ``compact_every_commits``, delta-rs's for this table,
VACUUM LITE every ``vacuum_every_commits``, at the turns :mod:`apply.lake.upkeep` offsets
by the table's name). Spark (a local session built by
:func:`apply.engine.spark_session.build_session`) does what apply does with it: MERGEs the
load (a batch Spark's source hands over, so the bench builds it as a DataFrame) and runs
the vacuums. Every later batch is the driver's, the one after an upkeep commit or a
restart included (the driver then reads the table with delta-rs,
:meth:`apply.lake.driver_merge.DriverTables.read`); each gets a frame that fails any Spark
job reading it, so a batch leaving the driver's route can never be written from an
empty frame unnoticed. Every ``--restart-every`` commits the job's memory is dropped (a
new :class:`~apply.lake.known_tables.KnownTables` and
:class:`~apply.lake.driver_merge.DriverTables`): the next batch reads the table from Delta
as a restarted job does.

**Measured.** Each commit's wall time and CPU (this process, delta-rs's threads
included, plus Spark's JVM); every ``--sample-every`` commits: the live file count (the
files the newest version references, delta-rs), the ``_delta_log`` file count and
bytes, the newest checkpoint's bytes and its ``add``/``remove`` rows, and the data
files on disk (count and bytes).

**Correctness after cleanup.** The bench keeps the row count and the sum of
``abalance`` the source holds after every commit, and checks them against:

- a **fresh open** at every sample (``DeltaTable(path)``, as a restarted job or a new
  reader opens the table: the newest checkpoint and the commits after it);
- **readers holding an old version**: one opened right after the load, and one opened
  every quarter of the file retention, each read again at every sample while its age
  is within 80 % of ``delta.deletedFileRetentionDuration`` (Delta's contract: a
  snapshot keeps its files that long; older ones are dropped, not read);
- **a time-travel open** (``DeltaTable(path, version=v)``) of the oldest held reader's
  version, which needs the log from a checkpoint at or before ``v``;
- **verify's read**, every ``--verify-every`` commits: ``pipeline verify`` opens the
  table at its newest version with Spark (:func:`pipeline.verify.lake.open_table`) and
  reads that version through a round; the bench reads it one interval later.

**Retention.** Delta's retentions are durations (``delta.logRetentionDuration``, 30
days; ``delta.deletedFileRetentionDuration``, 7 days), and a day of commits sped up to
under an hour lets neither elapse: with apply's defaults nothing is cleaned in the run
and every measure grows. So the soak table gets retentions of minutes,
``--file-retention-minutes`` (5) and ``--log-retention-minutes`` (15; 0 for either keeps
the default), and the bench's own session turns off Spark's refusal to VACUUM below 7
days (``spark.databricks.delta.retentionDurationCheck.enabled``): retentions the soak
compresses like its commits, never settings for a real table. Keep the log retention
longer than the time between two vacuums (``--vacuum-every`` commits): VACUUM LITE
finds the files to delete in the commits since the previous vacuum, and refuses when
the log no longer holds them (docs/benchmarks.md, "A day of commits on one table",
says what apply then does). What a real day gives with the defaults follows from the
growth per commit the report prints, measured before anything is cleaned.

**Bounded**, for a measure sampled through the run: the largest sample in the last
quarter of the run is at most the largest in the second quarter times 1.1 (the first
quarter is the warm-up: the table's first compaction, the first retention period).
A measure that grows steadily fails it: the last quarter's maximum is then about 1.5
times the second's. **Cost**: the median wall time of the last ``--window`` commits (1,000)
over the first's, target at most 1.2; the same for CPU per commit.
"""

from __future__ import annotations

import argparse
import bisect
import logging
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from apply.batch.context import ApplyContext
from apply.batch.table import apply_table
from apply.lake.decode import RECORD_COLUMNS, survey_held
from apply.lake.driver_merge import DriverTables
from apply.lake.driver_plan import CollectedRecord
from apply.lake.known_tables import KnownTables
from apply.lake.tables import TableId, table_path
from apply.lake.upkeep import TableUpkeep
from apply.settings import LakeSettings, SparkSettings, UpkeepSettings
from bench.pipeline_run import PREFIX, ProcessTree, load_average, machine, say
from schemas import column_type as ct
from schemas.change_record import (
    Change,
    ChangeEncoder,
    Column,
    TableDescription,
    build_table_schemas,
)
from schemas.lsn import Lsn
from schemas.naming import table_topic
from schemas.operation import Operation

TABLE = TableId("public", "pgbench_accounts")
TOPIC = table_topic(PREFIX, TABLE.schema, TABLE.table)
COLUMNS = (
    Column("aid", ct.INT, nullable=False, key=True),
    Column("bid", ct.INT),
    Column("abalance", ct.INT),
    Column("filler", ct.STRING),
)
PARTITIONS = 3
TXN_APP_ID = "bench-lake-soak"
FILLER = " " * 84
"""pgbench's ``filler char(84)``, blank as pgbench leaves it."""
TRIGGER_US = 5_000_000
"""Commit timestamps step by apply's default trigger, so the commits read as a day."""
BOUND_FACTOR = 1.1
COST_TARGET = 1.2
READER_AGE_FRACTION = 0.8
"""A held reader is read while its age is within this share of the file retention."""
DEFAULT_FILE_RETENTION_S = 7 * 24 * 3600.0
"""Delta's ``delta.deletedFileRetentionDuration`` when a table does not set it."""
_LOG = "_delta_log"
_SPARK_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"


@dataclass(frozen=True, slots=True)
class Totals:
    """What the source table holds after a commit: the figures every read is checked on."""

    rows: int
    balance: int


class Workload:
    """The source table and the changes made to it, one batch a commit, seeded.

    Keys are drawn uniformly from the live ones, so a batch touches rows all over the
    table, as pgbench does; a DELETE never names a key that is gone, an INSERT always a
    new one (above every key so far)."""

    def __init__(self, rows: int, seed: int) -> None:
        self._random = random.Random(seed)
        self._keys = list(range(1, rows + 1))
        self._index = {key: key - 1 for key in self._keys}
        self._balance = dict.fromkeys(self._keys, 0)
        self._next_key = rows + 1
        self._sum = 0
        self._commit = 0

    @property
    def totals(self) -> Totals:
        return Totals(len(self._keys), self._sum)

    def load(self) -> list[Change]:
        """The table's initial rows, as one transaction of INSERTs (``pgbench -i``)."""
        return [
            self._change(Operation.INSERT, ordinal, key, after=self._row(key))
            for ordinal, key in enumerate(self._keys)
        ]

    def batch(self, low: int, high: int) -> list[Change]:
        """The next commit's changes, one transaction of ``low`` to ``high``."""
        self._commit += 1
        changes = []
        for ordinal in range(self._random.randint(low, high)):
            draw = self._random.random()
            if draw < 0.1 and len(self._keys) > 1:
                key = self._keys[self._random.randrange(len(self._keys))]
                changes.append(
                    self._change(
                        Operation.DELETE, ordinal, key, before={"aid": key}, before_key_only=True
                    )
                )
                self._remove(key)
            elif draw < 0.2:
                key = self._next_key
                self._next_key += 1
                self._add(key)
                changes.append(self._change(Operation.INSERT, ordinal, key, after=self._row(key)))
            else:
                key = self._keys[self._random.randrange(len(self._keys))]
                delta = self._random.randint(-5000, 5000)
                self._balance[key] += delta
                self._sum += delta
                changes.append(self._change(Operation.UPDATE, ordinal, key, after=self._row(key)))
        return changes

    def _row(self, key: int) -> dict[str, Any]:
        return {"aid": key, "bid": 1, "abalance": self._balance[key], "filler": FILLER}

    def _change(self, op: Operation, ordinal: int, key: int, **images: Any) -> Change:
        lsn = 0x1_0000_0000 + self._commit * 0x10_0000
        return Change(
            op,
            Lsn(lsn),
            Lsn(lsn + ordinal),
            1000 + self._commit,
            1_767_225_600_000_000 + self._commit * TRIGGER_US,
            ordinal,
            **images,
        )

    def _add(self, key: int) -> None:
        self._index[key] = len(self._keys)
        self._keys.append(key)
        self._balance[key] = 0

    def _remove(self, key: int) -> None:
        # Swap with the last key, so a delete costs O(1) in a 100,000-key list.
        at = self._index.pop(key)
        last = self._keys.pop()
        if last != key:
            self._keys[at] = last
            self._index[last] = at
        self._sum -= self._balance.pop(key)


class Expected:
    """The source's totals by Delta version: a version without an apply commit (upkeep's
    OPTIMIZE and VACUUM, a property set) holds what the apply commit before it held."""

    def __init__(self) -> None:
        self._versions: list[int] = []
        self._totals: list[Totals] = []

    def record(self, version: int, totals: Totals) -> None:
        if self._versions and version <= self._versions[-1]:
            raise ValueError(f"version {version} recorded after {self._versions[-1]}")
        self._versions.append(version)
        self._totals.append(totals)

    def at(self, version: int) -> Totals:
        index = bisect.bisect_right(self._versions, version) - 1
        if index < 0:
            raise KeyError(f"no apply commit at or before version {version}")
        return self._totals[index]


def bounded(values: Sequence[float], factor: float = BOUND_FACTOR) -> bool | None:
    """Whether the largest value of the last quarter is at most ``factor`` times the
    largest of the second quarter (module docstring); None with fewer than 8 samples."""
    if len(values) < 8:
        return None
    quarter = len(values) // 4
    second = values[quarter : 2 * quarter]
    last = values[len(values) - quarter :]
    return max(last) <= factor * max(second)


def median_ratio(first: Sequence[float], last: Sequence[float]) -> float | None:
    """The median of ``last`` over the median of ``first``; None when either is empty."""
    if not first or not last:
        return None
    base = statistics.median(first)
    return None if base <= 0 else statistics.median(last) / base


def parse_interval_s(value: str | None) -> float | None:
    """Seconds of a Delta interval property (``interval 10 minutes``); None for none."""
    if value is None:
        return None
    parts = value.split()
    if len(parts) != 3 or parts[0].lower() != "interval":
        raise ValueError(f"{value!r} is not a Delta interval")
    units = {"second": 1, "minute": 60, "hour": 3600, "day": 86_400, "week": 604_800}
    unit = parts[2].lower().removesuffix("s")
    if unit not in units:
        raise ValueError(f"{value!r}: unknown unit {parts[2]!r}")
    return int(parts[1]) * float(units[unit])


@dataclass(frozen=True, slots=True)
class LogFootprint:
    """What ``_delta_log`` holds on disk."""

    commits: int
    """Commit files (``<version>.json``)."""
    files: int
    """Every file, checkpoints and ``_last_checkpoint`` included."""
    bytes: int
    checkpoint_version: int | None
    checkpoint_bytes: int
    """The newest checkpoint's bytes, all its parts."""
    checkpoint_parts: tuple[Path, ...]


def log_footprint(table: Path) -> LogFootprint:
    """The log of the table at ``table``, from a listing of its directory."""
    commits = files = size = 0
    checkpoints: dict[int, list[tuple[Path, int]]] = {}
    with os.scandir(table / _LOG) as entries:
        for entry in entries:
            if not entry.is_file():
                continue
            entry_bytes = entry.stat().st_size
            files += 1
            size += entry_bytes
            name = entry.name
            if name.endswith(".json") and name[:20].isdigit() and len(name) == 25:
                commits += 1
            elif ".checkpoint" in name and name.endswith(".parquet") and name[:20].isdigit():
                checkpoints.setdefault(int(name[:20]), []).append((Path(entry.path), entry_bytes))
    newest = max(checkpoints, default=None)
    parts = [] if newest is None else sorted(checkpoints[newest])
    return LogFootprint(
        commits=commits,
        files=files,
        bytes=size,
        checkpoint_version=newest,
        checkpoint_bytes=sum(b for _, b in parts),
        checkpoint_parts=tuple(p for p, _ in parts),
    )


def data_footprint(table: Path) -> tuple[int, int]:
    """Data files on disk under ``table`` (the log left out): count and bytes, referenced
    or not, so files VACUUM has yet to delete count."""
    count = size = 0
    for directory, subdirectories, names in os.walk(table):
        if directory == str(table):
            subdirectories[:] = [d for d in subdirectories if d != _LOG]
        for name in names:
            if name.endswith(".parquet"):
                count += 1
                size += os.path.getsize(os.path.join(directory, name))
    return count, size


@dataclass(frozen=True, slots=True)
class Sample:
    """The lake after commit ``commit``."""

    commit: int
    at_s: float
    """Seconds since the soak's first commit."""
    version: int
    live_files: int
    log: LogFootprint
    checkpoint_adds: int
    checkpoint_removes: int
    data_files: int
    data_bytes: int


@dataclass
class Checks:
    """Reads checked against the source's totals: how many, and what failed."""

    done: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    oldest_reader_s: float = 0.0
    oldest_reader_commits: int = 0

    def passed(self, kind: str) -> None:
        self.done[kind] = self.done.get(kind, 0) + 1

    def failed(self, kind: str, what: str) -> None:
        self.failures.append(f"{kind}: {what}")


@dataclass
class HeldReader:
    """A delta-rs snapshot opened at ``commit`` and kept, as a long query keeps its own."""

    table: Any
    version: int
    commit: int
    opened: float
    """``time.monotonic()`` when opened."""


def _totals_of(table: Any) -> Totals:
    import pyarrow.compute as pc  # type: ignore[import-untyped]  # noqa: PLC0415

    balances = table.to_pyarrow_table(columns=["abalance"]).column("abalance")
    total = pc.sum(balances).as_py()
    return Totals(len(balances), 0 if total is None else int(total))


def _cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds of ``pids`` so far (utime + stime, ``/proc``): Spark's JVM."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _checkpoint_rows(parts: Sequence[Path]) -> tuple[int, int]:
    """``add`` and ``remove`` rows of a checkpoint: the live files and the tombstones
    kept for the file retention."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # noqa: PLC0415

    adds = removes = 0
    for part in parts:
        table = pq.read_table(part, columns=["add", "remove"])
        adds += len(table) - table.column("add").null_count
        removes += len(table) - table.column("remove").null_count
    return adds, removes


@dataclass
class UpkeepRuns:
    """Each upkeep run by operation, True for a failed one (apply's ``UpkeepObserver``)."""

    runs: dict[str, list[bool]] = field(default_factory=dict)

    def upkeep(self, table: str, operation: str, duration_s: float, *, failed: bool) -> None:
        self.runs.setdefault(operation, []).append(failed)


class Soak:
    """One run: the Spark session, apply's context, the source and what is measured."""

    def __init__(self, arguments: argparse.Namespace, lake_root: Path) -> None:
        from apply.engine.spark_jars import configured_jars  # noqa: PLC0415 - pyspark is heavy
        from apply.engine.spark_session import build_session  # noqa: PLC0415

        self.arguments = arguments
        self.lake_root = str(lake_root)
        self.path = table_path(self.lake_root, TABLE)
        conf = {
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.driver.memory": "2g",
        }
        if arguments.file_retention_minutes > 0:
            conf[_SPARK_RETENTION_CHECK] = "false"
        spark_settings = SparkSettings(
            master="local[2]", app_name="bench-lake-soak", jars_dir=arguments.jars_dir, conf=conf
        )
        self.spark = build_session(
            spark_settings, configured_jars(spark_settings), LakeSettings(root=self.lake_root)
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        self.upkeep = UpkeepRuns()
        schemas = build_table_schemas(TableDescription(TABLE.schema, TABLE.table, COLUMNS))
        self.encoder = ChangeEncoder(schemas)
        self.context = ApplyContext(
            lake_root=self.lake_root,
            txn_app_id=TXN_APP_ID,
            writer_schemas={schemas.value_fingerprint: schemas.value_schema_json},
            parallelism=1,
            upkeep=TableUpkeep(
                UpkeepSettings(
                    compact_every_commits=arguments.compact_every,
                    vacuum_every_commits=arguments.vacuum_every,
                ),
                observer=self.upkeep,
            ),
            known=KnownTables(),
            driver_write_records=20_000,
            driver_tables=DriverTables(),
        )
        self.workload = Workload(arguments.rows, arguments.seed)
        self.expected = Expected()
        self.offsets = [0] * PARTITIONS
        self.refusing = self._refusing_frame()
        tree = ProcessTree(os.getpid())
        tree.sample()
        self.jvm_pids = [pid for pid in tree.cpu_s if pid != os.getpid()]
        self.wall_s: list[float] = []
        self.cpu_s: list[float] = []
        self.spark_route: list[int] = []
        self.samples: list[Sample] = []
        self.checks = Checks()
        self.readers: list[HeldReader] = []
        self.file_retention_s = DEFAULT_FILE_RETENTION_S
        self.verify_pending: tuple[Any, int] | None = None
        self.started = time.monotonic()

    def _refusing_frame(self) -> Any:
        """A batch frame any Spark job fails on: handed to apply for a batch the driver
        writes, so a batch that left the driver's route cannot be MERGEd from nothing."""
        from pyspark.sql import functions as sf  # noqa: PLC0415

        failing = sf.raise_error(sf.lit("lake soak: this batch was meant for the driver"))
        return self.spark.range(1).select(
            failing.cast("string").alias("topic"),
            failing.cast("int").alias("partition"),
            failing.cast("long").alias("offset"),
            failing.cast("binary").alias("value"),
        )

    def _held(self, changes: Sequence[Change]) -> list[tuple[str, int, int, bytes]]:
        held = []
        for change in changes:
            image = change.after if change.after is not None else change.before
            assert image is not None  # the workload makes no TRUNCATE
            partition = int(image["aid"]) % PARTITIONS
            held.append(
                (TOPIC, partition, self.offsets[partition], self.encoder.encode_value(change))
            )
            self.offsets[partition] += 1
        return held

    def _frame(self, held: Sequence[tuple[str, int, int, bytes]]) -> Any:
        from pyspark.sql.types import (  # noqa: PLC0415
            BinaryType,
            IntegerType,
            LongType,
            StringType,
            StructField,
            StructType,
        )

        schema = StructType(
            [
                StructField(RECORD_COLUMNS[0], StringType()),
                StructField(RECORD_COLUMNS[1], IntegerType()),
                StructField(RECORD_COLUMNS[2], LongType()),
                StructField(RECORD_COLUMNS[3], BinaryType()),
            ]
        )
        return self.spark.createDataFrame(list(held), schema)

    def commit(self, batch_id: int, changes: Sequence[Change]) -> None:
        """One batch through apply's route for the table; timed, and its totals kept."""
        held = self._held(changes)
        survey = survey_held(held)[TOPIC]
        collected = [CollectedRecord(p, o, v) for _, p, o, v in held]
        by_spark = batch_id == 0
        frame = self._frame(held) if by_spark else self.refusing
        wall, cpu, jvm = time.perf_counter(), time.process_time(), _cpu_s(self.jvm_pids)
        result = apply_table(
            self.spark,
            frame,
            batch_id,
            survey,
            self.context,
            collected=None if batch_id == 0 else collected,
        )
        jvm = _cpu_s(self.jvm_pids) - jvm
        cpu = time.process_time() - cpu + jvm
        wall = time.perf_counter() - wall
        if result is None or not result.committed:
            raise SystemExit(f"bench: batch {batch_id} committed nothing")
        self.expected.record(result.version, self.workload.totals)
        if batch_id > 0:
            self.wall_s.append(wall)
            self.cpu_s.append(cpu)
            if by_spark:
                self.spark_route.append(batch_id)

    def load(self) -> None:
        say(f"loading {self.arguments.rows} rows (a batch MERGEd by Spark; creates the table)")
        self.commit(0, self.workload.load())
        properties = {
            "delta.logRetentionDuration": self.arguments.log_retention_minutes,
            "delta.deletedFileRetentionDuration": self.arguments.file_retention_minutes,
        }
        settings = ", ".join(
            f"'{name}' = 'interval {minutes} minutes'"
            for name, minutes in properties.items()
            if minutes > 0
        )
        if settings:
            self.spark.sql(f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES ({settings})")
        from deltalake import DeltaTable  # noqa: PLC0415

        table = DeltaTable(self.path)
        configured = parse_interval_s(
            table.metadata().configuration.get("delta.deletedFileRetentionDuration")
        )
        self.file_retention_s = configured or DEFAULT_FILE_RETENTION_S
        self.readers.append(HeldReader(table, table.version(), 0, time.monotonic()))
        self.started = time.monotonic()

    def run(self) -> None:
        arguments = self.arguments
        for batch_id in range(1, arguments.commits + 1):
            self.commit(batch_id, self.workload.batch(arguments.min_changes, arguments.max_changes))
            if batch_id % arguments.restart_every == 0:
                self.context = replace(
                    self.context, known=KnownTables(), driver_tables=DriverTables()
                )
            if batch_id % arguments.verify_every == 0:
                self._verify_read(batch_id)
            if batch_id % arguments.sample_every == 0 or batch_id == arguments.commits:
                self._sample(batch_id)

    def _check(self, kind: str, read: Callable[[], Totals], version: int) -> None:
        """Read ``version`` with ``read`` and compare it with what the source held."""
        try:
            found = read()
        except Exception as exc:  # any failure to read is the finding
            self.checks.failed(kind, f"version {version} did not read: {exc}")
            return
        wanted = self.expected.at(version)
        if found != wanted:
            self.checks.failed(kind, f"version {version} read {found}, the source held {wanted}")
        else:
            self.checks.passed(kind)

    def _verify_read(self, batch_id: int) -> None:
        """Read the version verify opened one interval ago, then open the newest."""
        from pyspark.sql import functions as sf  # noqa: PLC0415

        from pipeline.verify.lake import open_table  # noqa: PLC0415

        if self.verify_pending is not None:
            frame, version = self.verify_pending

            def read() -> Totals:
                row = frame.agg(sf.count("*"), sf.sum("abalance")).head()
                return Totals(int(row[0]), int(row[1] or 0))

            self._check("verify's read", read, version)
        lake = open_table(self.spark, self.lake_root, TABLE)
        assert lake is not None
        self.verify_pending = (lake.frame, lake.version)

    def _sample(self, batch_id: int) -> None:
        from deltalake import DeltaTable  # noqa: PLC0415

        fresh = DeltaTable(self.path)
        version = fresh.version()
        self._check("fresh open", lambda: _totals_of(fresh), version)
        now = time.monotonic()
        limit = READER_AGE_FRACTION * self.file_retention_s
        self.readers = [r for r in self.readers if now - r.opened <= limit]
        for reader in self.readers:
            self._check("held reader", partial(_totals_of, reader.table), reader.version)
            age = now - reader.opened
            if age > self.checks.oldest_reader_s:
                self.checks.oldest_reader_s = age
                self.checks.oldest_reader_commits = batch_id - reader.commit
        if self.readers:
            oldest = self.readers[0]
            self._check(
                "time travel",
                lambda: _totals_of(DeltaTable(self.path, version=oldest.version)),
                oldest.version,
            )
        if not self.readers or now - self.readers[-1].opened >= self.file_retention_s / 4:
            self.readers.append(HeldReader(fresh, version, batch_id, now))
        log = log_footprint(Path(self.path))
        adds, removes = _checkpoint_rows(log.checkpoint_parts)
        data_files, data_bytes = data_footprint(Path(self.path))
        sample = Sample(
            commit=batch_id,
            at_s=now - self.started,
            version=version,
            live_files=len(fresh.file_uris()),
            log=log,
            checkpoint_adds=adds,
            checkpoint_removes=removes,
            data_files=data_files,
            data_bytes=data_bytes,
        )
        self.samples.append(sample)
        window = self.wall_s[-self.arguments.sample_every :]
        say(
            f"commit {batch_id}: version {version}, median {statistics.median(window) * 1000:.0f}"
            f" ms, live files {sample.live_files}, log {log.files} files "
            f"{log.bytes / 1024**2:.1f} MiB, checkpoint {log.checkpoint_bytes / 1024:.0f} KiB "
            f"({removes} tombstones), data on disk {data_files} files "
            f"{data_bytes / 1024**2:.0f} MiB, load {load_average()[0]:.1f}"
        )


def report(soak: Soak, loads: Sequence[float]) -> str:
    """The run's figures against the targets (module docstring)."""
    arguments = soak.arguments
    window = min(arguments.window, len(soak.wall_s))
    first_wall, last_wall = soak.wall_s[:window], soak.wall_s[-window:]
    first_cpu, last_cpu = soak.cpu_s[:window], soak.cpu_s[-window:]
    elapsed = sum(soak.wall_s)
    samples = soak.samples

    def verdict(value: bool | float | None) -> str:
        if value is None:
            return "n/a (too few samples)"
        if isinstance(value, bool):
            return "met" if value else "NOT met"
        return f"{value:.2f}x ({'met' if value <= COST_TARGET else 'NOT met'})"

    def ms(values: Sequence[float]) -> str:
        return f"{statistics.median(values) * 1000:.1f} ms" if values else "n/a"

    log_retention, file_retention = (
        f"{minutes} minutes" if minutes > 0 else default
        for minutes, default in (
            (arguments.log_retention_minutes, "30 days (the default)"),
            (arguments.file_retention_minutes, "7 days (the default)"),
        )
    )
    upkeep = ", ".join(
        f"{task} {len(runs)} runs ({sum(runs)} failed)"
        for task, runs in sorted(soak.upkeep.runs.items())
    )
    lines = [
        f"machine: {machine()}; load average (1 min) {min(loads):.1f} to {max(loads):.1f}",
        f"table: {arguments.rows} rows; {len(soak.wall_s)} commits of {arguments.min_changes} "
        f"to {arguments.max_changes} changes in {elapsed:.0f} s of commits "
        f"({len(soak.wall_s) / max(elapsed, 1e-9):.1f} commits/s); "
        f"{len(soak.spark_route)} batches by Spark (after upkeep or a restart); "
        f"compaction every {arguments.compact_every}, vacuum every {arguments.vacuum_every} "
        f"commits; log retention {log_retention}, file retention {file_retention}",
        f"upkeep: {upkeep or 'none ran'}",
        "",
        f"| measure | first {window} commits | last {window} | last / first (target <= "
        f"{COST_TARGET}x) |",
        "| --- | ---: | ---: | --- |",
        f"| commit wall time, median | {ms(first_wall)} | {ms(last_wall)} | "
        f"{verdict(median_ratio(first_wall, last_wall))} |",
        f"| commit CPU (driver + JVM), median | {ms(first_cpu)} | {ms(last_cpu)} | "
        f"{verdict(median_ratio(first_cpu, last_cpu))} |",
        f"| commit wall time, mean (upkeep included) | "
        f"{statistics.fmean(first_wall) * 1000 if first_wall else 0:.1f} ms | "
        f"{statistics.fmean(last_wall) * 1000 if last_wall else 0:.1f} ms | |",
        "",
        f"| measure (sampled every {arguments.sample_every} commits) | most | at the end | "
        f"bounded (last quarter's most <= {BOUND_FACTOR}x the second quarter's) |",
        "| --- | ---: | ---: | --- |",
    ]
    series: list[tuple[str, list[float], str]] = [
        ("live files (delta-rs)", [float(s.live_files) for s in samples], "{:.0f}"),
        ("data files on disk", [float(s.data_files) for s in samples], "{:.0f}"),
        ("data on disk, MiB", [s.data_bytes / 1024**2 for s in samples], "{:.1f}"),
        ("_delta_log files", [float(s.log.files) for s in samples], "{:.0f}"),
        ("_delta_log, MiB", [s.log.bytes / 1024**2 for s in samples], "{:.2f}"),
        ("newest checkpoint, KiB", [s.log.checkpoint_bytes / 1024 for s in samples], "{:.0f}"),
        ("checkpoint tombstones", [float(s.checkpoint_removes) for s in samples], "{:.0f}"),
    ]
    for name, values, form in series:
        lines.append(
            f"| {name} | {form.format(max(values, default=0))} | "
            f"{form.format(values[-1] if values else 0)} | {verdict(bounded(values))} |"
        )
    if len(samples) >= 8:
        # The first quarter, before the retentions let anything go: what the default
        # retentions would keep for 30 and 7 days.
        first, last = samples[0], samples[len(samples) // 4]
        commits = max(last.commit - first.commit, 1)
        lines += [
            "",
            f"growth per commit, commits {first.commit} to {last.commit}: "
            f"_delta_log {(last.log.bytes - first.log.bytes) / commits:.0f} bytes and "
            f"{(last.log.files - first.log.files) / commits:.2f} files, "
            f"checkpoint {(last.log.checkpoint_bytes - first.log.checkpoint_bytes) / commits:.0f}"
            f" bytes and {(last.checkpoint_removes - first.checkpoint_removes) / commits:.2f} "
            f"tombstones, data on disk {(last.data_bytes - first.data_bytes) / commits:.0f} bytes",
        ]
    checks = soak.checks
    lines += [
        "",
        "reads checked against the source: "
        + ", ".join(f"{kind} {count}" for kind, count in sorted(checks.done.items()))
        + f"; oldest held reader read {checks.oldest_reader_s:.0f} s "
        f"({checks.oldest_reader_commits} commits) after it opened; "
        f"failures: {len(checks.failures)}",
        *[f"  {failure}" for failure in checks.failures[:20]],
    ]
    return "\n".join(lines)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.lake_soak", description=__doc__)
    parser.add_argument("--commits", type=int, default=20_000, help="commits after the load")
    parser.add_argument("--rows", type=int, default=100_000, help="rows loaded first")
    parser.add_argument("--min-changes", type=int, default=50, help="fewest changes a commit")
    parser.add_argument("--max-changes", type=int, default=500, help="most changes a commit")
    parser.add_argument("--seed", type=int, default=1, help="the workload's random seed")
    parser.add_argument(
        "--log-retention-minutes",
        type=int,
        default=15,
        help="the soak table's delta.logRetentionDuration; 0: the default (30 days)",
    )
    parser.add_argument(
        "--file-retention-minutes",
        type=int,
        default=5,
        help="the soak table's delta.deletedFileRetentionDuration; 0: the default (7 days)",
    )
    parser.add_argument(
        "--compact-every", type=int, default=100, help="APPLY_UPKEEP__COMPACT_EVERY_COMMITS"
    )
    parser.add_argument(
        "--vacuum-every", type=int, default=1000, help="APPLY_UPKEEP__VACUUM_EVERY_COMMITS"
    )
    parser.add_argument("--sample-every", type=int, default=100, help="commits between samples")
    parser.add_argument("--window", type=int, default=1000, help="commits compared first/last")
    parser.add_argument(
        "--restart-every", type=int, default=1000, help="commits between the job's restarts"
    )
    parser.add_argument(
        "--verify-every", type=int, default=1000, help="commits between verify's reads"
    )
    parser.add_argument("--lake", type=Path, default=None, help="lake root (default: temporary)")
    parser.add_argument("--keep", action="store_true", help="keep the lake after the run")
    parser.add_argument("--jars-dir", default=None, help="Spark jars (default: make jars')")
    parser.add_argument("--charts", type=Path, default=None, help="write PNG charts here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arguments = _arguments(argv)
    logging.basicConfig(level=logging.WARNING)
    lake_root = arguments.lake or Path(tempfile.mkdtemp(prefix="lake-soak-"))
    loads = [load_average()[0]]
    soak = Soak(arguments, lake_root)
    try:
        soak.load()
        say(f"{arguments.commits} commits into {soak.path}")
        soak.run()
        loads.append(load_average()[0])
        print(report(soak, loads))
        if arguments.charts is not None:
            from bench.charts import lake_soak_charts  # noqa: PLC0415 - matplotlib is heavy

            written = lake_soak_charts(arguments.charts, soak.samples, soak.wall_s, soak.cpu_s)
            say(f"charts: {', '.join(str(p) for p in written)}")
    finally:
        soak.spark.stop()
        if not arguments.keep and arguments.lake is None:
            shutil.rmtree(lake_root, ignore_errors=True)
    return 1 if soak.checks.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
