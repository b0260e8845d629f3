"""The thread pool that applies the tables of a batch: concurrent, ordered, isolated, each
table in its own scheduler pool."""

from __future__ import annotations

import threading

import pytest

from apply.batch.table_pool import DEFAULT_POOL, POOL_PROPERTY, SchedulerPools, run_per_table


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


class ThreadLocalProperties:
    """A SparkContext's local properties as Spark keeps them: one set per thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _properties(self) -> dict[str, str]:
        if not hasattr(self._local, "properties"):
            self._local.properties = {}
        properties: dict[str, str] = self._local.properties
        return properties

    def getLocalProperty(self, key: str) -> str | None:
        return self._properties().get(key)

    def setLocalProperty(self, key: str, value: str) -> None:
        self._properties()[key] = value


def test_each_item_works_in_its_own_pool_and_the_thread_is_put_back() -> None:
    properties = ThreadLocalProperties()
    seen: dict[str, str | None] = {}
    after: list[str | None] = []

    def task(table: str) -> str:
        seen[table] = properties.getLocalProperty(POOL_PROPERTY)
        return table

    # One thread serves every table: each must find its own pool, not the previous one's.
    futures = run_per_table(
        ["public.a", "public.b", "shop.c"],
        task,
        parallelism=1,
        pools=SchedulerPools(properties, lambda table: f"pool of {table}"),
    )
    assert [f.result() for f in futures] == ["public.a", "public.b", "shop.c"]
    assert seen == {t: f"pool of {t}" for t in ("public.a", "public.b", "shop.c")}

    pools = SchedulerPools(properties, str)
    with pools.entered("public.a"):
        after.append(properties.getLocalProperty(POOL_PROPERTY))
    after.append(properties.getLocalProperty(POOL_PROPERTY))
    assert after == ["public.a", DEFAULT_POOL], "the thread's pool is Spark's default again"


def test_a_failing_item_still_leaves_its_pool() -> None:
    properties = ThreadLocalProperties()
    properties.setLocalProperty(POOL_PROPERTY, "outer")
    pools = SchedulerPools(properties, str)
    with pytest.raises(ValueError, match="broke"), pools.entered("public.a"):
        raise ValueError("table public.a broke")
    assert properties.getLocalProperty(POOL_PROPERTY) == "outer"
