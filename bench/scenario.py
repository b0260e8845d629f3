"""Which tables a pipeline benchmark runs on, and the writers of the tables pgbench does
not write.

Apply has a fixed cost per table and micro-batch, which four busy tables hide. The
**eleven-table scenario** is the one the freshness target is measured on:

- pgbench's four tables, under ``pgbench -R <rate>``;
- a **probe table**, one small transaction every :data:`PROBE_EVERY_S` (an UPDATE of one
  row), the table a freshness probe or heartbeat would write;
- six **quiet tables**, each one small transaction every :data:`QUIET_EVERY_S` (an UPDATE
  of one of its rows), staggered so they do not all write at the same instant.

The seven extra tables have a primary key and :data:`SEEDED_ROWS` rows each; they are
created and filled before capture starts, so they are in its publication and initial
snapshot like pgbench's. ``pgbench_history``, which ``pgbench -i`` leaves empty, gets one
row too: capture creates a table's topic with its first record, and a topic that does not
exist when the benchmark starts consuming is never read, so without the row none of
``pgbench_history``'s changes would count.

The writer of the extra tables (:class:`ScenarioWriter`) runs on a thread with one
autocommit connection to the run's own local database, for the pgbench window only: it
stops by itself when the window ends. The **pgbench scenario** is pgbench's four tables
alone.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psycopg
from psycopg import sql

PGBENCH_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")
PGBENCH_SEEDED = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers")
"""The tables ``pgbench -i`` fills (``pgbench_history`` starts empty)."""
HISTORY = "pgbench_history"

PROBE_TABLE = "bench_probe"
QUIET_TABLES = tuple(f"bench_quiet_{n}" for n in range(1, 7))
SEEDED_ROWS = 300
PROBE_EVERY_S = 0.2
QUIET_EVERY_S = 2.0


class Scenario(enum.Enum):
    """The tables of a run: its ``--tables`` value."""

    ELEVEN = "eleven"
    PGBENCH = "pgbench"

    @property
    def extra_tables(self) -> tuple[str, ...]:
        """The tables besides pgbench's, created and seeded before capture starts."""
        return (PROBE_TABLE, *QUIET_TABLES) if self is Scenario.ELEVEN else ()

    @property
    def tables(self) -> tuple[str, ...]:
        """Every captured table (of schema public)."""
        return (*PGBENCH_TABLES, *self.extra_tables)

    @property
    def seeds_history(self) -> bool:
        """``pgbench_history`` gets a row before capture starts (:func:`create_and_seed`)."""
        return self is Scenario.ELEVEN

    @property
    def seeded_tables(self) -> tuple[str, ...]:
        """The tables that have rows before capture starts: the initial snapshot brings
        each to the lake."""
        history = (HISTORY,) if self.seeds_history else ()
        return (*PGBENCH_SEEDED, *history, *self.extra_tables)

    @property
    def apply_defaults(self) -> bool:
        """Apply runs with its own defaults for everything (trigger, Spark master and
        configuration): the eleven-table scenario is the target's "all defaults" run."""
        return self is Scenario.ELEVEN


class Group(enum.Enum):
    """Tables reported together."""

    PGBENCH = "pgbench tables"
    PROBE = "the probe table"
    QUIET = "the quiet tables"


def group_of(table: str) -> Group:
    if table == PROBE_TABLE:
        return Group.PROBE
    if table in QUIET_TABLES:
        return Group.QUIET
    if table in PGBENCH_TABLES:
        return Group.PGBENCH
    raise ValueError(f"{table} is in no group of the benchmark's tables")


def by_group(latencies: Iterable[tuple[str, float]]) -> dict[Group, list[float]]:
    """(table, latency) pairs gathered per :class:`Group`, in :class:`Group`'s order;
    a group without a latency is left out."""
    gathered: dict[Group, list[float]] = {group: [] for group in Group}
    for table, latency in latencies:
        gathered[group_of(table)].append(latency)
    return {group: values for group, values in gathered.items() if values}


