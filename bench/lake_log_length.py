"""What one commit of the driver's MERGE costs as the table's ``_delta_log`` grows.

Usage: ``.venv/bin/python -m bench.lake_log_length [--lengths 100 1000 4000 8000 17280]
[--rows 100000] [--batch 200] [--merges 30] [--warmup 3] [--lake local|s3]``

delta-rs lists ``_delta_log`` twice in every commit: before it writes (the newest
version, ``get_latest_version``) and after (the post-commit update of the table object).
On an object store that listing starts at the table's version (S3's ``start-after``); a
local file system has no listing that starts at a name, so it reads the whole directory,
and a commit costs more the more files the log holds, until the log retention
(``APPLY_LAKE__LOG_RETENTION_HOURS``) bounds them. The day of commits
(:mod:`bench.lake_soak`) sees this as its last thousand commits costing more than its
first; this bench measures the cost against the log's length alone, with nothing else
growing.

For each length L of ``--lengths``, on a local file system (``--lake local``) or in a
bucket of a local MinIO (``--lake s3``: the table is seeded and padded on disk, then
copied into the bucket, and delta-rs reaches it with the options apply's driver uses,
:mod:`apply.lake.driver_store`):

- a fresh ``pgbench_accounts``-shaped table of ``--rows`` rows in one file
  (:func:`bench.lake_write_modes.seed_accounts`, apply's table properties);
- its log padded to L commit files, each new one holding only a ``commitInfo`` action
  (an empty commit: the listing reads names, not contents), then a checkpoint at the
  last version, so that opening the table reads the same at every length;
- ``--warmup`` and then ``--merges`` MERGEs of ``--batch`` updates by key drawn over the
  table, in turns over the lengths (one MERGE into each table a turn, so that a drift of
  the machine's speed falls on every length alike), each with apply's
  :func:`apply.lake.driver_merge.merge_rows` (its commit carries the batch's state and
  ``txn`` action; its post-commit hook writes a checkpoint when one is due) into a
  ``DeltaTable`` opened once and kept, as :class:`~apply.lake.driver_merge.DriverTables`
  keeps it. Each MERGE rewrites the table's file (copy-on-write), as the soak's do.

Per length: the median wall time and CPU of one MERGE (this process's CPU, delta-rs's
threads included; no Spark), the ratio of each against the first length, and the extra
CPU per thousand log files; with ``--lake s3`` also MinIO's own CPU a MERGE (the
server's, which on S3 is not the job's, but shares this machine's two cores). A real
log also holds a checkpoint every 100 commits (about 1 % more files) and larger commit
files. The scratch directory is deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lake_write_modes import FIRST_LSN, accounts_columns, accounts_source, seed_accounts

SEED = 20261203
APP_ID = "bench-lake-log-length"
DEFAULT_LENGTHS = (100, 1_000, 4_000, 8_000, 17_280)
"""17,280: a day of commits at apply's 5 s trigger, what apply's default log retention of
24 hours keeps for a table written at every trigger."""


@dataclass(frozen=True, slots=True)
class LengthResult:
    """The MERGEs measured at one log length."""

    length: int
    files: int
    wall_s: tuple[float, ...]
    cpu_s: tuple[float, ...]
    server_cpu_s: tuple[float, ...] = ()
    """MinIO's CPU a MERGE (empty for a local lake)."""

    @property
    def wall(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_s)

    @property
    def server_cpu(self) -> float | None:
        """The mean, not the median: the kernel counts MinIO's CPU in ticks of 10 ms,
        longer than some MERGEs."""
        return statistics.mean(self.server_cpu_s) if self.server_cpu_s else None


def pad_log(path: Path, length: int) -> int:
    """Pad the table's log at ``path`` with empty commits up to ``length`` commit files and
    write a checkpoint at the last; the table's version afterwards."""
    from deltalake import DeltaTable  # noqa: PLC0415 - the module docstring runs without it

    log = path / "_delta_log"
    version = DeltaTable(str(path)).version()
    stamp = int(time.time() * 1000)
    empty = json.dumps({"commitInfo": {"timestamp": stamp, "operation": "WRITE"}}) + "\n"
    for padded in range(version + 1, length):
        (log / f"{padded:020d}.json").write_text(empty)
    table = DeltaTable(str(path))
    table.create_checkpoint()
    return int(table.version())


