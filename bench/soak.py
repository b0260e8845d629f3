"""The pipeline for good: a steady pgbench rate for an hour, and whether it stays as fast.

``python -m bench.soak --rate 25 --minutes 60 --charts docs/charts/soak`` starts a stack
of its own with pgbench's tables (:mod:`bench.pipeline_run`), capture and apply as
processes with their default settings (table upkeep on: apply compacts and vacuums its
tables itself, :mod:`apply.lake.upkeep`), runs ``pgbench -R <rate>`` for ``--minutes``, and
samples every ``--sample-s``:

- each table's **live file count** (the files its newest Delta version references,
  read with delta-rs);
- the slot's **lag** (WAL bytes between now and what capture confirmed);
- apply's **CPU seconds** and the **change records** produced so far (the change topics'
  end offsets), so CPU per change per window.

At the end it reads every micro-batch's duration from apply's log (``batch N table ...
duration=...``) and prints, against the targets of the lake issue ("For good"):

- the file count of every table stays bounded: the most files in the last window is no
  more than the most in any earlier window plus one compaction's worth;
- the last window's median batch duration and CPU per change are within 1.2x of the
  first window's (``--window-minutes``, 10 by default).

Charts (``--charts DIR``): files per table, batch duration and lag over time.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.pipeline_run import (
    PREFIX,
    Sampler,
    add_run_arguments,
    load_average,
    machine,
    pgbench,
    pipeline_run,
    say,
    scenario_trigger,
)
from bench.scenario import Scenario, ScenarioWriter
from schemas.naming import table_topic

_BATCH_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ INFO apply\.app batch (\d+) table \S+: .*"
    r"duration=([\d.]+)s"
)


@dataclass(frozen=True, slots=True)
class Batch:
    at: float
    """When the batch ended, Unix seconds."""
    duration_s: float


def batches_from_log(lines: Iterable[str]) -> list[Batch]:
    """Every micro-batch of apply's log, once each (its tables share one line each)."""
    seen: dict[int, Batch] = {}
    for line in lines:
        match = _BATCH_LINE.match(line)
        if match is None:
            continue
        at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").astimezone().timestamp()
        seen.setdefault(int(match[2]), Batch(at, float(match[3])))
    return [seen[batch_id] for batch_id in sorted(seen)]


@dataclass
class Samples:
    at: list[float] = field(default_factory=list)
    """Unix seconds."""
    files: dict[str, list[int]] = field(default_factory=dict)
    lag_bytes: list[int] = field(default_factory=list)
    apply_cpu_s: list[float] = field(default_factory=list)
    changes: list[int] = field(default_factory=list)


def window_ratio(first: Sequence[float], last: Sequence[float]) -> float | None:
    """The last window's median over the first's; None when either has none."""
    if not first or not last:
        return None
    base = statistics.median(first)
    return None if base <= 0 else statistics.median(last) / base


def cpu_per_change(samples: Samples, start: float, end: float) -> float | None:
    """apply's CPU seconds per change record between ``start`` and ``end`` (Unix s)."""
    inside = [i for i, at in enumerate(samples.at) if start <= at <= end]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    changes = samples.changes[last] - samples.changes[first]
    if changes <= 0:
        return None
    return (samples.apply_cpu_s[last] - samples.apply_cpu_s[first]) / changes


def files_bounded(counts: Sequence[int], at: Sequence[float], window_s: float, slack: int) -> bool:
    """The most files in the last window is at most the most before it plus ``slack``
    (one compaction's worth of new files): the count stopped growing."""
    if not counts:
        return False
    end = at[-1]
    before = [c for c, t in zip(counts, at, strict=True) if t < end - window_s]
    last = [c for c, t in zip(counts, at, strict=True) if t >= end - window_s]
    if not before:
        return False
    return max(last) <= max(before) + slack


def _live_files(path: Path) -> int | None:
    from deltalake import DeltaTable  # noqa: PLC0415 - read only when the table exists

    if not (path / "_delta_log").exists():
        return None
    return len(DeltaTable(str(path)).file_uris())