@dataclass(frozen=True, slots=True)
class Write:
    """One transaction of the writer: at ``at_s`` into the window, UPDATE ``row_id`` of
    ``table``."""

    at_s: float
    table: str
    row_id: int


def _every(table: str, every_s: float, first_s: float, seconds: float) -> list[Write]:
    # Counted in steps, not by adding every_s up: 0.2 added 150 times is not 30.0.
    count = 0
    writes = []
    while (at := first_s + count * every_s) < seconds:
        writes.append(Write(at_s=round(at, 6), table=table, row_id=count % SEEDED_ROWS + 1))
        count += 1
    return writes


def schedule(scenario: Scenario, seconds: float) -> list[Write]:
    """The writes of a window of ``seconds``, in time order. In the eleven-table scenario,
    the probe table every :data:`PROBE_EVERY_S` from the start and each quiet table every
    :data:`QUIET_EVERY_S`, the six staggered evenly over that period; each write updates
    the next seeded row of its table, wrapping around. The pgbench scenario has none."""
    if scenario is not Scenario.ELEVEN:
        return []
    writes = _every(PROBE_TABLE, PROBE_EVERY_S, 0.0, seconds)
    stagger = QUIET_EVERY_S / len(QUIET_TABLES)
    for index, table in enumerate(QUIET_TABLES):
        writes += _every(table, QUIET_EVERY_S, index * stagger, seconds)
    return sorted(writes, key=lambda w: w.at_s)


def create_and_seed(conn: psycopg.Connection[tuple[object, ...]], scenario: Scenario) -> None:
    """The scenario's extra tables, each with a primary key and :data:`SEEDED_ROWS` rows
    (ids 1 to :data:`SEEDED_ROWS`), and its row of ``pgbench_history`` (after ``pgbench
    -i``)."""
    if scenario.seeds_history:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 0, now())"
            ).format(sql.Identifier("public", HISTORY))
        )
    for table in scenario.extra_tables:
        name = sql.Identifier("public", table)
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id integer PRIMARY KEY, version bigint NOT NULL, "
                "note text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(name)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, version, note) "
                "SELECT g, 0, 'seeded row ' || g FROM generate_series(1, {}) AS g"
            ).format(name, sql.Literal(SEEDED_ROWS))
        )


class ScenarioWriter:
    """Runs the scenario's :func:`schedule` for ``seconds`` on a thread, one autocommit
    transaction per write, then stops by itself. A write that comes due while the
    previous one is still running goes right after it: the writer never bursts to catch
    up a schedule."""

    def __init__(self, dsn: str, scenario: Scenario, seconds: float) -> None:
        self._dsn = dsn
        self._seconds = seconds
        self._writes = schedule(scenario, seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scenario-writer", daemon=True)
        self.done: dict[str, int] = {}
        """Writes committed, per table."""
        self.failure: BaseException | None = None

    def __enter__(self) -> ScenarioWriter:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self._stop.set()  # the block failed: stop now, and let its error through
        self._thread.join(self._seconds + 30)
        self._stop.set()
        self._thread.join(10)
        if self.failure is not None and exc_type is None:
            raise self.failure

    def _run(self) -> None:
        if not self._writes:
            return
        try:
            with psycopg.connect(self._dsn, autocommit=True) as conn:
                started = time.monotonic()
                for write in self._writes:
                    if self._stop.wait(max(0.0, started + write.at_s - time.monotonic())):
                        return
                    if time.monotonic() - started >= self._seconds:
                        return
                    conn.execute(
                        sql.SQL(
                            "UPDATE {} SET version = version + 1, updated_at = now() WHERE id = %s"
                        ).format(sql.Identifier("public", write.table)),
                        [write.row_id],
                    )
                    self.done[write.table] = self.done.get(write.table, 0) + 1
        except BaseException as exc:  # raised by __exit__ on the main thread
            self.failure = exc


def writes_per_group(done: Mapping[str, int]) -> dict[Group, int]:
    """The writer's committed writes summed per :class:`Group`."""
    totals: dict[Group, int] = {}
    for table, count in done.items():
        group = group_of(table)
        totals[group] = totals.get(group, 0) + count
    return totals
