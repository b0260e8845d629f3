"""Where a micro-batch's time goes: every Spark job apply runs, by batch, table and
call site, from Spark's own event log.

``python -m bench.batch_profile --rate 25 --seconds 60`` starts a stack of its own with
pgbench's tables (:mod:`bench.pipeline_run`), capture and apply as processes with the
Spark event log on (``spark.eventLog.enabled``), waits until the initial snapshot is
applied, runs ``pgbench -R <rate>`` for ``--seconds``, waits until the lake caught up,
stops the pipeline and reads the event log. It prints apply's CPU seconds (driver and
JVM, :class:`bench.pipeline_run.ProcessTree`) from the workload's start until the lake
caught up, per row change pgbench made (four per transaction), and:

- **per batch**: wall time from the batch's first job's submission to its last job's
  completion, jobs, and the tables (scheduler pools, :mod:`apply.batch.table_pool`) that ran
  jobs in it;
- **per table and batch**: jobs and the sum of their wall times (tables of a batch run
  side by side, so the sums overlap);
- **per call site**: the line of apply's Python code that started the job, as PySpark
  records it in ``callSite.short``, or, for the jobs Delta starts inside an operation
  (a MERGE's scans and writes, a snapshot's state reconstruction), the name of the
  job's first stage (``<operation> at <Delta source file>:<line>``): jobs, total and
  mean wall time.

A table's jobs run on threads of their own (:mod:`apply.batch.table_pool`), which do not carry
the streaming query's batch id: a job without one belongs to the newest batch that
started before it (a lane's batches run one after another). Only the workload's batches
count: those whose first job starts after pgbench does, which leaves out the initial
snapshot's. No
target: this is the measure the redesign of apply's write path starts from (issue: "the
lake within seconds"), to be run before and after each change on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.pipeline_run import (
    PipelineRun,
    add_run_arguments,
    load_average,
    machine,
    pgbench,
    pipeline_run,
    say,
)

BATCH_ID = "streaming.sql.batchId"
POOL = "spark.scheduler.pool"
CALL_SITE = "callSite.short"


@dataclass(frozen=True, slots=True)
class Job:
    """One Spark job as the event log records it."""

    job_id: int
    submitted_ms: int
    completed_ms: int
    batch_id: int | None
    pool: str
    call_site: str
    stages: int
    tasks: int
    stage_name: str = ""

    @property
    def site(self) -> str:
        """Where the job comes from: apply's line, else the first stage's name."""
        if "/apply/" in self.call_site or not self.stage_name:
            return self.call_site
        return self.stage_name

    @property
    def wall_ms(self) -> int:
        return self.completed_ms - self.submitted_ms


@dataclass
class _Pending:
    submitted_ms: int
    properties: dict[str, str]
    stages: int
    tasks: int
    stage_name: str


def _log_files(path: Path) -> list[Path]:
    """The event log files under ``path`` in the order written: Spark 4 rolls a log into
    a directory of ``events_<n>_<app>`` files (``spark.eventLog.rolling.enabled``)."""

    def order(file: Path) -> tuple[str, int]:
        index = file.name.split("_")[1] if file.name.startswith("events_") else "0"
        return (str(file.parent), int(index) if index.isdigit() else 0)

    files = [f for f in path.rglob("events_*") if f.is_file()]
    return sorted(files, key=order)


def _events(path: Path) -> Iterator[dict[str, Any]]:
    for log in _log_files(path):
        with log.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def read_jobs(event_dir: Path) -> list[Job]:
    """Every completed job of the event logs under ``event_dir``, in submission order."""
    pending: dict[int, _Pending] = {}
    jobs = []
    for event in _events(event_dir):
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            stages = event.get("Stage Infos", [])
            pending[event["Job ID"]] = _Pending(
                submitted_ms=event["Submission Time"],
                properties={k: str(v) for k, v in (event.get("Properties") or {}).items()},
                stages=len(stages),
                tasks=sum(int(s.get("Number of Tasks", 0)) for s in stages),
                stage_name=min(stages, key=lambda s: s.get("Stage ID", 0)).get("Stage Name", "")
                if stages
                else "",
            )
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in pending:
            started = pending.pop(event["Job ID"])
            batch = started.properties.get(BATCH_ID)
            jobs.append(
                Job(
                    job_id=event["Job ID"],
                    submitted_ms=started.submitted_ms,
                    completed_ms=event["Completion Time"],
                    batch_id=int(batch) if batch is not None and batch.isdigit() else None,
                    pool=started.properties.get(POOL, "default"),
                    call_site=started.properties.get(CALL_SITE, "?"),
                    stages=started.stages,
                    tasks=started.tasks,
                    stage_name=started.stage_name,
                )
            )
    return sorted(jobs, key=lambda j: j.submitted_ms)


@dataclass
class BatchProfile:
    batch_id: int
    jobs: list[Job] = field(default_factory=list)

    @property
    def wall_ms(self) -> int:
        return max(j.completed_ms for j in self.jobs) - min(j.submitted_ms for j in self.jobs)

    @property
    def tables(self) -> list[str]:
        return sorted({j.pool for j in self.jobs if not j.pool.startswith(("lane:", "default"))})


def batches(jobs: Iterable[Job], after_ms: int) -> list[BatchProfile]:
    """The batches whose first job was submitted at or after ``after_ms``, each with the
    jobs that carry its id and the jobs without an id submitted after its first job and
    before the next batch's (module docstring)."""
    ordered = sorted(jobs, key=lambda j: j.submitted_ms)
    by_id: dict[int, BatchProfile] = {}
    for job in ordered:
        if job.batch_id is not None:
            by_id.setdefault(job.batch_id, BatchProfile(job.batch_id)).jobs.append(job)
    starts = sorted((min(j.submitted_ms for j in b.jobs), b.batch_id) for b in by_id.values())
    for job in ordered:
        if job.batch_id is None:
            owner = None
            for start, batch_id in starts:
                if start > job.submitted_ms:
                    break
                owner = batch_id
            if owner is not None:
                by_id[owner].jobs.append(job)
    return [by_id[batch_id] for start, batch_id in starts if start >= after_ms]


