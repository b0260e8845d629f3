"""Apply the tables of one micro-batch at the same time, each in a Spark session and a
Spark scheduler pool of its own.

The tables of a batch are independent: each gets its own Delta commits, and nothing one
table does decides anything for another. So they run on a small thread pool, and Spark
schedules the jobs the threads submit side by side (PySpark pins each Python thread to
a JVM thread of its own).

Why a session per table: the idempotent MERGE of :mod:`apply.lake.spark_merge` carries its Delta
transaction id (``txnAppId``/``txnVersion``) and commit metadata as **session**
settings, the only way Delta accepts them for a MERGE. Two threads sharing one session
would race on them, and a table's commit could record another table's batch and state.
:func:`table_session` gives each task a session of its own: Spark's ``newSession`` shares
the SparkContext, the cached batch and the catalog of Delta tables, but not the SQL
settings. Delta reads the transaction settings from the session of the target table
(``DeltaMergeBuilder`` runs the MERGE under the session of the ``DeltaTable``), and the
MERGE may read a source DataFrame of another session, so only the target side needs the
table's session. The settings of the parent session that may be changed at run time are
copied, so a table session behaves like the one the job was built with.

Why a scheduler pool per table: the job runs with ``spark.scheduler.mode=FAIR``
(:mod:`apply.engine.spark_session`). Under Spark's default FIFO scheduling the job submitted
first gets every free executor core until all its tasks are launched, so one big table's
MERGE (hundreds of tasks over its files) holds the tables behind it for its whole
length. FAIR scheduling shares the cores between *pools*, so each table's jobs go to
the pool named after the table (:class:`SchedulerPools`: the ``spark.scheduler.pool``
local property of the thread that submits them, set for the task and put back after,
since the pool's threads serve one table after another). Pools nobody configured are
made on first use with weight 1 and no minimum share: every table, and the batch's own
jobs (survey, parking) in the ``default`` pool, get an equal share of the cores while
they have tasks waiting. ``spark.scheduler.allocation.file`` (through
``APPLY_SPARK__CONF``) can give a table's pool another weight or a minimum share.
Spark logs once per table that its pool was not configured and was created.

Results come back in the order of the input, whatever order the tasks finish in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from pyspark.sql import SparkSession

from apply.lake.spark_merge import TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF

_PER_COMMIT = frozenset({TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF})

POOL_PROPERTY = "spark.scheduler.pool"
"""The local property naming the scheduler pool of the jobs a thread submits."""
DEFAULT_POOL = "default"
"""Spark's pool for jobs whose thread names none."""

T = TypeVar("T")
R = TypeVar("R")


class LocalProperties(Protocol):
    """The thread-local properties of a SparkContext (``pyspark.SparkContext`` is one)."""

    def getLocalProperty(self, key: str) -> str | None: ...  # noqa: N802 - Spark's name

    def setLocalProperty(self, key: str, value: str) -> None: ...  # noqa: N802


@dataclass(frozen=True, slots=True)
class SchedulerPools(Generic[T]):
    """Each item's work runs in the scheduler pool ``name_of(item)`` (module docstring)."""

    context: LocalProperties
    name_of: Callable[[T], str]

    @contextmanager
    def entered(self, item: T) -> Iterator[None]:
        """The calling thread's jobs go to the item's pool within the block."""
        previous = self.context.getLocalProperty(POOL_PROPERTY)
        self.context.setLocalProperty(POOL_PROPERTY, self.name_of(item))
        try:
            yield
        finally:
            self.context.setLocalProperty(POOL_PROPERTY, previous or DEFAULT_POOL)


def table_session(spark: SparkSession) -> SparkSession:
    """A session for one table's work: the parent's settings, none of its per-commit
    transaction settings, and nothing it sets leaks back (module docstring)."""
    session = spark.newSession()
    for key, value in spark.conf.getAll.items():
        if key not in _PER_COMMIT and spark.conf.isModifiable(key):
            session.conf.set(key, value)
    return session


def run_per_table(
    items: Sequence[T],
    work: Callable[[T], R],
    parallelism: int,
    *,
    pools: SchedulerPools[T] | None = None,
) -> list[Future[R]]:
    """Run ``work`` on every item, at most ``parallelism`` at a time; the futures, all
    finished, in the order of ``items``. A task that raises does not stop the others:
    each table's outcome is its own, and the caller decides what a failure means.
    With ``pools``, each item's work submits its Spark jobs to the item's pool."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")

    def task(item: T) -> R:
        if pools is None:
            return work(item)
        with pools.entered(item):
            return work(item)

    with ThreadPoolExecutor(
        max_workers=min(parallelism, max(len(items), 1)), thread_name_prefix="apply-table"
    ) as pool:
        futures = [pool.submit(task, item) for item in items]
        wait(futures)
    return futures
