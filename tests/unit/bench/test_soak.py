"""bench/soak.py's pure parts: batches from apply's log, window ratios, bounded files."""

from __future__ import annotations

from datetime import datetime

from bench.soak import Samples, batches_from_log, cpu_per_change, files_bounded, window_ratio

LOG = [
    "2026-11-27 12:44:50,287 INFO apply.app batch 2 table public.a: records=4 replays=0 "
    "superseded=0 inserted=0 updated=0 deleted=0 version=3 committed=True duration=16.98s "
    "lag=16.2s [table=public.a]",
    "2026-11-27 12:44:50,287 INFO apply.app batch 2 table public.b: records=4 replays=0 "
    "superseded=0 inserted=0 updated=0 deleted=0 version=3 committed=True duration=16.98s "
    "lag=16.2s [table=public.b]",
    "2026-11-27 12:44:56,731 INFO apply.lake.upkeep compaction of public.a: 3 files",
    "2026-11-27 12:45:09,021 INFO apply.app batch 3 table public.a: records=1 duration=4.50s x",
]


def test_each_batch_once_with_its_end_and_duration() -> None:
    found = batches_from_log(LOG)
    assert [b.duration_s for b in found] == [16.98, 4.5]
    ended = datetime.strptime("2026-11-27 12:45:09", "%Y-%m-%d %H:%M:%S").astimezone()
    assert found[1].at == ended.timestamp()


def test_the_last_window_against_the_first() -> None:
    assert window_ratio([2.0, 4.0, 3.0], [3.6, 3.6]) == 1.2
    assert window_ratio([], [1.0]) is None


def test_cpu_per_change_over_a_window() -> None:
    samples = Samples(
        at=[0.0, 10.0, 20.0, 30.0],
        apply_cpu_s=[0.0, 5.0, 10.0, 30.0],
        changes=[0, 1000, 2000, 3000],
    )
    assert cpu_per_change(samples, 0, 20) == 10.0 / 2000
    assert cpu_per_change(samples, 20, 30) == 20.0 / 1000
    assert cpu_per_change(samples, 31, 40) is None


def test_files_are_bounded_when_the_last_window_stops_growing() -> None:
    at = [float(t) for t in range(0, 100, 10)]
    sawtooth = [10, 50, 90, 12, 52, 92, 14, 54, 94, 16]
    assert files_bounded(sawtooth, at, window_s=30, slack=5)
    growing = [10 * (i + 1) for i in range(10)]
    assert not files_bounded(growing, at, window_s=30, slack=5)
