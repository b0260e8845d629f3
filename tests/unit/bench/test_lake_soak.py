"""bench/lake_soak.py's pure parts: the workload and its totals, the totals by Delta
version, the bounded rule, the cost ratio, Delta intervals and the log's footprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from apply.lake.delta_schema import parse_value_schema
from apply.lake.driver_plan import CollectedRecord, decode_records
from bench.lake_soak import (
    COLUMNS,
    TABLE,
    Expected,
    Totals,
    Workload,
    bounded,
    data_footprint,
    log_footprint,
    median_ratio,
    parse_interval_s,
)
from schemas.change_record import ChangeEncoder, TableDescription, build_table_schemas
from schemas.operation import Operation


def test_the_workload_totals_follow_its_changes() -> None:
    workload = Workload(rows=1000, seed=7)
    loaded = workload.load()
    assert len(loaded) == 1000
    assert workload.totals == Totals(1000, 0)
    balances = {change.after["aid"]: 0 for change in loaded if change.after is not None}
    for _ in range(50):
        for change in workload.batch(50, 500):
            if change.op is Operation.DELETE:
                assert change.before is not None
                assert change.before["aid"] in balances  # never a key that is gone
                del balances[change.before["aid"]]
            else:
                assert change.after is not None
                key = change.after["aid"]
                assert (key in balances) is (change.op is Operation.UPDATE)
                balances[key] = change.after["abalance"]
    assert workload.totals == Totals(len(balances), sum(balances.values()))


def test_a_batch_is_one_transaction_later_than_the_one_before() -> None:
    workload = Workload(rows=100, seed=1)
    first, second = workload.batch(50, 60), workload.batch(50, 60)
    assert 50 <= len(first) <= 60
    assert {c.commit_lsn for c in first} == {first[0].commit_lsn}
    assert second[0].commit_lsn > first[0].commit_lsn
    assert [c.ordinal for c in second] == list(range(len(second)))
    assert Workload(rows=100, seed=1).batch(50, 60) == first


def test_the_changes_decode_as_apply_reads_them() -> None:
    schemas = build_table_schemas(TableDescription(TABLE.schema, TABLE.table, COLUMNS))
    value = parse_value_schema(TABLE, schemas.value_fingerprint, schemas.value_schema_json)
    encoder = ChangeEncoder(schemas)
    changes = Workload(rows=10, seed=3).batch(50, 50)
    records = [CollectedRecord(0, i, encoder.encode_value(c)) for i, c in enumerate(changes)]
    decoded = decode_records(records, value, value.columns)
    assert decoded.malformed == {}
    assert [c.op for c in decoded.changes] == [c.op.value for c in changes]


def test_a_version_without_an_apply_commit_holds_the_one_before() -> None:
    expected = Expected()
    expected.record(1, Totals(10, 5))
    expected.record(4, Totals(11, 6))
    assert expected.at(1) == expected.at(3) == Totals(10, 5)
    assert expected.at(9) == Totals(11, 6)
    with pytest.raises(KeyError):
        expected.at(0)
    with pytest.raises(ValueError, match="recorded after"):
        expected.record(4, Totals(0, 0))


def test_bounded_compares_the_last_quarter_with_the_second() -> None:
    sawtooth = [float(i % 10) for i in range(40)]
    assert bounded(sawtooth) is True
    growing = [float(i) for i in range(40)]
    assert bounded(growing) is False
    # A warm-up in the first quarter does not count against it.
    assert bounded([100.0, 90.0, 5.0, 5.0, 6.0, 5.0, 5.0, 5.5]) is True
    assert bounded([1.0] * 7) is None


def test_median_ratio() -> None:
    assert median_ratio([1.0, 2.0, 3.0], [2.4, 2.4]) == pytest.approx(1.2)
    assert median_ratio([], [1.0]) is None
    assert median_ratio([0.0], [1.0]) is None


def test_delta_intervals_in_seconds() -> None:
    assert parse_interval_s("interval 10 minutes") == 600
    assert parse_interval_s("interval 7 days") == 7 * 86_400
    assert parse_interval_s("interval 1 week") == 604_800
    assert parse_interval_s(None) is None
    with pytest.raises(ValueError, match="not a Delta interval"):
        parse_interval_s("10 minutes")
    with pytest.raises(ValueError, match="unknown unit"):
        parse_interval_s("interval 3 fortnights")


def test_the_log_footprint_counts_commits_and_the_newest_checkpoint(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    for version in range(3):
        (log / f"{version:020d}.json").write_bytes(b"x" * 10)
    (log / f"{2:020d}.crc").write_bytes(b"c")
    (log / f"{0:020d}.checkpoint.parquet").write_bytes(b"p" * 100)
    (log / f"{2:020d}.checkpoint.0000000001.0000000002.parquet").write_bytes(b"p" * 30)
    (log / f"{2:020d}.checkpoint.0000000002.0000000002.parquet").write_bytes(b"p" * 40)
    (log / "_last_checkpoint").write_bytes(b"{}")
    found = log_footprint(tmp_path)
    assert (found.commits, found.files) == (3, 8)
    assert found.bytes == 30 + 1 + 100 + 30 + 40 + 2
    assert (found.checkpoint_version, found.checkpoint_bytes) == (2, 70)
    assert len(found.checkpoint_parts) == 2


def test_data_on_disk_leaves_the_log_out(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    (tmp_path / "_delta_log" / "00000000000000000000.checkpoint.parquet").write_bytes(b"p" * 9)
    (tmp_path / "part-0.parquet").write_bytes(b"d" * 5)
    (tmp_path / "day=1").mkdir()
    (tmp_path / "day=1" / "part-1.parquet").write_bytes(b"d" * 7)
    assert data_footprint(tmp_path) == (2, 12)
