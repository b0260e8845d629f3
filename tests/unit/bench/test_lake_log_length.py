"""bench/lake_log_length.py's padding of a log, read back by delta-rs, and its arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from bench.lake_log_length import pad_log, parse_arguments
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
