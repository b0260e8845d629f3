"""apply.delta_log: a commit file's commitInfo and txn actions, and where it lives."""

from __future__ import annotations

import json

from apply.delta_log import commit_file, parse_commit


def test_a_commit_file_lives_under_the_log_with_twenty_digits() -> None:
    assert commit_file("s3a://lake/public/t/", 42) == (
        "s3a://lake/public/t/_delta_log/00000000000000000042.json"
    )


def test_commit_info_and_transactions_are_read_and_other_actions_left_alone() -> None:
    actions = [
        {"txn": {"appId": "apply-1", "version": 7, "lastUpdated": 1}},
        {"add": {"path": "part-0.parquet", "size": 10, "dataChange": True}},
        {
            "commitInfo": {
                "operation": "MERGE",
                "operationMetrics": {"numTargetRowsInserted": "3", "numSourceRows": "4"},
                "userMetadata": '{"v": 1}',
            }
        },
        {"remove": {"path": "part-old.parquet", "dataChange": True}},
    ]
    commit = parse_commit(12, "\n".join(json.dumps(a) for a in actions) + "\n\n")

    assert (commit.version, commit.operation, commit.user_metadata) == (12, "MERGE", '{"v": 1}')
    assert commit.metrics == {"numTargetRowsInserted": "3", "numSourceRows": "4"}
    assert commit.written_by("apply-1", 7)
    assert not commit.written_by("apply-1", 6)
    assert not commit.written_by("other", 7)


def test_a_commit_without_metrics_or_metadata_reads_as_empty() -> None:
    commit = parse_commit(0, json.dumps({"commitInfo": {"operation": "OPTIMIZE"}}))

    assert (commit.operation, commit.metrics, commit.user_metadata) == ("OPTIMIZE", {}, None)
    assert commit.transactions == {}
