"""Does apply keep up with capture draining a backlog? The lake's catch-up time against
capture's drain time of the same backlog, measured in the same run.

``python -m bench.keep_up [--changes N] [--scale S] [--max-offsets B]`` (defaults: 1,000,000
changes, scale 10) starts a stack of its own with pgbench's tables
(:mod:`bench.pipeline_run`) and:

1. starts capture and apply as processes and waits until the initial snapshot is in the
   lake (the slot confirmed at the WAL position of then); then stops both, apply first;
2. writes a backlog of at least N row changes with nothing reading the slot:
   unthrottled ``pgbench`` (2 clients), TPC-B-like transactions of 4 row changes each
   (3 updates, 1 ``pgbench_history`` insert). The exact number comes from
   ``pg_stat_user_tables`` (inserts + updates + deletes of the four tables, before
   and after; pgbench's backends have exited, so their statistics are flushed); the end
   of the backlog is the WAL insert position after the last commit;
3. starts capture and apply again, at the same moment, and measures from there:
   - **capture drain**: until the change topics hold one more record per row change of
     the backlog (the sum of their high watermarks, polled every 0.2 s);
   - **lake caught up**: until the slot is confirmed at the backlog's end, which
     capture does only once apply published that every record up to there is in the
     lake (the slot follows apply).

The target (issue #12) is lake / capture <= 1.5. Both services run on the same machine,
so they share its cores with PostgreSQL and Kafka, as in a small deployment. Also
printed: CPU seconds and peak RSS of each service's process tree during the catch-up
(apply is a Python driver and its JVM), and the batches apply committed for it (from
its log). ``--max-offsets`` sets apply's ``maxOffsetsPerTrigger`` (default: none, every
batch takes what has arrived).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from bench.pipeline_run import (
    PREFIX,
    TABLES,
    PipelineRun,
    add_run_arguments,
    load_average,
    machine,
    pgbench_binary,
    pipeline_run,
    say,
)
from schemas.naming import table_topic

TARGET = 1.5
CHANGES_PER_TRANSACTION = 4  # pgbench's TPC-B-like script: 3 updates and 1 insert
CLIENTS = 2

# A MERGE's line, Spark's or the driver's ("batch N to T from the driver: version ...").
_BATCH_LINE = re.compile(r"\bbatch (\d+) to \S+(?: from the driver)?: version \d+ committed\b")


def transactions_per_client(changes: int, clients: int = CLIENTS) -> int:
    """pgbench ``-t`` so that ``clients`` clients write at least ``changes`` row changes."""
    if changes < 1 or clients < 1:
        raise ValueError("changes and clients must be positive")
    return math.ceil(changes / (CHANGES_PER_TRANSACTION * clients))


def committed_batches(log_text: str) -> set[int]:
    """Ids of the batches apply's log reports a committed table version for."""
    return {int(m.group(1)) for m in _BATCH_LINE.finditer(log_text)}


@dataclass(frozen=True, slots=True)
class Verdict:
    capture_s: float
    lake_s: float

    @property
    def ratio(self) -> float:
        return self.lake_s / self.capture_s

    @property
    def met(self) -> bool:
        return self.ratio <= TARGET


def _row_changes(run: PipelineRun) -> int:
    with run.connect() as conn:
        row = conn.execute(
            "SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables "
            "WHERE schemaname = 'public' AND relname = ANY(%s)",
            [list(TABLES)],
        ).fetchone()
    assert row is not None
    return int(str(row[0] or 0))


def _settled_row_changes(run: PipelineRun) -> int:
    """The row-change count once the statistics stop moving (flushed by exiting backends)."""
    last = _row_changes(run)
    while True:
        time.sleep(1.0)
        now = _row_changes(run)
        if now == last:
            return now
        last = now


def _insert_lsn(run: PipelineRun) -> int:
    with run.connect() as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()
    assert row is not None
    return int(str(row[0]))


