"""Apply the tables of one micro-batch at the same time, each in a Spark session of its own.

The tables of a batch are independent: each gets its own Delta commits, and nothing one
table does decides anything for another. So they run on a small thread pool, and Spark
schedules the jobs the threads submit side by side (PySpark pins each Python thread to
a JVM thread of its own).

Why a session per table: the idempotent MERGE of :mod:`apply.merge` carries its Delta
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

Results come back in the order of the input, whatever order the tasks finish in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

from pyspark.sql import SparkSession

from apply.merge import TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF

_PER_COMMIT = frozenset({TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF})

T = TypeVar("T")
R = TypeVar("R")


def table_session(spark: SparkSession) -> SparkSession:
    """A session for one table's work: the parent's settings, none of its per-commit
    transaction settings, and nothing it sets leaks back (module docstring)."""
    session = spark.newSession()
    for key, value in spark.conf.getAll.items():
        if key not in _PER_COMMIT and spark.conf.isModifiable(key):
            session.conf.set(key, value)
    return session


def run_per_table(items: Sequence[T], work: Callable[[T], R], parallelism: int) -> list[Future[R]]:
    """Run ``work`` on every item, at most ``parallelism`` at a time; the futures, all
    finished, in the order of ``items``. A task that raises does not stop the others:
    each table's outcome is its own, and the caller decides what a failure means."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")
    with ThreadPoolExecutor(
        max_workers=min(parallelism, max(len(items), 1)), thread_name_prefix="apply-table"
    ) as pool:
        futures = [pool.submit(work, item) for item in items]
        wait(futures)
    return futures