def _short(call_site: str) -> str:
    """``collect at /abs/path/apply/lake/decode.py:123`` as
    ``collect at apply/lake/decode.py:123``."""
    head, _, where = call_site.partition(" at ")
    for root in ("/apply/", "/pyspark/", "/delta/"):
        if root in where:
            where = root.lstrip("/") + where.split(root, 1)[1]
            break
    return f"{head} at {where}" if where else head


def report(
    profiles: list[BatchProfile], rate: float, seconds: int, loads: list[tuple[float, float, float]]
) -> str:
    lines = [
        f"batch profile: pgbench -R {rate:.0f} for {seconds} s, {len(profiles)} batches, "
        f"{machine()}, load {max(load[0] for load in loads):.1f} at most",
    ]
    if not profiles:
        return "\n".join([*lines, "no batch ran during the workload"])
    walls = [p.wall_ms / 1000 for p in profiles]
    job_counts = [len(p.jobs) for p in profiles]
    lines.append(
        f"batch wall time: median {statistics.median(walls):.1f} s, max {max(walls):.1f} s; "
        f"jobs per batch: median {statistics.median(job_counts):.0f}, max {max(job_counts)}"
    )
    per_table: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for profile in profiles:
        grouped: dict[str, list[Job]] = defaultdict(list)
        for job in profile.jobs:
            grouped[job.pool].append(job)
        for pool, jobs in grouped.items():
            per_table[pool].append((len(jobs), sum(j.wall_ms for j in jobs)))
    lines.append("per table and batch (pool: batches, median jobs, median summed job wall time):")
    for pool in sorted(per_table):
        counts = [c for c, _ in per_table[pool]]
        wall = [w / 1000 for _, w in per_table[pool]]
        lines.append(
            f"  {pool:32} {len(counts):4d}  {statistics.median(counts):5.0f} jobs  "
            f"{statistics.median(wall):6.2f} s"
        )
    sites: dict[str, list[Job]] = defaultdict(list)
    for profile in profiles:
        for job in profile.jobs:
            sites[_short(job.site)].append(job)
    total_ms = sum(j.wall_ms for p in profiles for j in p.jobs)
    lines.append("per call site (jobs, total wall s, share of all job wall time, mean ms):")
    for site, jobs in sorted(sites.items(), key=lambda kv: -sum(j.wall_ms for j in kv[1])):
        wall_ms = sum(j.wall_ms for j in jobs)
        lines.append(
            f"  {len(jobs):5d} {wall_ms / 1000:8.1f} {100 * wall_ms / max(total_ms, 1):5.1f}% "
            f"{wall_ms / len(jobs):7.0f}  {site}"
        )
    return "\n".join(lines)