class TopicEnds:
    """The sum of the change topics' high watermarks, read with one consumer. A topic
    capture has not created yet (``pgbench_history`` starts empty, so the snapshot
    creates no topic for it) counts 0 until it appears: the partitions are listed
    again on every call, from the whole cluster's metadata, which never creates one."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-keep-up"})
        self._topics = topics

    def total(self) -> int:
        metadata = self._consumer.list_topics(timeout=10).topics
        return sum(
            self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10, cached=False
            )[1]
            for topic in self._topics
            if topic in metadata
            for partition in metadata[topic].partitions
        )

    def close(self) -> None:
        self._consumer.close()


def _backlog(run: PipelineRun, changes: int) -> tuple[int, int]:
    """Write the backlog with nothing reading the slot: (row changes, end LSN)."""
    before = _settled_row_changes(run)
    per_client = transactions_per_client(changes)
    say(f"backlog: pgbench -c {CLIENTS} -t {per_client} (at least {changes} row changes)")
    started = time.monotonic()
    subprocess.run(
        [pgbench_binary(), "-n", "-c", str(CLIENTS), "-j", "1", "-t", str(per_client), run.dsn],
        check=True,
        capture_output=True,
    )
    end = _insert_lsn(run)
    written = _settled_row_changes(run) - before
    say(f"backlog written in {time.monotonic() - started:.0f} s: {written} row changes")
    return written, end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keep_up", description=__doc__)
    parser.add_argument("--changes", type=int, default=1_000_000, help="row changes of the backlog")
    parser.add_argument(
        "--max-offsets", type=int, help="apply's maxOffsetsPerTrigger (default: none)"
    )
    parser.add_argument(
        "--driver-write-records",
        type=int,
        help="apply's APPLY_LAKE__DRIVER_WRITE_RECORDS: batches up to this many records are "
        "written from the driver (default: apply's own)",
    )
    add_run_arguments(parser)
    parser.set_defaults(scale=10)
    arguments = parser.parse_args(argv)

    topics = [table_topic(PREFIX, "public", t) for t in TABLES]
    load_start = load_average()
    with pipeline_run(scale=arguments.scale, trigger=arguments.trigger, keep=arguments.keep) as run:
        if arguments.max_offsets is not None:
            run.env_overrides["APPLY_KAFKA__MAX_OFFSETS_PER_TRIGGER"] = str(arguments.max_offsets)
        if arguments.driver_write_records is not None:
            run.env_overrides["APPLY_LAKE__DRIVER_WRITE_RECORDS"] = str(
                arguments.driver_write_records
            )
        run.start_pipeline()
        say("waiting for the initial snapshot to be applied")
        deadline = time.monotonic() + 900
        while run.lag_bytes() is None:
            run.check_services()
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: no slot after 900 s; logs in {run.root}")
            time.sleep(0.5)
        run.wait_caught_up(1800)
        run.stop_services()
        run.services.clear()

        changes, end_lsn = _backlog(run, arguments.changes)
        ends = TopicEnds(run.bootstrap, topics)
        try:
            target_records = ends.total() + changes
            apply_log = run.root / "apply.log"
            batches_before = committed_batches(apply_log.read_text(errors="replace"))
            load_before = load_average()
            say(f"catching up: {changes} changes, capture and apply started together")
            started = time.monotonic()
            capture, apply = run.start_pipeline()
            capture_s: float | None = None
            lake_s: float | None = None
            while lake_s is None:
                run.check_services()
                run.sample_services()
                now = time.monotonic() - started
                if capture_s is None and ends.total() >= target_records:
                    capture_s = now
                    say(f"capture drained the backlog in {capture_s:.1f} s")
                if run.confirmed_at_least(end_lsn):
                    lake_s = now
                if now > 7200:
                    raise SystemExit(f"bench: not caught up after 2 hours; logs in {run.root}")
                time.sleep(0.2)
            if capture_s is None:
                capture_s = lake_s  # the slot is confirmed only past published records
            run.sample_services()
            extra = ends.total() - target_records
            if extra != 0:
                # More records than row changes: something besides the backlog was
                # published (a snapshot taken again, a replay after a restart), and the
                # drain time above is not the backlog's.
                raise SystemExit(
                    f"bench: the topics hold {extra:+d} records beyond the backlog's "
                    f"{changes}; not a measure of the drain; logs in {run.root}"
                )
        finally:
            ends.close()
        cpu = {s.name: s.tree.total_cpu_s for s in (capture, apply) if s.tree}
        peaks = {s.name: s.tree.total_peak_rss for s in (capture, apply) if s.tree}
        batches = committed_batches(apply_log.read_text(errors="replace")) - batches_before
        run.stop_services()

    verdict = Verdict(capture_s, lake_s)
    report = {
        "machine": machine(),
        "changes": changes,
        "scale": arguments.scale,
        "max_offsets_per_trigger": arguments.max_offsets,
        "capture_drain_s": round(capture_s, 1),
        "lake_caught_up_s": round(lake_s, 1),
        "ratio": round(verdict.ratio, 2),
        "apply_batches": len(batches),
        "cpu_s": {name: round(value, 1) for name, value in cpu.items()},
        "cpu_us_per_change": {name: round(value / changes * 1e6, 1) for name, value in cpu.items()},
        "peak_rss_mib": {name: round(value / 1024**2) for name, value in peaks.items()},
        "load": {"start": load_start, "before_catch_up": load_before, "end": load_average()},
    }
    print(json.dumps(report, indent=2))
    print(
        f"capture drained {changes} changes in {capture_s:.1f} s, the lake caught up in "
        f"{lake_s:.1f} s ({len(batches)} apply batches): lake/capture {verdict.ratio:.2f}, "
        f"target <= {TARGET}: {'met' if verdict.met else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