@dataclass(frozen=True, slots=True)
class Lake:
    """Where the tables are MERGEd: a local directory, or a MinIO bucket."""

    options: dict[str, str] = field(default_factory=dict)
    """delta-rs's storage options (empty for a local lake)."""
    bucket: str | None = None
    files: Any = None
    """pyarrow's file system of the bucket (None for a local lake)."""
    server_pid: int | None = None
    """MinIO's process, whose CPU each MERGE also reads."""

    def place(self, local: Path) -> str:
        """The location delta-rs opens for the table seeded at ``local``: ``local`` itself,
        or a copy of it in the bucket."""
        if self.bucket is None:
            return str(local)
        from pyarrow import fs  # type: ignore[import-untyped]  # noqa: PLC0415

        fs.copy_files(
            str(local),
            f"{self.bucket}/{local.name}",
            source_filesystem=fs.LocalFileSystem(),
            destination_filesystem=self.files,
            use_threads=True,
        )
        return f"s3://{self.bucket}/{local.name}"

    def server_cpu(self) -> float:
        """MinIO's CPU seconds so far (0 for a local lake)."""
        from bench.pipeline_run import process_cpu_s  # noqa: PLC0415

        return 0.0 if self.server_pid is None else process_cpu_s(self.server_pid)


@contextlib.contextmanager
def lake_of(arguments: argparse.Namespace, scratch: Path) -> Iterator[Lake]:
    """The lake ``--lake`` names; a MinIO is started under ``scratch`` and stopped after."""
    if arguments.lake == "local":
        yield Lake()
        return
    from pyarrow import fs  # noqa: PLC0415

    from apply.lake.driver_store import driver_store  # noqa: PLC0415
    from deploy.local.minio import REGION, running_minio  # noqa: PLC0415
    from deploy.local.process import read_pid  # noqa: PLC0415
    from deploy.local.sigv4 import Credentials  # noqa: PLC0415

    credentials = Credentials(f"bench-{secrets.token_hex(4)}", secrets.token_urlsafe(24))
    with running_minio(scratch / "minio", credentials, buckets=["bench"]) as server:
        files = fs.S3FileSystem(
            access_key=credentials.access_key,
            secret_key=credentials.secret_key,
            endpoint_override=server.endpoint,
            region=REGION,
            scheme="http",
        )
        # The options apply's driver derives from the job's S3A settings.
        s3a = {
            "fs.s3a.endpoint": server.endpoint,
            "fs.s3a.endpoint.region": REGION,
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.access.key": credentials.access_key,
            "fs.s3a.secret.key": credentials.secret_key,
        }
        store = driver_store("s3a://bench", s3a.get)
        assert store is not None  # an s3a:// lake is the driver's
        yield Lake(dict(store.options), "bench", files, read_pid(server.pid_file))


@dataclass
class PaddedTable:
    """One length's table, opened once and kept, and its MERGEs' timings."""

    length: int
    path: str
    table: Any
    version: int
    rng: random.Random
    files: int
    """Files in ``_delta_log`` before the first MERGE."""
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    server_cpus: list[float] = field(default_factory=list)

    def result(self) -> LengthResult:
        return LengthResult(
            self.length,
            self.files,
            tuple(self.walls),
            tuple(self.cpus),
            tuple(self.server_cpus),
        )


def padded_table(
    arguments: argparse.Namespace, scratch: Path, lake: Lake, length: int
) -> PaddedTable:
    """The table of one length, seeded and padded (module docstring)."""
    from deltalake import DeltaTable  # noqa: PLC0415

    from apply.lake.driver_merge import writable  # noqa: PLC0415

    local = scratch / f"log-{length}"
    seed_accounts(local, accounts_columns(), arguments.rows, arguments.rows)
    version = pad_log(local, length)
    files = sum(1 for _ in (local / "_delta_log").iterdir())
    path = lake.place(local)
    table = DeltaTable(path, storage_options=dict(lake.options))
    writable(table)
    return PaddedTable(length, path, table, version, random.Random(SEED + length), files)