def _changes(run: PipelineRun) -> int:
    """Row changes pgbench made: four per transaction (three updates, one insert)."""
    with run.connect() as conn:
        row = conn.execute("SELECT count(*) FROM pgbench_history").fetchone()
    assert row is not None
    return 4 * int(str(row[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_profile", description=__doc__)
    parser.add_argument("--rate", type=float, default=25.0, help="pgbench transactions/s")
    parser.add_argument("--seconds", type=int, default=60, help="length of the workload")
    parser.add_argument("--json", type=Path, help="also write every job of the run here")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for apply on top of the bench's (repeatable): to compare",
    )
    add_run_arguments(parser)
    arguments = parser.parse_args(argv)
    loads = [load_average()]
    with pipeline_run(scale=arguments.scale, trigger=arguments.trigger, keep=arguments.keep) as run:
        events = run.root / "events"
        events.mkdir()
        run.env_overrides["APPLY_SPARK__CONF"] = json.dumps(
            {
                "spark.sql.shuffle.partitions": "2",
                "spark.ui.enabled": "false",
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": events.as_uri(),
                "spark.eventLog.compress": "false",
                **dict(item.split("=", 1) for item in arguments.spark_conf),
            }
        )
        _, apply = run.start_pipeline()
        say("waiting for the initial snapshot to be applied")
        run.wait_caught_up(900)
        started_ms = int(time.time() * 1000)
        run.sample_services()
        assert apply.tree is not None
        cpu_before = apply.tree.total_cpu_s
        say(f"pgbench at {arguments.rate:.0f} tps for {arguments.seconds} s")
        bench = pgbench(
            run, seconds=arguments.seconds, rate=arguments.rate, log=run.root / "pgbench.log"
        )

        def tick() -> None:
            loads.append(load_average())
            run.sample_services()

        run.wait_while_running(bench, tick)
        caught_up_s = run.wait_caught_up(600)
        run.sample_services()
        apply_cpu_s = apply.tree.total_cpu_s - cpu_before
        changes = _changes(run)
        run.stop_services()
        jobs = read_jobs(events)
        if arguments.json is not None:
            rows = [
                {
                    "job": j.job_id,
                    "batch": j.batch_id,
                    "pool": j.pool,
                    "site": j.site,
                    "submitted_ms": j.submitted_ms,
                    "wall_ms": j.wall_ms,
                    "tasks": j.tasks,
                }
                for j in jobs
            ]
            arguments.json.write_text(json.dumps(rows, indent=1))
        if arguments.spark_conf:
            print(f"apply's extra Spark settings: {', '.join(arguments.spark_conf)}")
        print(report(batches(jobs, started_ms), arguments.rate, arguments.seconds, loads))
        print(
            f"apply CPU over the workload and its catch-up ({caught_up_s:.0f} s after "
            f"pgbench ended): {apply_cpu_s:.1f} s for {changes} changes, "
            f"{1e6 * apply_cpu_s / max(changes, 1):.0f} µs per change"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