def _changes(bootstrap: str, topics: list[str]) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-soak"})
    try:
        total = 0
        for topic in topics:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None:
                continue
            for partition in metadata.partitions:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
                total += high
        return total
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--rate", type=float, default=25.0, help="pgbench transactions/s")
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the workload")
    parser.add_argument("--window-minutes", type=float, default=10.0, help="first/last window")
    parser.add_argument("--sample-s", type=float, default=15.0, help="seconds between samples")
    parser.add_argument(
        "--compact-every", type=int, default=100, help="APPLY_UPKEEP__COMPACT_EVERY_COMMITS"
    )
    add_run_arguments(parser, tables=Scenario.PGBENCH)
    arguments = parser.parse_args(argv)
    scenario: Scenario = arguments.tables
    arguments.trigger = scenario_trigger(scenario, arguments.trigger)
    tables = scenario.tables
    topics = [table_topic(PREFIX, "public", t) for t in tables]
    loads = [load_average()]
    with pipeline_run(
        scale=arguments.scale, trigger=arguments.trigger, keep=arguments.keep, scenario=scenario
    ) as run:
        run.env_overrides["APPLY_UPKEEP__COMPACT_EVERY_COMMITS"] = str(arguments.compact_every)
        capture, apply = run.start_pipeline()
        say("waiting for the initial snapshot to be applied")
        deadline = time.monotonic() + 900
        while not all(
            (run.lake / "public" / t / "_delta_log").exists() for t in scenario.seeded_tables
        ):
            run.check_services()
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: the lake tables never appeared; logs in {run.root}")
            time.sleep(1)
        run.wait_caught_up(900)
        samples = Samples()
        locations = {t: run.lake / "public" / t for t in tables}

        def sample() -> None:
            run.sample_services()
            samples.at.append(time.time())
            samples.lag_bytes.append(run.lag_bytes() or 0)
            samples.apply_cpu_s.append(apply.tree.total_cpu_s if apply.tree else 0.0)
            samples.changes.append(_changes(run.bootstrap, topics))
            for name, path in locations.items():
                samples.files.setdefault(name, []).append(_live_files(path) or 0)

        seconds = int(arguments.minutes * 60)
        say(f"pgbench at {arguments.rate:.0f} tps for {seconds} s")
        started = time.time()
        with (
            Sampler(sample, interval_s=arguments.sample_s),
            ScenarioWriter(run.dsn, scenario, seconds),
        ):
            bench = pgbench(run, seconds=seconds, rate=arguments.rate, log=run.root / "pgbench.log")
            run.wait_while_running(bench, lambda: loads.append(load_average()))
        ended = time.time()
        log_lines = (run.root / "apply.log").read_text(errors="replace").splitlines()
        batches = [b for b in batches_from_log(log_lines) if started <= b.at <= ended]
        run.stop_services()
        del capture
    print(_report(arguments, samples, batches, started, ended, loads))
    if arguments.charts is not None:
        from bench.charts import soak_charts  # noqa: PLC0415 - matplotlib is heavy

        written = soak_charts(
            arguments.charts,
            [t - started for t in samples.at],
            samples.files,
            [(b.at - started, b.duration_s) for b in batches],
            samples.lag_bytes,
            arguments.rate,
        )
        say(f"charts: {', '.join(str(p) for p in written)}")
    return 0


def _report(
    arguments: argparse.Namespace,
    samples: Samples,
    batches: list[Batch],
    started: float,
    ended: float,
    loads: list[tuple[float, float, float]],
) -> str:
    window = arguments.window_minutes * 60
    first = [b.duration_s for b in batches if b.at < started + window]
    last = [b.duration_s for b in batches if b.at >= ended - window]
    batch_ratio = window_ratio(first, last)
    cpu_first = cpu_per_change(samples, started, started + window)
    cpu_last = cpu_per_change(samples, ended - window, ended)
    cpu_ratio = None if cpu_first is None or cpu_last is None else cpu_last / cpu_first

    def ratio(value: float | None) -> str:
        if value is None:
            return "n/a"
        return f"{value:.2f}x ({'met' if value <= 1.2 else 'NOT met'})"

    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 1000:.1f} ms"

    lines = [
        f"machine: {machine()}; load average (1 min): {min(x[0] for x in loads):.1f} to "
        f"{max(x[0] for x in loads):.1f}",
        f"workload: pgbench -R {arguments.rate:.0f} for {arguments.minutes:g} min, scale "
        f"{arguments.scale}; tables {arguments.tables.value}; trigger {arguments.trigger}; "
        "compaction every "
        f"{arguments.compact_every} commits; "
        f"MERGE a batch; {len(batches)} batches",
        "",
        f"| measure | first {arguments.window_minutes:g} min | last {arguments.window_minutes:g}"
        " min | last / first (target <= 1.2x) |",
        "| --- | ---: | ---: | --- |",
        f"| batch duration, median | {statistics.median(first) if first else 0:.2f} s | "
        f"{statistics.median(last) if last else 0:.2f} s | {ratio(batch_ratio)} |",
        f"| apply CPU per change | {ms(cpu_first)} | {ms(cpu_last)} | {ratio(cpu_ratio)} |",
        "",
        "| table | live files: most | at the end | bounded (last window <= earlier + "
        f"{arguments.compact_every * 4}) |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, counts in samples.files.items():
        bounded = files_bounded(counts, samples.at, window, arguments.compact_every * 4)
        lines.append(
            f"| {name} | {max(counts, default=0)} | {counts[-1] if counts else 0} | "
            f"{'met' if bounded else 'NOT met'} |"
        )
    lines.append("")
    lines.append(f"slot lag at the end: {samples.lag_bytes[-1] if samples.lag_bytes else 0} bytes")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
