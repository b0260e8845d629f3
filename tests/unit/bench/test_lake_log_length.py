"""bench/lake_log_length.py's padding of a log, read back by delta-rs, and its arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from bench.lake_log_length import Lake, LengthResult, pad_log, parse_arguments, report
from bench.lake_write_modes import accounts_columns, seed_accounts


def test_a_padded_log_holds_the_length_asked_and_the_table_reads_as_before(
    tmp_path: Path,
) -> None:
    path = tmp_path / "accounts"
    seed_accounts(path, accounts_columns(), 50, 50)
    rows_before = DeltaTable(str(path)).to_pyarrow_table().num_rows

    version = pad_log(path, 120)

    commits = sorted(p.name for p in (path / "_delta_log").glob("*.json"))
    assert len(commits) == 120
    assert commits[-1] == f"{119:020d}.json"
    assert (path / "_delta_log" / f"{119:020d}.checkpoint.parquet").exists()
    table = DeltaTable(str(path))
    assert version == table.version() == 119
    assert table.to_pyarrow_table().num_rows == rows_before == 50


@pytest.mark.parametrize(
    "argv",
    [["--lengths", "1"], ["--merges", "0"], ["--batch", "0"], ["--rows", "10", "--batch", "11"]],
)
def test_arguments_that_measure_nothing_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_arguments(argv)


def test_a_local_lake_merges_the_seeded_table_in_place_and_has_no_server() -> None:
    arguments = parse_arguments([])
    assert arguments.lake == "local"
    lake = Lake()
    assert lake.place(Path("/scratch/log-100")) == "/scratch/log-100"
    assert lake.server_cpu() == 0.0
    with pytest.raises(SystemExit):
        parse_arguments(["--lake", "gs"])


def test_a_servers_cpu_is_the_mean_of_its_merges_and_shown_as_its_column(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The kernel counts a server's CPU in 10 ms ticks: a median of 0, 0, 10 ms would say 0.
    base = LengthResult(100, 102, (0.06,), (0.05,), (0.0, 0.0, 0.01))
    longer = LengthResult(17_280, 17_282, (0.07,), (0.05,), (0.01, 0.02, 0.03))
    assert base.server_cpu == pytest.approx(0.01 / 3)
    report([base, longer])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith("MinIO CPU a MERGE, mean |")
    assert printed[-1].endswith("| 20.0 ms |")
    assert LengthResult(100, 102, (0.06,), (0.05,)).server_cpu is None
