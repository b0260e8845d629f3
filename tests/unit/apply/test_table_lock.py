"""apply.lake.table_lock: one writer per table, reentrant, and a commit can tell it is held."""

from __future__ import annotations

import threading
import time

import pytest

from apply.lake.table_lock import TableLocks, UnheldTableLockError


def test_the_lock_is_reentrant_and_known_to_its_holder_only() -> None:
    locks = TableLocks()
    seen: list[bool] = []
    with locks.held("/lake/public/t"):
        with locks.held("/lake/public/t/"):  # the same table, spelled with a slash
            assert locks.holds("/lake/public/t")
        assert locks.holds("/lake/public/t")
        other = threading.Thread(target=lambda: seen.append(locks.holds("/lake/public/t")))
        other.start()
        other.join()
    assert seen == [False]
    assert not locks.holds("/lake/public/t")


def test_a_second_thread_waits_for_the_table_and_not_for_another() -> None:
    locks = TableLocks()
    order: list[str] = []
    entered = threading.Event()

    def writer() -> None:
        with locks.held("/lake/public/t"):
            order.append("second writer of t")

    def other_table() -> None:
        with locks.held("/lake/public/u"):
            order.append("writer of u")
            entered.set()

    with locks.held("/lake/public/t"):
        waiting = threading.Thread(target=writer)
        waiting.start()
        beside = threading.Thread(target=other_table)
        beside.start()
        assert entered.wait(10)
        time.sleep(0.05)  # the waiting writer had time to run, if it could
        order.append("first writer of t")
    waiting.join()
    beside.join()
    assert order == ["writer of u", "first writer of t", "second writer of t"]


def test_a_try_for_a_held_table_fails_and_a_release_by_another_thread_is_refused() -> None:
    locks = TableLocks()
    lock = locks.lock("/lake/public/t")
    results: list[bool] = []
    errors: list[BaseException] = []

    def other() -> None:
        results.append(lock.acquire(blocking=False))
        try:
            lock.release()
        except UnheldTableLockError as exc:
            errors.append(exc)

    with lock:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert results == [False]
    assert len(errors) == 1
    assert lock.acquire(blocking=False)
    lock.release()


def test_require_names_the_table_and_the_commit() -> None:
    locks = TableLocks()
    with pytest.raises(UnheldTableLockError, match=r"OPTIMIZE to the Delta table at /lake/t "):
        locks.require("/lake/t", "OPTIMIZE")
    with locks.held("/lake/t"):
        locks.require("/lake/t", "OPTIMIZE")
