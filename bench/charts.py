"""PNG charts of the pipeline benchmarks (matplotlib, no display needed)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    from bench.freshness import Timeline
    from bench.lake_soak import Sample


def freshness_charts(
    directory: Path,
    timeline: Timeline,
    kafka_ms: list[float],
    apply_ms: list[float],
    plain_ms: list[float],
    rate: float,
) -> list[Path]:
    """``freshness-timeline.png`` (lag and throughput over time) and
    ``freshness-latency.png`` (the three latency distributions)."""
    directory.mkdir(parents=True, exist_ok=True)
    timeline_png = directory / "freshness-timeline.png"
    figure, (lag, throughput) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    lag.plot(timeline.at, [b / 1024**2 for b in timeline.lag_bytes], color="tab:red")
    lag.set_ylabel("slot lag, MiB of WAL")
    lag.set_title(f"pgbench -R {rate:.0f}: lag behind the source and change records to Kafka")
    per_second = [
        (b - a) / max(t1 - t0, 1e-9)
        for (t0, a), (t1, b) in zip(
            zip(timeline.at, timeline.received, strict=True),
            zip(timeline.at[1:], timeline.received[1:], strict=True),
            strict=False,
        )
    ]
    throughput.plot(timeline.at[1:], per_second, color="tab:blue")
    throughput.set_ylabel("change records/s")
    throughput.set_xlabel("seconds since the workload started")
    figure.tight_layout()
    figure.savefig(timeline_png, dpi=100)
    plt.close(figure)

    latency_png = directory / "freshness-latency.png"
    figure, axis = plt.subplots(figsize=(9, 5))
    for values, label in (
        (kafka_ms, "commit-to-Kafka"),
        (plain_ms, "commit-to-Delta, plain append (baseline)"),
        (apply_ms, "commit-to-Delta, apply (MERGE)"),
    ):
        ordered = sorted(values)
        fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
        axis.plot(ordered, fractions, label=label)
    axis.set_xscale("log")
    axis.set_xlabel("latency, ms (log scale)")
    axis.set_ylabel("fraction of change records")
    axis.set_title("Freshness: latency from the source commit")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(latency_png, dpi=100)
    plt.close(figure)
    return [timeline_png, latency_png]


def rate_chart(directory: Path, steps: list[tuple[float, list[float], list[int]]]) -> Path:
    """``sustainable-rate.png``: the slot lag through each rate step, one panel a step."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sustainable-rate.png"
    figure, axes = plt.subplots(len(steps), 1, figsize=(9, 2.2 * len(steps)), squeeze=False)
    for axis, (rate, at, lag_bytes) in zip(axes[:, 0], steps, strict=True):
        axis.plot(at, [b / 1024**2 for b in lag_bytes], color="tab:red")
        axis.set_title(f"pgbench -R {rate:.0f}", fontsize=10)
        axis.set_ylabel("lag, MiB")
    axes[-1, 0].set_xlabel("seconds since the step started")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def soak_charts(
    directory: Path,
    at_s: list[float],
    files: dict[str, list[int]],
    batches: list[tuple[float, float]],
    lag_bytes: list[int],
    rate: float,
) -> list[Path]:
    """``soak-files.png`` (live files per table), ``soak-batches.png`` (every batch's
    duration) and ``soak-lag.png`` (the slot's lag), all over the workload's time."""
    directory.mkdir(parents=True, exist_ok=True)
    minutes = [t / 60 for t in at_s]
    written = []
    files_png = directory / "soak-files.png"
    figure, axis = plt.subplots(figsize=(9, 5))
    for name, counts in sorted(files.items()):
        axis.plot(minutes, counts, label=name)
    axis.set_xlabel("minutes since the workload started")
    axis.set_ylabel("files the newest Delta version references")
    axis.set_title(f"pgbench -R {rate:.0f}: live files per table (apply compacts them)")
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(files_png, dpi=100)
    plt.close(figure)
    written.append(files_png)

    batches_png = directory / "soak-batches.png"
    figure, axis = plt.subplots(figsize=(9, 5))
    axis.plot([t / 60 for t, _ in batches], [d for _, d in batches], ".", markersize=3)
    axis.set_xlabel("minutes since the workload started")
    axis.set_ylabel("micro-batch duration, s")
    axis.set_title(f"pgbench -R {rate:.0f}: apply's micro-batches")
    axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(batches_png, dpi=100)
    plt.close(figure)
    written.append(batches_png)

    lag_png = directory / "soak-lag.png"
    figure, axis = plt.subplots(figsize=(9, 4))
    axis.plot(minutes, [b / 1024**2 for b in lag_bytes], color="tab:red")
    axis.set_xlabel("minutes since the workload started")
    axis.set_ylabel("slot lag, MiB of WAL")
    axis.set_title(f"pgbench -R {rate:.0f}: lag behind the source")
    axis.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(lag_png, dpi=100)
    plt.close(figure)
    written.append(lag_png)
    return written


