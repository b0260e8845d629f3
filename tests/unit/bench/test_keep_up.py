"""The keep-up benchmark's pure parts: backlog size, batches read from apply's log."""

from __future__ import annotations

import pytest

from bench.keep_up import TARGET, Verdict, committed_batches, transactions_per_client


def test_transactions_cover_the_requested_changes() -> None:
    # 4 row changes per transaction, 2 clients: 8 per -t step.
    assert transactions_per_client(1_000_000) == 125_000
    assert transactions_per_client(9) == 2
    assert transactions_per_client(8) == 1
    with pytest.raises(ValueError, match="positive"):
        transactions_per_client(0)


def test_committed_batches_come_from_apply_log_lines() -> None:
    log = "\n".join(
        [
            "INFO apply.batch.write "
            "batch 3 to public.pgbench_accounts: version 7 committed, 10 records",
            "INFO apply.batch.write "
            "batch 3 to public.pgbench_history: version 2 committed, 3 records",
            "INFO apply.batch.write "
            "batch 4 to public.pgbench_accounts: version 7 skipped as already "
            "committed, 10 records",
            "INFO apply.batch.write "
            "batch 12 to public.pgbench_tellers: version 40 committed, 1 records",
            "INFO apply.batch.write "
            "batch 14 to public.pgbench_tellers from the driver: version 9 committed, 2 records",
            "INFO apply.app batch 13 table public.pgbench_tellers: records=1",
        ]
    )
    assert committed_batches(log) == {3, 12, 14}


def test_verdict_compares_the_lake_with_the_drain() -> None:
    assert Verdict(capture_s=100.0, lake_s=100.0 * TARGET).met
    assert not Verdict(capture_s=100.0, lake_s=100.0 * TARGET + 1).met
    assert Verdict(capture_s=40.0, lake_s=50.0).ratio == pytest.approx(1.25)
