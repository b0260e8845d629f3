"""apply.lake.delta_log: a commit file's commitInfo and txn actions, and where it lives; a
commit file is newline-delimited JSON whose strings carry any character raw."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from apply.lake.delta_log import (
    MalformedCommitError,
    commit_file,
    local_path,
    newest_local_version,
    parse_commit,
    sync_commits,
)
from tests.plugins.fuzzing import run_fuzzer

FUZZ_RUNS = 20_000


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


# Every character str.splitlines breaks a line at besides "\n": JSON lets a string carry
# each of them raw, and Delta's writers do.
LINE_BOUNDARIES = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def test_every_line_boundary_inside_a_string_stays_in_its_action() -> None:
    metadata = json.dumps({"state": f"a{LINE_BOUNDARIES}b"}, ensure_ascii=False)
    stats = json.dumps(
        {"minValues": {"note": f"x{LINE_BOUNDARIES}"}, "maxValues": {"id": LINE_BOUNDARIES}},
        ensure_ascii=False,
    )
    actions = [
        {"txn": {"appId": f"apply{LINE_BOUNDARIES}", "version": 3}},
        {"add": {"path": "part-0.parquet", "stats": stats}},
        {"commitInfo": {"operation": "MERGE", "userMetadata": metadata}},
    ]
    text = "\n".join(json.dumps(a, ensure_ascii=False) for a in actions)
    assert "\u2028" in text
    assert "\x85" in text

    commit = parse_commit(5, text)

    assert commit.user_metadata == metadata
    assert commit.written_by(f"apply{LINE_BOUNDARIES}", 3)
    assert commit.operation == "MERGE"


def test_a_commit_delta_rs_writes_with_line_boundaries_in_keys_stats_and_metadata(
    tmp_path: Path,
) -> None:
    keys = [f"k{c}" for c in LINE_BOUNDARIES]
    rows = pa.table({"id": keys, "note": [f"{c}note" for c in LINE_BOUNDARIES]})
    metadata = f"state{LINE_BOUNDARIES}"
    write_deltalake(
        str(tmp_path),
        rows,
        commit_properties=CommitProperties(
            custom_metadata={"userMetadata": metadata},
            app_transactions=[Transaction(f"app{LINE_BOUNDARIES}", 9)],
        ),
    )
    text = Path(commit_file(str(tmp_path), 0)).read_text(encoding="utf-8")
    assert "\u2028" in text, "delta-rs escaped the characters: this test no longer tests"

    commit = parse_commit(0, text)

    assert commit.user_metadata == metadata
    assert commit.written_by(f"app{LINE_BOUNDARIES}", 9)
    assert DeltaTable(str(tmp_path)).to_pyarrow_table().column("id").to_pylist() == keys


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ('{"commitInfo": {}}\n{"add": {"path": "p\u2028', 2, "not JSON"),
        ('{"commitInfo": {}}\n[1, 2]', 2, "not a JSON object"),
        ('{"txn": {"appId": 1, "version": 2}}', 1, "a txn action without"),
        ('{"txn": {"appId": "a", "version": "2"}}', 1, "a txn action without"),
        ('{"commitInfo": "MERGE"}', 1, "commitInfo is not a JSON object"),
        ('\n{"commitInfo": {"userMetadata": 4}}', 2, "userMetadata is not a string"),
        ('{"commitInfo": {"operationMetrics": []}}', 1, "operationMetrics is not"),
        ("[" * 100_000, 1, "nested too deeply"),
    ],
)
def test_a_line_that_is_not_a_delta_action_names_the_commit_and_line(
    text: str, line: int, reason: str
) -> None:
    with pytest.raises(MalformedCommitError) as raised:
        parse_commit(8, text)

    assert (raised.value.version, raised.value.line) == (8, line)
    assert reason in raised.value.reason
    assert str(raised.value).startswith(f"commit 8, line {line}: ")


def test_the_commit_file_fuzzer_finds_nothing(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "well-formed").write_bytes(b"\x00" + LINE_BOUNDARIES.encode() * 4)
    (corpus / "any-text").write_bytes(
        b"\x01" + b'{"commitInfo": {"operation": "WRITE"}}\n{"txn": {}}'
    )
    run_fuzzer("fuzz_commit_file", corpus, FUZZ_RUNS)


def test_a_commit_names_the_data_files_it_adds() -> None:
    actions = [
        {"add": {"path": "p%3D1/part-0.parquet", "size": 1}},
        {"remove": {"path": "part-old.parquet"}},
        {"add": {"path": "part-1.parquet", "size": 1}},
    ]
    commit = parse_commit(3, "\n".join(json.dumps(a) for a in actions))

    assert commit.added == ("p%3D1/part-0.parquet", "part-1.parquet")
    with pytest.raises(MalformedCommitError, match="an add action without a path"):
        parse_commit(3, json.dumps({"add": {"size": 1}}))


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("/lake/public/t", "/lake/public/t"),
        (".local/lake/public/t", ".local/lake/public/t"),
        ("file:/lake/public/t", "/lake/public/t"),
        ("file:///lake/public/t", "/lake/public/t"),
        ("s3a://bucket/lake/public/t", None),
    ],
)
def test_only_a_local_lake_has_a_local_path(uri: str, path: str | None) -> None:
    assert local_path(uri) == path


def test_every_file_a_commit_adds_and_their_directories_are_flushed(tmp_path: Path) -> None:
    rows = pa.table({"id": [1, 2, 3], "part": ["a", "b=c", "a"]})
    write_deltalake(str(tmp_path), rows, partition_by=["part"])
    write_deltalake(str(tmp_path), rows, mode="append", partition_by=["part"])
    added = [parse_commit(v, Path(commit_file(str(tmp_path), v)).read_text()).added for v in (0, 1)]
    assert all(len(files) == 2 for files in added)  # one file per partition, each commit

    # Commit 1: its two data files, the commit, and three directories (two partitions and
    # the log). Both commits, the table's creation among them: four data files, two
    # commits, the same three directories, the table's, the one holding it (a schema's)
    # and the one holding that (the lake root's).
    assert sync_commits(str(tmp_path), 1, 1) == 2 + 1 + 3
    assert sync_commits(f"file:{tmp_path}", 0, 1) == 4 + 2 + 3 + 3
    assert sync_commits(str(tmp_path), 2, 1) == 0
    assert sync_commits("s3a://bucket/t", 0, 1) == 0
    assert newest_local_version(str(tmp_path)) == 1
    assert newest_local_version(str(tmp_path / "none")) is None
    assert newest_local_version("s3a://bucket/t") is None


def test_a_commit_whose_data_file_is_missing_cannot_be_made_durable(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path), pa.table({"id": [1]}))
    (missing,) = parse_commit(0, Path(commit_file(str(tmp_path), 0)).read_text()).added
    (tmp_path / missing).unlink()

    with pytest.raises(FileNotFoundError):
        sync_commits(str(tmp_path), 0, 0)
