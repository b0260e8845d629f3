"""The change log's pure parts: which state is newer, the fold's turns, and the freshest
view's SQL, run by DuckDB on tables made in memory (the same text runs on Spark SQL and
delta-rs in tests/integration/test_apply_change_log.py)."""

from __future__ import annotations

from typing import Any

import duckdb
import pytest

from apply.change_log import CHANGE_LOG_DIR, change_log_path, freshest_view_sql, newer_state
from apply.fold import Folds
from apply.positions import AppliedState, PartitionProgress
from apply.tables import TableId, table_of_segments, table_path

TOPIC = "cdc.public.orders"


def state(batch_id: int, **next_offsets: int) -> AppliedState:
    return AppliedState(
        table="public.orders",
        partitions={
            (TOPIC, int(p[1:])): PartitionProgress(o, None) for p, o in next_offsets.items()
        },
        table_lsn=None,
        commit_ts=None,
        truncated_at=None,
        batch_id=batch_id,
    )


def test_the_newer_state_is_the_one_covering_the_other() -> None:
    table, log = state(3, p0=10, p1=4), state(5, p0=12, p1=4)
    assert newer_state(table, log) is log
    assert newer_state(log, table) is log, "whichever side holds it"
    assert newer_state(None, log) is log
    assert newer_state(table, None) is table
    assert newer_state(None, None) is None
    # A table merged directly after its log was folded and emptied is ahead of the log.
    ahead = state(7, p0=15, p1=6)
    assert newer_state(ahead, log) is ahead
    # Equal offsets: the log's, which names the newest append.
    assert newer_state(state(5, p0=12, p1=4), log) is log


def test_logs_live_where_no_table_can() -> None:
    table = TableId("public", "orders")
    assert change_log_path("/lake/", table) == f"/lake/{CHANGE_LOG_DIR}/public/orders"
    assert table_path("/lake", table) == "/lake/public/orders"
    # The folder is no schema's: "-lo" is not an escape, so no name maps to it.
    with pytest.raises(ValueError):  # noqa: PT011 - table_of_segments raises the bare kind
        table_of_segments(CHANGE_LOG_DIR, "orders")
    assert table_of_segments("public", "orders") == table


def test_a_table_is_folded_when_its_turn_came_and_it_has_logged_changes() -> None:
    now = [100.0]
    folds = Folds(every_s=10, clock=lambda: now[0])
    a, b = TableId("public", "a"), TableId("public", "b")
    assert folds.due() == []
    folds.appended(a)
    assert folds.due() == [a], "never folded in this run: due at once"
    folds.folded(a, folds.mark(a))
    folds.appended(a)
    folds.appended(b)
    assert folds.due() == [b]
    assert folds.due(every=True) == [a, b]
    now[0] += 10
    assert folds.due() == [a, b]
    folds.folded(a, folds.mark(a))
    assert folds.due() == [b]
    assert folds.lock("/lake/public/a") is folds.lock("/lake/public/a/")


def test_an_append_during_a_fold_stays_due() -> None:
    now = [0.0]
    folds = Folds(every_s=10, clock=lambda: now[0])
    table = TableId("public", "a")
    folds.appended(table)
    mark = folds.mark(table)  # the fold reads the log...
    folds.appended(table)  # ...while the table's batch appends again
    folds.folded(table, mark)
    now[0] += 10
    assert folds.due() == [table], "the second append is not in the table yet"
    folds.folded(table, folds.mark(table))
    now[0] += 10
    assert folds.due() == []


KEYS = ["id", "part"]
COLUMNS = ["id", "part", "note"]


def view(
    table_rows: list[tuple[Any, ...]], log_rows: list[tuple[Any, ...]]
) -> set[tuple[Any, ...]]:
    """The view over a table of (id, part, note, lsn, ordinal) and a log of (id, part,
    note, lsn, ordinal, op): the (id, part, note) it shows."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE t (id BIGINT, part TEXT, note TEXT, _cdc_commit_lsn BIGINT, "
        "_cdc_ordinal BIGINT, _cdc_commit_ts TIMESTAMP)"
    )
    con.execute(
        "CREATE TABLE l (id BIGINT, part TEXT, note TEXT, _cdc_commit_lsn BIGINT, "
        "_cdc_ordinal BIGINT, _cdc_commit_ts TIMESTAMP, _cdc_op TEXT, _cdc_seq BIGINT)"
    )
    for row in table_rows:
        con.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?, NULL)", list(row))
    for row in log_rows:
        con.execute("INSERT INTO l VALUES (?, ?, ?, ?, ?, NULL, ?, 1)", list(row))
    sql = freshest_view_sql('"t"', '"l"', COLUMNS, KEYS, "duckdb")
    return {tuple(r[:3]) for r in con.execute(sql).fetchall()}


def test_the_view_shows_the_newest_change_of_each_key() -> None:
    table = [
        (1, "a", "t1", 10, 0),
        (2, "a", "t2", 10, 1),
        (3, "a", "t3", 30, 0),
        (1, "b", "t1b", 10, 2),
    ]
    log = [
        (1, "a", "l1-old", 20, 0, "UPDATE"),
        (1, "a", "l1-new", 20, 5, "UPDATE"),  # same transaction, later: wins
        (2, "a", None, 25, 0, "DELETE"),  # hides the table's row
        (3, "a", "l3-stale", 20, 0, "UPDATE"),  # older than the table's row: the table's stands
        (4, "a", "l4", 40, 0, "INSERT"),  # not in the table yet
        (5, "a", None, 40, 1, "DELETE"),  # deleted before the table saw it: nothing
        (1, "b", "l1b", 10, 2, "UPDATE"),  # the very change the table holds: one row, not two
    ]
    assert view(table, log) == {(1, "a", "l1-new"), (3, "a", "t3"), (4, "a", "l4"), (1, "b", "t1b")}


def test_the_view_of_an_empty_log_is_the_table_and_of_an_empty_table_the_log() -> None:
    table = [(1, "a", "t1", 10, 0)]
    assert view(table, []) == {(1, "a", "t1")}
    log = [
        (1, "a", "x", 10, 0, "INSERT"),
        (1, "a", "y", 11, 0, "UPDATE"),
        (2, "a", None, 12, 0, "DELETE"),
    ]
    assert view([], log) == {(1, "a", "y")}


def test_keys_compare_null_safe() -> None:
    # A key column may be null in a table keyed by all its columns (REPLICA IDENTITY FULL).
    table = [(1, None, "t", 10, 0)]
    log = [(1, None, "l", 20, 0, "UPDATE")]
    assert view(table, log) == {(1, None, "l")}


def test_spark_quotes_with_backticks_and_the_others_with_double_quotes() -> None:
    spark = freshest_view_sql("delta.`/t`", "delta.`/l`", ["a`b"], ["a`b"], "spark")
    assert "`a``b`" in spark
    assert '"a`b"' in freshest_view_sql('"t"', '"l"', ["a`b"], ["a`b"], "datafusion")
