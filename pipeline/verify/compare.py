"""Which keys differ between the source at a verify point and the lake: pure.

The verify point ``C`` is the consistent point of a snapshot of the source. Once the
pipeline's slot has confirmed ``C``, every change committed before ``C`` is in the lake
(or parked), and the lake may also hold changes committed at or after ``C``. Each lake
row carries the position (commit LSN) of the change that last wrote it, so per key
``k``, with ``S`` the source row at ``C`` and ``L`` the lake row at position ``p``:

======================  ============================  ==============================
lake                    source                        outcome
======================  ============================  ==============================
present, ``p < C``      equal                         equal
present, ``p < C``      different                     DIFFERENT (definite)
present, ``p < C``      absent                        EXTRA (definite)
present, ``p >= C``     any                           unsettled: changed after ``C``
absent                  present                       unsettled: missing, or deleted
                                                      after ``C``
absent                  absent                        equal
======================  ============================  ==============================

Unsettled keys are looked at again at a later verify point; in the last round they are
reported: absent from the lake as MISSING, written after ``C`` as CHANGING.

Rows are compared by the md5 of their canonical text (:mod:`pipeline.verify.canonical`)
and, for tables without a key (whole-row keys), by how many times each row occurs.
Buckets (:func:`differing_buckets`) narrow the search first: per bucket of keys, the
row count and the sum of a 60-bit integer from each row's md5; equal buckets are equal
with overwhelming probability, and only the keys of the others are fetched.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

ROWS_PER_BUCKET = 1_000
MAX_BUCKETS = 100_000


class Outcome(enum.Enum):
    EQUAL = "equal"
    MISSING = "missing"
    EXTRA = "extra"
    DIFFERENT = "different"
    CHANGING = "changing"
    """Still written at or after each verify point in the last round."""
    UNSETTLED = "unsettled"


REPORTED = (Outcome.MISSING, Outcome.EXTRA, Outcome.DIFFERENT, Outcome.CHANGING)
"""Outcomes that are differences."""


@dataclass(frozen=True, slots=True)
class BucketStats:
    rows: int
    hash_sum: int


@dataclass(frozen=True, slots=True)
class SourceRow:
    row_md5: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class LakeRow:
    row_md5: str
    commit_lsn: int
    """The newest position among the rows of this key (apply writes it on every row)."""
    count: int = 1


def bucket_count(rows: int) -> int:
    """Buckets for a table of about ``rows`` rows (both sides use the same number)."""
    return max(1, min(MAX_BUCKETS, math.ceil(rows / ROWS_PER_BUCKET)))


def differing_buckets(
    source: Mapping[int, BucketStats], lake: Mapping[int, BucketStats]
) -> list[int]:
    """Buckets whose count or hash sum differs; a bucket absent on one side is empty."""
    empty = BucketStats(0, 0)
    return sorted(
        bucket
        for bucket in source.keys() | lake.keys()
        if source.get(bucket, empty) != lake.get(bucket, empty)
    )


def classify_key(
    source: SourceRow | None, lake: LakeRow | None, verify_point: int, *, final: bool
) -> Outcome:
    """The module docstring's rule for one key."""
    if lake is None:
        if source is None:
            return Outcome.EQUAL
        return Outcome.MISSING if final else Outcome.UNSETTLED
    if lake.commit_lsn >= verify_point:
        return Outcome.CHANGING if final else Outcome.UNSETTLED
    if source is None:
        return Outcome.EXTRA
    if source.row_md5 != lake.row_md5 or source.count != lake.count:
        return Outcome.DIFFERENT
    return Outcome.EQUAL


@dataclass
class Classification:
    """Keys by outcome (EQUAL left out)."""

    keys: dict[Outcome, list[str]] = field(default_factory=dict)

    def of(self, outcome: Outcome) -> list[str]:
        return self.keys.get(outcome, [])


def classify(
    keys: Iterable[str],
    source: Mapping[str, SourceRow],
    lake: Mapping[str, LakeRow],
    verify_point: int,
    *,
    final: bool,
) -> Classification:
    """Every key of ``keys`` by :func:`classify_key`, keys sorted within an outcome."""
    result = Classification()
    for key in sorted(set(keys)):
        outcome = classify_key(source.get(key), lake.get(key), verify_point, final=final)
        if outcome is not Outcome.EQUAL:
            result.keys.setdefault(outcome, []).append(key)
    return result
