"""One writer per Delta table at a time: the lock every commit the job makes is made under.

Two writers commit to apply's tables from one process: delta-rs in the driver
(:mod:`apply.lake.driver_merge`) and Delta's Spark writer (MERGE, replace, append,
OPTIMIZE, VACUUM, DDL). Each keeps its own commits
exclusive, but not against the other: on a local file system Delta's Spark writer
checks that the next commit file is absent and then renames its own over that name, so
a delta-rs commit landing between the check and the rename is silently replaced, and
its rows and applied state are lost with it. So every commit to a table is made while
holding that table's lock
(:meth:`TableLocks.held`), and each function that commits checks that the calling
thread holds it (:meth:`TableLocks.require`): a path that forgot the lock fails on its
first run, in every test that takes it, instead of once in a million commits.

The lock is the job's, in one process; it is per table path, so two tables never wait
for each other. It is reentrant: a batch's table task holds it across the whole write
(the MERGE, the DDL before it, the upkeep after it), and the functions it calls take it
again. A second process beside the job (an operator's OPTIMIZE, ``python -m apply
reapply``) is outside it: docs/operations.md says what such a process may do while the
job runs.
"""

from __future__ import annotations

import threading


class UnheldTableLockError(RuntimeError):
    """A commit to a table was about to be made without its lock: a defect of the code
    path, never of the data. The batch fails as a whole, so nothing is committed."""


class TableLock:
    """A reentrant lock that knows its owner, so a commit can check it is held."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock (again, when this thread holds it); False when ``blocking`` is
        off and another thread holds it."""
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        if not self._lock.acquire(blocking=blocking):
            return False
        self._owner = me
        self._depth = 1
        return True

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise UnheldTableLockError("a table lock released by a thread that does not hold it")
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    def owned(self) -> bool:
        return self._owner == threading.get_ident()

    def __enter__(self) -> TableLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def lock_key(path: str) -> str:
    """One key per table whatever way its path was spelled (a trailing slash)."""
    return path.rstrip("/") or path


class TableLocks:
    """The job's table locks, one per table path, made on first use (module docstring)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, TableLock] = {}

    def lock(self, path: str) -> TableLock:
        """The lock of the table at ``path``."""
        with self._guard:
            return self._locks.setdefault(lock_key(path), TableLock())

    def held(self, path: str) -> TableLock:
        """``with locks.held(path):`` holds the table's lock within the block, waiting for
        another thread's turn."""
        return self.lock(path)

    def holds(self, path: str) -> bool:
        """Whether the calling thread holds the table's lock."""
        return self.lock(path).owned()

    def require(self, path: str, commit: str) -> None:
        """Raise :class:`UnheldTableLockError` unless the calling thread holds the lock of
        the table at ``path``; ``commit`` names what was about to be committed."""
        if not self.holds(path):
            raise UnheldTableLockError(
                f"{commit} to the Delta table at {path} without its table lock "
                "(apply.lake.table_lock): a defect, report it; nothing was committed"
            )


TABLE_LOCKS = TableLocks()
"""The process's table locks: every writer in the process shares them, whichever
context or thread it runs in, since the hazard is per process and per table."""


__all__ = ["TABLE_LOCKS", "TableLock", "TableLocks", "UnheldTableLockError", "lock_key"]
