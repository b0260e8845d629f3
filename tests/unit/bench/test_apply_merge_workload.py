"""The apply benchmark's workload: a valid change stream whose end state is known."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from bench.apply_merge import ACCOUNTS, MIXES, Distribution, Workload
from schemas.change_record import ChangeEncoder, build_table_schemas
from schemas.operation import Operation


def test_snapshot_reads_every_key_at_one_point() -> None:
    workload = Workload(keys=50)
    snapshot = list(workload.snapshot())
    assert [c.op for c in snapshot] == [Operation.READ] * 50
    assert [c.ordinal for c in snapshot] == list(range(50))
    assert len({c.commit_lsn for c in snapshot}) == 1
    assert [c.after["aid"] for c in snapshot if c.after is not None] == list(range(1, 51))
    with pytest.raises(RuntimeError):
        list(workload.snapshot())


@pytest.mark.parametrize("distribution", list(Distribution))
def test_changes_follow_the_mix_and_touch_only_live_keys(distribution: Distribution) -> None:
    workload = Workload(keys=2_000, distribution=distribution)
    table: dict[int, Mapping[str, Any]] = {}
    positions = []
    for change in (*workload.snapshot(), *workload.changes(20_000)):
        positions.append((change.commit_lsn, change.ordinal))
        if change.op is Operation.DELETE:
            assert change.before is not None
            assert change.before_key_only
            assert change.before["aid"] in table, "a delete of a row that is not there"
            del table[change.before["aid"]]
            continue
        assert change.after is not None
        aid = change.after["aid"]
        if change.op is Operation.UPDATE:
            assert aid in table, "an update of a row that is not there"
        else:
            assert aid not in table, "an insert of a row that is there"
        table[aid] = change.after

    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions), "every change has its own position"
    counts = workload.counts
    assert counts[Operation.READ] == 2_000
    changes = counts[Operation.UPDATE] + counts[Operation.INSERT] + counts[Operation.DELETE]
    assert changes == 20_000
    mix = MIXES[distribution]
    for op, share in (
        (Operation.UPDATE, mix.update),
        (Operation.INSERT, mix.insert),
        (Operation.DELETE, mix.delete),
    ):
        assert abs(counts[op] / changes - share) < 0.02, op
    expected = workload.expected()
    assert expected.rows == len(table)
    assert expected.key_sum == sum(table)
    assert expected.balance_sum == sum(row["abalance"] for row in table.values())


def _hot_share(workload: Workload, changes: int) -> float:
    """Share of the updates that went to the newest tenth of the keys existing then."""
    highest, hot, updates = 0, 0, 0
    for change in (*workload.snapshot(), *workload.changes(changes)):
        if change.after is None:
            continue
        aid = change.after["aid"]
        if change.op is Operation.UPDATE:
            updates += 1
            hot += aid > highest * 0.9
        highest = max(highest, aid)
    return hot / updates


def test_skewed_changes_go_mostly_to_the_newest_keys() -> None:
    assert _hot_share(Workload(keys=10_000, distribution=Distribution.SKEWED), 20_000) > 0.85
    assert _hot_share(Workload(keys=10_000), 20_000) < 0.15


def test_same_seed_same_stream_and_every_change_encodes() -> None:
    first, second = Workload(keys=100, seed=7), Workload(keys=100, seed=7)
    stream = [*first.snapshot(), *first.changes(500)]
    assert stream == [*second.snapshot(), *second.changes(500)]
    encoder = ChangeEncoder(build_table_schemas(ACCOUNTS))
    for change in stream:
        assert encoder.encode_value(change)[:2] == b"\xc3\x01"
        assert encoder.encode_key(change)[:2] == b"\xc3\x01"
