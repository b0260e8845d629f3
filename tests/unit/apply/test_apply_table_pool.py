"""The thread pool that applies the tables of a batch: concurrent, ordered, isolated."""

from __future__ import annotations

import threading

import pytest

from apply.table_pool import run_per_table


def test_tasks_run_at_the_same_time() -> None:
    # Each task waits until all four are inside: only concurrent tasks get past.
    barrier = threading.Barrier(4, timeout=30)

    def task(item: int) -> int:
        barrier.wait()
        return item * 10

    futures = run_per_table([3, 1, 2, 0], task, parallelism=4)
    assert [f.result() for f in futures] == [30, 10, 20, 0]


def test_results_keep_the_input_order_and_a_failure_stays_with_its_item() -> None:
    finished: list[int] = []

    def task(item: int) -> int:
        if item == 1:
            raise ValueError("table 1 broke")
        finished.append(item)
        return item

    futures = run_per_table([0, 1, 2, 3], task, parallelism=2)
    assert isinstance(futures[1].exception(), ValueError)
    assert [f.result() for i, f in enumerate(futures) if i != 1] == [0, 2, 3]
    assert sorted(finished) == [0, 2, 3], "the other tables still ran"


def test_parallelism_one_runs_one_task_at_a_time() -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def task(item: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        with lock:
            running -= 1
        return item

    run_per_table(list(range(8)), task, parallelism=1)
    assert most == 1


def test_parallelism_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        run_per_table([1], lambda item: item, parallelism=0)
