"""What one commit of the driver's MERGE costs as the table's ``_delta_log`` grows.

Usage: ``.venv/bin/python -m bench.lake_log_length [--lengths 100 1000 4000 8000 17280]
[--rows 100000] [--batch 200] [--merges 30] [--warmup 3]``

delta-rs lists ``_delta_log`` twice in every commit: before it writes (the newest
version, ``get_latest_version``) and after (the post-commit update of the table object).
On an object store that listing starts at the table's version (S3's ``start-after``); a
local file system has no listing that starts at a name, so it reads the whole directory,
and a commit costs more the more files the log holds, until the log retention
(``APPLY_LAKE__LOG_RETENTION_HOURS``) bounds them. The day of commits
(:mod:`bench.lake_soak`) sees this as its last thousand commits costing more than its
first; this bench measures the cost against the log's length alone, with nothing else
growing.

For each length L of ``--lengths``, on a local file system:

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
CPU per thousand log files. A real log also holds a checkpoint every 100 commits (about
1 % more files) and larger commit files. The scratch directory is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
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

    @property
    def wall(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_s)


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


@dataclass
class PaddedTable:
    """One length's table, opened once and kept, and its MERGEs' timings."""

    length: int
    path: Path
    table: Any
    version: int
    rng: random.Random
    files: int
    """Files in ``_delta_log`` before the first MERGE."""
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)

    def result(self) -> LengthResult:
        return LengthResult(self.length, self.files, tuple(self.walls), tuple(self.cpus))


def padded_table(arguments: argparse.Namespace, scratch: Path, length: int) -> PaddedTable:
    """The table of one length, seeded and padded (module docstring)."""
    from deltalake import DeltaTable  # noqa: PLC0415

    from apply.lake.driver_merge import writable  # noqa: PLC0415

    path = scratch / f"log-{length}"
    seed_accounts(path, accounts_columns(), arguments.rows, arguments.rows)
    version = pad_log(path, length)
    table = DeltaTable(str(path))
    writable(table)
    files = sum(1 for _ in (path / "_delta_log").iterdir())
    return PaddedTable(length, path, table, version, random.Random(SEED + length), files)


def merge_once(arguments: argparse.Namespace, padded: PaddedTable, batch_id: int) -> None:
    """One MERGE of a batch of updates into ``padded``'s table, timed from the call to
    its return, kept unless it is a warm-up."""
    from apply.lake.driver_merge import merge_rows  # noqa: PLC0415
    from apply.lake.table_lock import TABLE_LOCKS  # noqa: PLC0415

    columns = accounts_columns()
    keys = sorted(padded.rng.sample(range(1, arguments.rows + 1), arguments.batch))
    source = accounts_source(columns, keys, [batch_id + 1] * len(keys), FIRST_LSN + batch_id + 1)
    metadata = json.dumps({"bench": APP_ID, "batch": batch_id})
    with TABLE_LOCKS.held(str(padded.path)):
        cpu, start = time.process_time(), time.perf_counter()
        merge_rows(
            padded.table,
            source,
            path=str(padded.path),
            name="bench.accounts",
            columns=columns,
            key_columns=("aid",),
            app_id=APP_ID,
            batch_id=batch_id,
            metadata=metadata,
        )
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    padded.version += 1
    if padded.table.version() != padded.version:
        raise SystemExit(f"length {padded.length}: batch {batch_id} made no commit")
    if batch_id >= arguments.warmup:
        padded.walls.append(wall)
        padded.cpus.append(cpu)


def report(results: Sequence[LengthResult]) -> None:
    base = results[0]
    print(
        "| log commit files | files in _delta_log before | MERGE wall, median | ratio | "
        "MERGE CPU, median | ratio | extra CPU per 1,000 files |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for result in results:
        extra = ""
        if result is not base:
            per_thousand = (result.cpu - base.cpu) / (result.files - base.files) * 1000
            extra = f"{per_thousand * 1000:.2f} ms"
        print(
            f"| {result.length:,} | {result.files:,} | {result.wall * 1000:.1f} ms | "
            f"{result.wall / base.wall:.2f}x | {result.cpu * 1000:.1f} ms | "
            f"{result.cpu / base.cpu:.2f}x | {extra} |"
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
        say(f"machine: {machine()}, load {load_average()}")
        tables = [padded_table(arguments, scratch, length) for length in arguments.lengths]
        say(f"{len(tables)} tables seeded and padded; MERGEs in turns, one per table a turn")
        for batch_id in range(arguments.warmup + arguments.merges):
            for padded in tables:
                merge_once(arguments, padded, batch_id)
        results = [padded.result() for padded in tables]
        say(f"load {load_average()}, {time.monotonic() - started:.0f} s in all")
        print(
            f"medians over {arguments.merges} MERGEs of {arguments.batch} updates into "
            f"{arguments.rows:,} rows; CPU = this process; ratios against "
            f"{arguments.lengths[0]:,} commit files"
        )
        report(results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
