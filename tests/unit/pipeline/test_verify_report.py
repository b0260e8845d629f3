"""verify's report (counts, samples, status, both printed forms) and its arguments."""

from __future__ import annotations

import json

import pytest

from pipeline.verify.command import parse_arguments
from pipeline.verify.compare import Outcome
from pipeline.verify.report import (
    TableReport,
    TableStatus,
    VerifyReport,
    format_human,
    format_json,
)


def test_counts_are_complete_and_samples_capped() -> None:
    table = TableReport("public.orders")
    table.add(Outcome.MISSING, ["3", "1", "2"], max_keys=2)
    table.add(Outcome.MISSING, ["0"], max_keys=2)
    table.add(Outcome.EXTRA, [], max_keys=2)
    assert table.count(Outcome.MISSING) == 4
    assert table.keys[Outcome.MISSING].sample == ["1", "2"]
    assert Outcome.EXTRA not in table.keys
    assert table.status is TableStatus.DIFFERENT
    table.add(Outcome.MISSING, ["9"], max_keys=2, count=1000)
    assert table.count(Outcome.MISSING) == 1004


def test_status_order_failed_errored_different_ok() -> None:
    table = TableReport("public.t")
    assert table.ok
    table.add(Outcome.DIFFERENT, ["1"], max_keys=5)
    assert table.status is TableStatus.DIFFERENT
    table.errored = "column x changed type"
    assert table.status.value == "errored"
    table.error = "query failed"
    assert table.status.value == "failed"
    assert not VerifyReport([TableReport("a"), table]).ok
    assert VerifyReport([TableReport("a")]).ok


def test_printed_forms_carry_verify_point_version_and_keys() -> None:
    table = TableReport("public.t", verify_points=["0/16B3748"], lake_versions=[7])
    table.add(Outcome.CHANGING, ["42"], max_keys=5)
    report = VerifyReport([table], elapsed_s=1.5)
    human = format_human(report)
    assert "public.t: DIFFERENT (verify point 0/16B3748; lake version 7; 1 round(s)" in human
    assert "changing: 1 key(s), written again after every verify point" in human
    assert "keys: 42" in human
    assert human.endswith("DIFFERENCES FOUND (1 table(s), 1.5 s)")
    document = json.loads(format_json(report))
    assert document["ok"] is False
    assert document["tables"][0]["changing"] == {"count": 1, "sample": ["42"]}
    assert document["tables"][0]["lake_versions"] == [7]


def test_arguments() -> None:
    arguments = parse_arguments(["--table", "a.b", "--table", "c.d", "--json", "--rounds", "2"])
    assert arguments.tables == ["a.b", "c.d"]
    assert arguments.json
    assert arguments.rounds == 2
    assert arguments.timeout == 300
    assert arguments.max_keys == 20
    assert parse_arguments([]).tables is None


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--timeout", "soon"], ["--max-keys", "-1"]])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_arguments(argv)
    assert exit_info.value.code == 2