def lake_soak_charts(
    directory: Path, samples: list[Sample], wall_s: list[float], cpu_s: list[float]
) -> list[Path]:
    """``lake-soak-cost.png`` (each commit's wall time and CPU, with a rolling median),
    ``lake-soak-files.png`` (live files and data files on disk) and ``lake-soak-log.png``
    (``_delta_log`` bytes and files, the newest checkpoint), all over the commits."""
    directory.mkdir(parents=True, exist_ok=True)
    commits = [s.commit for s in samples]
    written = []

    cost_png = directory / "lake-soak-cost.png"
    figure, (wall, cpu) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    numbers = list(range(1, len(wall_s) + 1))
    for axis, values, label in ((wall, wall_s, "wall"), (cpu, cpu_s, "CPU (driver + JVM)")):
        axis.plot(numbers, [v * 1000 for v in values], ".", markersize=1, alpha=0.3)
        axis.plot(numbers, [v * 1000 for v in _rolling_median(values, 100)], color="tab:red")
        axis.set_yscale("log")
        axis.set_ylabel(f"commit {label}, ms")
        axis.grid(True, which="both", alpha=0.3)
    wall.set_title("a day of commits on one table: each commit, and the median of 100")
    cpu.set_xlabel("commit")
    figure.tight_layout()
    figure.savefig(cost_png, dpi=100)
    plt.close(figure)
    written.append(cost_png)

    files_png = directory / "lake-soak-files.png"
    figure, (live, disk) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    live.plot(commits, [s.live_files for s in samples], label="live (newest version)")
    live.plot(commits, [s.data_files for s in samples], label="on disk")
    live.set_ylabel("data files")
    live.legend()
    live.grid(True, alpha=0.3)
    live.set_title("data files: compaction bounds the live ones, VACUUM the rest")
    disk.plot(commits, [s.data_bytes / 1024**2 for s in samples], color="tab:green")
    disk.set_ylabel("data on disk, MiB")
    disk.set_xlabel("commit")
    disk.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(files_png, dpi=100)
    plt.close(figure)
    written.append(files_png)

    log_png = directory / "lake-soak-log.png"
    figure, (size, count) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    size.plot(commits, [s.log.bytes / 1024**2 for s in samples], label="log directory (_delta_log)")
    size.plot(
        commits, [s.log.checkpoint_bytes / 1024**2 for s in samples], label="newest checkpoint"
    )
    size.set_ylabel("MiB")
    size.legend()
    size.grid(True, alpha=0.3)
    size.set_title("the log: commits and checkpoints kept for the log retention")
    count.plot(commits, [s.log.files for s in samples], label="log directory files")
    count.plot(commits, [s.checkpoint_removes for s in samples], label="checkpoint tombstones")
    count.set_xlabel("commit")
    count.legend()
    count.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(log_png, dpi=100)
    plt.close(figure)
    written.append(log_png)
    return written


def _rolling_median(values: list[float], width: int) -> list[float]:
    """The median of each value and the ``width - 1`` before it."""
    return [statistics.median(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]
