"""The pure parts of the pipeline benchmarks: when a record became visible in a Delta
table (from apply's commit state, or from a streaming append's checkpoint), and the
flat-lag rule of the sustainable-rate search."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from apply.lake.positions import AppliedState, PartitionProgress, Position, encode_state
from bench.freshness import (
    Arrivals,
    apply_visibility,
    baseline_visibility,
    percentile,
    upkeep_in_window,
    visible_latencies_ms,
)
from bench.sustainable_rate import keeps_up, next_rate
from schemas.lsn import Lsn

TOPIC = "bench.public.pgbench_accounts"


def _commit(log: Path, version: int, actions: list[dict[str, object]], mtime_s: float) -> None:
    log.mkdir(parents=True, exist_ok=True)
    path = log / f"{version:020d}.json"
    path.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    os.utime(path, (mtime_s, mtime_s))


def _state(next_offsets: dict[int, int], batch_id: int) -> str:
    return encode_state(
        AppliedState(
            table="public.pgbench_accounts",
            partitions={
                (TOPIC, p): PartitionProgress(next_offset=o, position=Position(Lsn(100 + o), 0))
                for p, o in next_offsets.items()
            },
            table_lsn=Lsn(100),
            commit_ts=0,
            truncated_at=None,
            batch_id=batch_id,
        )
    )


def test_a_record_is_visible_at_the_first_apply_commit_past_its_offset(tmp_path: Path) -> None:
    log = tmp_path / "public" / "pgbench_accounts" / "_delta_log"
    _commit(log, 0, [{"commitInfo": {"operation": "CREATE TABLE"}}], 1000.0)
    _commit(log, 1, [{"commitInfo": {"userMetadata": _state({0: 10, 1: 5}, 1)}}], 1001.0)
    _commit(log, 2, [{"commitInfo": {"userMetadata": _state({0: 20, 1: 5}, 2)}}], 1002.0)
    seen = apply_visibility(tmp_path)
    arrivals = Arrivals(
        commit_us={(TOPIC, 0, 9): 999_500_000, (TOPIC, 0, 10): 1_000_000_000},
        received_us={(TOPIC, 0, 9): 0, (TOPIC, 0, 10): 0},
    )
    # Offset 9 is below next offset 10 of commit 1; offset 10 needs commit 2.
    assert visible_latencies_ms(arrivals, seen) == [1500.0, 2000.0]


def test_upkeep_commits_are_counted_inside_the_window_only(tmp_path: Path) -> None:
    accounts = tmp_path / "public" / "pgbench_accounts" / "_delta_log"
    _commit(accounts, 0, [{"commitInfo": {"operation": "OPTIMIZE"}}], 999.0)  # before
    _commit(accounts, 1, [{"commitInfo": {"operation": "MERGE"}}], 1001.0)
    _commit(accounts, 2, [{"commitInfo": {"operation": "OPTIMIZE"}}], 1002.0)
    _commit(accounts, 3, [{"commitInfo": {"operation": "VACUUM START"}}], 1003.0)
    _commit(accounts, 4, [{"commitInfo": {"operation": "VACUUM END"}}], 1004.0)
    branches = tmp_path / "public" / "pgbench_branches" / "_delta_log"
    _commit(branches, 0, [{"commitInfo": {"operation": "OPTIMIZE"}}], 1005.0)
    _commit(branches, 1, [{"commitInfo": {"operation": "OPTIMIZE"}}], 1011.0)  # after
    tables = ["pgbench_accounts", "pgbench_branches", "pgbench_history"]  # no history yet
    counts = upkeep_in_window(tmp_path, tables, 1000e6, 1010e6)
    assert counts == {"compaction commits": 2, "vacuums": 1}
    assert upkeep_in_window(tmp_path, tables, 1012e6, 1020e6) == {
        "compaction commits": 0,
        "vacuums": 0,
    }


def test_commit_files_are_split_on_newlines_only(tmp_path: Path) -> None:
    """A string in a commit may hold U+2028, U+2029 or U+0085 raw (Delta writes them
    so); they do not end a line."""
    log = tmp_path / "public" / "pgbench_accounts" / "_delta_log"
    log.mkdir(parents=True)
    for version, operation in ((0, "MERGE"), (1, "OPTIMIZE")):
        actions = [
            {"add": {"path": "a", "stats": '{"minValues":{"s":"x\u2028\u2029\x85y"}}'}},
            {"commitInfo": {"operation": operation, "note": "\u2028"}},
        ]
        path = log / f"{version:020d}.json"
        path.write_text(
            "\n".join(json.dumps(a, ensure_ascii=False) for a in actions) + "\n",
            encoding="utf-8",
        )
        os.utime(path, (1001.0, 1001.0))
    assert "\u2028" in (log / f"{1:020d}.json").read_text(encoding="utf-8")
    counts = upkeep_in_window(tmp_path, ["pgbench_accounts"], 1000e6, 1010e6)
    assert counts == {"compaction commits": 1, "vacuums": 0}


def test_a_record_no_commit_covers_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "public" / "pgbench_accounts" / "_delta_log"
    _commit(log, 0, [{"commitInfo": {"userMetadata": _state({0: 10}, 0)}}], 1000.0)
    arrivals = Arrivals(commit_us={(TOPIC, 0, 10): 0}, received_us={(TOPIC, 0, 10): 0})
    with pytest.raises(SystemExit, match="never became visible"):
        visible_latencies_ms(arrivals, apply_visibility(tmp_path))


def test_the_baseline_maps_batches_to_commits_by_epoch(tmp_path: Path) -> None:
    table, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    for batch, end in ((0, 4), (1, 4), (2, 9)):
        (checkpoint / "offsets" / str(batch)).write_text(
            f'v1\n{{"batchWatermarkMs":0}}\n{{"{TOPIC}":{{"0":{end}}}}}\n'
        )
    # Batch 1 read nothing new and wrote no commit; batch 2 did.
    _commit(
        table / "_delta_log", 0, [{"commitInfo": {"operationParameters": {"epochId": "0"}}}], 10
    )
    _commit(
        table / "_delta_log", 1, [{"commitInfo": {"operationParameters": {"epochId": "2"}}}], 12
    )
    seen = baseline_visibility(table, checkpoint)
    assert seen[(TOPIC, 0)] == ([4, 9], [10_000_000.0, 12_000_000.0])
    arrivals = Arrivals(commit_us={(TOPIC, 0, 3): 9_000_000, (TOPIC, 0, 4): 9_000_000})
    assert visible_latencies_ms(arrivals, seen) == [1000.0, 3000.0]


def test_percentiles_pick_from_the_sorted_values() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 100.0


def test_a_lag_that_breathes_keeps_up_and_a_growing_one_does_not() -> None:
    at = [float(t) for t in range(300)]
    breathing = [(20 + (t % 5) * 4) * 1024**2 for t in range(300)]
    growing = [(20 + t) * 1024**2 for t in range(300)]
    assert keeps_up(at, breathing)
    assert not keeps_up(at, growing)
    assert keeps_up(at, [1024] * 300), "a small lag below the floor always keeps up"
    assert not keeps_up([], [])


def test_the_rate_doubles_while_it_keeps_up_then_bisects() -> None:
    tps0 = 1000.0
    rate, low, high = next_rate(50.0, True, 0.0, tps0)
    assert (rate, low, high) == (100.0, 50.0, tps0), "kept up, none fell behind: doubled"
    rate, low, high = next_rate(rate, False, low, high)
    assert (rate, low, high) == (75.0, 50.0, 100.0), "fell behind: halfway back"
    rate, low, high = next_rate(rate, True, low, high)
    assert (rate, low, high) == (87.5, 75.0, 100.0), "doubling would pass what fell behind"
    assert next_rate(600.0, True, 0.0, tps0) == (800.0, 600.0, tps0), "never past tps0"
