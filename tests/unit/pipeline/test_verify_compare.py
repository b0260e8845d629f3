"""The classification rule of verify and its bucket planning (pipeline.verify.compare)."""

from __future__ import annotations

import pytest

from pipeline.verify.compare import (
    MAX_BUCKETS,
    BucketStats,
    LakeRow,
    Outcome,
    SourceRow,
    bucket_count,
    classify,
    classify_key,
    differing_buckets,
)

C = 1_000


@pytest.mark.parametrize(
    ("source", "lake", "final", "expected"),
    [
        (SourceRow("a"), LakeRow("a", C - 1), False, Outcome.EQUAL),
        (SourceRow("a"), LakeRow("b", C - 1), False, Outcome.DIFFERENT),
        (None, LakeRow("a", C - 1), False, Outcome.EXTRA),
        (SourceRow("a"), LakeRow("b", C), False, Outcome.UNSETTLED),
        (None, LakeRow("a", C + 5), False, Outcome.UNSETTLED),
        (SourceRow("a"), None, False, Outcome.UNSETTLED),
        (None, None, False, Outcome.EQUAL),
        # The last round reports what is still unsettled.
        (SourceRow("a"), None, True, Outcome.MISSING),
        (SourceRow("a"), LakeRow("a", C), True, Outcome.CHANGING),
        # Definite outcomes do not depend on the round.
        (SourceRow("a"), LakeRow("b", C - 1), True, Outcome.DIFFERENT),
        (None, LakeRow("a", 0), True, Outcome.EXTRA),
        # Whole-row keys: the lake keeps one copy of a row the source holds twice.
        (SourceRow("a", count=2), LakeRow("a", C - 1), False, Outcome.DIFFERENT),
        (SourceRow("a"), LakeRow("a", C - 1, count=2), False, Outcome.DIFFERENT),
    ],
)
def test_classify_key_follows_the_rule(
    source: SourceRow | None, lake: LakeRow | None, final: bool, expected: Outcome
) -> None:
    assert classify_key(source, lake, C, final=final) is expected


def test_classify_groups_sorted_keys_and_leaves_equal_ones_out() -> None:
    source = {"1": SourceRow("a"), "2": SourceRow("b"), "4": SourceRow("d"), "5": SourceRow("e")}
    lake = {
        "1": LakeRow("a", 10),
        "2": LakeRow("x", 10),
        "3": LakeRow("c", 10),
        "4": LakeRow("d2", C + 1),
    }
    result = classify(["5", "4", "3", "2", "1", "2"], source, lake, C, final=False)
    assert result.keys == {
        Outcome.DIFFERENT: ["2"],
        Outcome.EXTRA: ["3"],
        Outcome.UNSETTLED: ["4", "5"],
    }
    assert result.of(Outcome.MISSING) == []


def test_differing_buckets_treats_an_absent_bucket_as_empty() -> None:
    source = {0: BucketStats(2, 10), 1: BucketStats(1, 5), 3: BucketStats(1, 7)}
    lake = {0: BucketStats(2, 10), 1: BucketStats(1, 6), 2: BucketStats(1, 1)}
    assert differing_buckets(source, lake) == [1, 2, 3]
    assert differing_buckets(source, source) == []
    assert differing_buckets({0: BucketStats(0, 0)}, {}) == []


@pytest.mark.parametrize(
    ("rows", "buckets"),
    [(0, 1), (1, 1), (1_000, 1), (1_001, 2), (1_000_000, 1_000), (10**12, MAX_BUCKETS)],
)
def test_bucket_count_aims_at_a_thousand_rows_per_bucket(rows: int, buckets: int) -> None:
    assert bucket_count(rows) == buckets