def merge_once(
    arguments: argparse.Namespace, lake: Lake, padded: PaddedTable, batch_id: int
) -> None:
    """One MERGE of a batch of updates into ``padded``'s table, timed from the call to
    its return, kept unless it is a warm-up."""
    from apply.lake.driver_merge import merge_rows  # noqa: PLC0415
    from apply.lake.table_lock import TABLE_LOCKS  # noqa: PLC0415

    columns = accounts_columns()
    keys = sorted(padded.rng.sample(range(1, arguments.rows + 1), arguments.batch))
    source = accounts_source(columns, keys, [batch_id + 1] * len(keys), FIRST_LSN + batch_id + 1)
    metadata = json.dumps({"bench": APP_ID, "batch": batch_id})
    with TABLE_LOCKS.held(padded.path):
        server, cpu, start = lake.server_cpu(), time.process_time(), time.perf_counter()
        merge_rows(
            padded.table,
            source,
            path=padded.path,
            name="bench.accounts",
            columns=columns,
            key_columns=("aid",),
            app_id=APP_ID,
            batch_id=batch_id,
            metadata=metadata,
        )
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        server = lake.server_cpu() - server
    padded.version += 1
    if padded.table.version() != padded.version:
        raise SystemExit(f"length {padded.length}: batch {batch_id} made no commit")
    if batch_id >= arguments.warmup:
        padded.walls.append(wall)
        padded.cpus.append(cpu)
        padded.server_cpus.append(server)


def report(results: Sequence[LengthResult]) -> None:
    base = results[0]
    server = base.server_cpu is not None
    print(
        "| log commit files | files in _delta_log before | MERGE wall, median | ratio | "
        "MERGE CPU, median | ratio | extra CPU per 1,000 files |"
        + (" MinIO CPU a MERGE, mean |" if server else "")
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if server else ""))
    for result in results:
        extra = ""
        if result is not base:
            per_thousand = (result.cpu - base.cpu) / (result.files - base.files) * 1000
            extra = f"{per_thousand * 1000:.2f} ms"
        print(
            f"| {result.length:,} | {result.files:,} | {result.wall * 1000:.1f} ms | "
            f"{result.wall / base.wall:.2f}x | {result.cpu * 1000:.1f} ms | "
            f"{result.cpu / base.cpu:.2f}x | {extra} |"
            + (f" {(result.server_cpu or 0.0) * 1000:.1f} ms |" if server else "")
        )


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lake_log_length",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=list(DEFAULT_LENGTHS),
        help="commit files in the log (the first is the baseline of the ratios)",
    )
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the table")
    parser.add_argument("--batch", type=int, default=200, help="updates by key a MERGE")
    parser.add_argument("--merges", type=int, default=30, help="MERGEs measured a length")
    parser.add_argument("--warmup", type=int, default=3, help="MERGEs before measuring")
    parser.add_argument("--scratch", default=None, help="directory for the tables")
    parser.add_argument(
        "--lake",
        choices=("local", "s3"),
        default="local",
        help="a local directory, or a bucket of a MinIO the bench starts",
    )
    arguments = parser.parse_args(argv)
    if min(arguments.lengths) < 2 or arguments.merges < 1 or arguments.warmup < 0:
        parser.error("--lengths must be at least 2 and --merges at least 1")
    if not 1 <= arguments.batch <= arguments.rows:
        parser.error("--batch must be between 1 and --rows")
    return arguments


def main(argv: Sequence[str] | None = None) -> None:
    from bench.pipeline_run import load_average, machine, say  # noqa: PLC0415

    arguments = parse_arguments(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-log-length-", dir=arguments.scratch))
    started = time.monotonic()
    try:
        say(f"machine: {machine()}, load {load_average()}, lake {arguments.lake}")
        with lake_of(arguments, scratch) as lake:
            tables = [
                padded_table(arguments, scratch, lake, length) for length in arguments.lengths
            ]
            say(f"{len(tables)} tables seeded and padded; MERGEs in turns, one per table a turn")
            for batch_id in range(arguments.warmup + arguments.merges):
                for padded in tables:
                    merge_once(arguments, lake, padded, batch_id)
            results = [padded.result() for padded in tables]
        say(f"load {load_average()}, {time.monotonic() - started:.0f} s in all")
        print(
            f"medians over {arguments.merges} MERGEs of {arguments.batch} updates into "
            f"{arguments.rows:,} rows ({arguments.lake} lake); CPU = this process; ratios "
            f"against {arguments.lengths[0]:,} commit files"
        )
        report(results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
