"""The upkeep policy: which versions are a table's turn, and what a failure does."""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException

from apply.lake.upkeep import TableUpkeep, UpkeepRun, UpkeepTask, due, run_tasks, turn_offset
from apply.metrics import ApplyMetrics
from apply.settings import ApplySettings, UpkeepSettings

COMPACT, VACUUM = UpkeepTask.COMPACT, UpkeepTask.VACUUM
EVERY_4 = UpkeepSettings(compact_every_commits=4, vacuum_every_commits=12)


def test_defaults_and_environment() -> None:
    settings = ApplySettings().upkeep
    assert settings.enabled
    assert (settings.compact_every_commits, settings.vacuum_every_commits) == (100, 1000)
    assert settings.target_file_size_mb == 128


@pytest.mark.parametrize(
    ("before", "after", "tasks"),
    [
        (0, 1, ()),
        (2, 3, ()),
        (3, 4, (COMPACT,)),  # the MERGE's own version is the multiple
        (4, 5, ()),  # the OPTIMIZE's version is past it: no second turn
        (2, 5, (COMPACT,)),  # a column added, then the MERGE: the window holds 4
        (6, 9, (COMPACT,)),
        (11, 12, (COMPACT, VACUUM)),  # both turns: compaction first
        (1, 13, (COMPACT, VACUUM)),  # several multiples passed: one run each
    ],
)
def test_a_turn_is_a_multiple_passed_by_the_batch(
    before: int, after: int, tasks: tuple[UpkeepTask, ...]
) -> None:
    assert due(EVERY_4, before, after) == tasks


def test_a_new_table_is_not_due_for_its_creation() -> None:
    assert due(EVERY_4, -1, 0) == ()
    assert due(EVERY_4, -1, 1) == ()  # created, then merged
    assert due(UpkeepSettings(compact_every_commits=2), -1, 2) == (COMPACT,)


def test_a_batch_that_committed_nothing_is_never_due() -> None:
    assert due(EVERY_4, 4, 4) == ()
    assert due(EVERY_4, 8, 7) == ()


def test_a_table_not_due_costs_no_spark_call() -> None:
    no_session = cast(Any, None)  # any use of the session would raise
    upkeep = TableUpkeep(EVERY_4, observer=ApplyMetrics())
    assert (
        upkeep.after_commit(no_session, table="t", path="p", version_before=4, version_after=7)
        == ()
    )


def test_a_tables_turn_is_offset_by_its_name_the_same_in_every_process() -> None:
    # A CRC, not Python's salted hash: a restarted job and any other host agree.
    assert turn_offset("public.pgbench_accounts", 100) == 60
    assert turn_offset("public.pgbench_accounts", 1000) == 560
    assert turn_offset("public.t", 0) == 0
    offset = turn_offset("public.t", 4)
    first_turn = 4 - offset if offset else 4
    assert due(EVERY_4, first_turn - 1, first_turn, "public.t") == (COMPACT,)
    assert due(EVERY_4, first_turn, first_turn + 3, "public.t") == ()


def test_tables_at_the_same_versions_take_their_turns_in_different_batches() -> None:
    """Eleven tables snapshotted together and written by every batch share their versions:
    each still compacts once every 100 versions, and no batch carries the turns of more
    than a few of them."""
    tables = [
        "public.pgbench_accounts",
        "public.pgbench_branches",
        "public.pgbench_tellers",
        "public.pgbench_history",
        "public.bench_probe",
        *(f"public.bench_quiet_{i}" for i in range(1, 7)),
    ]
    settings = UpkeepSettings(compact_every_commits=100, vacuum_every_commits=1000)
    turns = dict.fromkeys(tables, 0)
    most_in_one_batch = 0
    for version in range(1, 1001):
        due_now = [t for t in tables if COMPACT in due(settings, version - 1, version, t)]
        for table in due_now:
            turns[table] += 1
        most_in_one_batch = max(most_in_one_batch, len(due_now))
    assert set(turns.values()) == {10}
    assert most_in_one_batch == 1
    assert due(settings, 0, 1000, tables[0]) == (COMPACT, VACUUM)


def test_switched_off() -> None:
    assert due(EVERY_4.model_copy(update={"enabled": False}), 3, 12) == ()
    assert due(UpkeepSettings(compact_every_commits=4, vacuum_every_commits=0), 11, 12) == (
        COMPACT,
    )


def test_files_stay_bounded_over_a_long_stream() -> None:
    """Every commit adds up to 3 files; upkeep's own commits come after the MERGE. Over
    1000 batches, no table ever holds the files of more commits than the policy says."""
    settings = UpkeepSettings(compact_every_commits=10, vacuum_every_commits=100)
    version, small_files, most = 0, 0, 0
    for _ in range(1000):
        before, version = version, version + 1  # the MERGE
        small_files += 3
        most = max(most, small_files)
        for task in due(settings, before, version):
            version += 1 if task is COMPACT else 2  # VACUUM START and VACUUM END
            if task is COMPACT:
                small_files = 0
    assert most <= 3 * 10


class _Clock:
    def __init__(self) -> None:
        self._ticks = itertools.count(0.0, 0.5)

    def __call__(self) -> float:
        return next(self._ticks)


def test_runs_are_timed_and_counted() -> None:
    metrics = ApplyMetrics()
    done: list[UpkeepTask] = []

    def run(task: UpkeepTask) -> str:
        done.append(task)
        return "did it"

    runs = run_tasks("public.t", (COMPACT, VACUUM), run, observer=metrics, clock=_Clock())

    assert done == [COMPACT, VACUUM]
    assert runs == (
        UpkeepRun("public.t", COMPACT, 0.5, failed=False),
        UpkeepRun("public.t", VACUUM, 0.5, failed=False),
    )
    registry = metrics.registry
    assert (
        registry.get_sample_value(
            "cdc_apply_upkeep_runs_total",
            {"table": "public.t", "operation": "compact", "outcome": "done"},
        )
        == 1
    )
    assert (
        registry.get_sample_value("cdc_apply_upkeep_duration_seconds_sum", {"operation": "vacuum"})
        == 0.5
    )


@pytest.mark.parametrize("error", [PySparkException("disk gone"), Py4JError("jvm said no")])
def test_a_spark_failure_defers_and_the_next_task_still_runs(error: Exception) -> None:
    metrics = ApplyMetrics()

    def run(task: UpkeepTask) -> str:
        if task is COMPACT:
            raise error
        return "did it"

    runs = run_tasks("public.t", (COMPACT, VACUUM), run, observer=metrics, clock=_Clock())

    assert [(r.task, r.failed) for r in runs] == [(COMPACT, True), (VACUUM, False)]
    assert (
        metrics.registry.get_sample_value(
            "cdc_apply_upkeep_runs_total",
            {"table": "public.t", "operation": "compact", "outcome": "failed"},
        )
        == 1
    )


def test_a_bug_is_not_swallowed() -> None:
    def run(task: UpkeepTask) -> str:
        raise KeyError(task)

    with pytest.raises(KeyError):
        run_tasks("public.t", (COMPACT,), run)
