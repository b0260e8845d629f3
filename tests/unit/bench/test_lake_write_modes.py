"""bench/lake_write_modes.py's pure parts: what a commit wrote, and which keys a batch
updates."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from bench.lake_write_modes import (
    Case,
    CommitWrites,
    Keys,
    batch_keys,
    commit_writes,
    hot_range,
    read_commit,
    updates_for,
)


def _add(path: str, size: int, vector: dict[str, Any] | None = None) -> dict[str, Any]:
    add: dict[str, Any] = {"path": path, "size": size, "dataChange": True}
    if vector is not None:
        add["deletionVector"] = vector
    return {"add": add}


def _vector(storage: str, size: int) -> dict[str, Any]:
    return {"storageType": storage, "pathOrInlineDv": "x", "sizeInBytes": size, "cardinality": 3}


def test_a_copy_on_write_commit_counts_every_file_it_adds() -> None:
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"operation": "MERGE", "operationMetrics": {"num_target_rows_copied": 90}}},
        {"remove": {"path": "old.parquet", "size": 1000}},
        _add("new-1.parquet", 700),
        _add("new-2.parquet", 300),
    ]
    assert commit_writes(actions) == CommitWrites(1000, 2, 0, 90)


def test_a_deletion_vector_commit_counts_new_rows_and_vectors_not_the_readded_file() -> None:
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"operationMetrics": {"numTargetRowsCopied": "0"}}},
        {"remove": {"path": "big.parquet", "size": 50_000_000}},
        _add("big.parquet", 50_000_000, _vector("u", 44)),
        {"remove": {"path": "other.parquet", "size": 20_000_000}},
        _add("other.parquet", 20_000_000, _vector("i", 30)),  # inline: no file written
        _add("changed.parquet", 1_200),
    ]
    assert commit_writes(actions) == CommitWrites(1_200, 1, 44, 0)


def test_a_commit_without_metrics_copies_nothing_known() -> None:
    assert commit_writes([_add("a.parquet", 5)]).rows_copied is None


def test_a_commit_is_read_from_its_log_file(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    lines = [json.dumps(action) for action in (_add("a.parquet", 5), _add("b.parquet", 6))]
    (log / "00000000000000000003.json").write_text("\n".join(lines) + "\n")
    assert read_commit(tmp_path, 3) == CommitWrites(11, 2, 0, None)


@pytest.mark.parametrize(
    ("rows", "batch", "share", "expected"),
    [
        (1_000_000, 10, 0.01, 10_000),
        (1_000_000, 100_000, 0.01, 100_000),
        (100, 10, 0.5, 50),
        (100, 500, 0.01, 100),
    ],
)
def test_the_hot_range_is_a_share_of_the_table_at_least_the_batch(
    rows: int, batch: int, share: float, expected: int
) -> None:
    assert hot_range(rows, batch, share) == expected


def test_hot_keys_are_the_newest_and_random_keys_span_the_table() -> None:
    rng = random.Random(1)
    hot = batch_keys(Case(100_000, Keys.HOT, 100), rng, 0.01)
    assert len(set(hot)) == 100
    assert hot == sorted(hot)
    assert min(hot) > 99_000
    assert max(hot) <= 100_000
    spread = batch_keys(Case(100_000, Keys.RANDOM, 1_000), rng, 0.01)
    assert len(set(spread)) == 1_000
    assert min(spread) < 10_000
    assert max(spread) > 90_000


def test_a_batch_larger_than_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="a batch of 20"):
        batch_keys(Case(10, Keys.RANDOM, 20), random.Random(1), 0.01)


def test_every_mode_gets_the_same_batches_and_the_sum_they_leave() -> None:
    case = Case(1_000, Keys.RANDOM, 100)
    first, second = updates_for(case, 3, 0.01), updates_for(case, 3, 0.01)
    assert first == second
    final: dict[int, int] = {}
    for keys, balances in first.batches:
        final.update(zip(keys, balances, strict=True))
    assert first.balance_sum() == sum(final.values())
