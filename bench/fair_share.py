"""One big table and several small ones: do the small tables' changes wait for the big
table's MERGE? Spark's FIFO scheduler, the FAIR pools apply uses by default, and the big
table in a lane of its own (:mod:`apply.lanes`).

``python -m bench.fair_share`` starts a stack of its own (:mod:`bench.pipeline_run`),
creates ``public.big`` (``--big-rows`` rows) and ``--small`` tables ``public.small_<i>``
of 1,000 rows, and captures only those. A writer thread then, every second, updates
``--big-per-s`` rows of ``big`` in one statement (a random range of keys, so each MERGE
of ``big`` rewrites or marks many files) and ``--small-per-s`` rows of each small table
(one statement each). All tables of a micro-batch are applied at once
(``APPLY_TABLE_PARALLELISM`` = the number of tables), so the scheduler decides who gets
the two cores.

Phases on the same pipeline, same lake and same workload, ``--seconds`` each, in the
order ``--phases`` gives, apply restarted between them:

- ``FIFO``: ``spark.scheduler.mode=FIFO``, jobs run in submission order, each taking
  every core its tasks can use;
- ``FAIR``: FAIR scheduling and one pool per table (the default,
  :mod:`apply.batch.table_pool`), one streaming query for every table;
- ``LANE``: as ``FAIR``, with ``big`` in a lane of its own (``APPLY_LANES``), so the
  small tables are applied by a query of their own.

A restart that changes the lanes re-reads the topics once into new checkpoints; before
each later phase one change is written to every table and the phase starts only once
the slot is confirmed past them, so that re-read is not in the measure.

For every change record written during a phase it measures commit-to-Delta: from the
source commit time to the modification time of the first Delta commit of its table
whose apply state covers the record (:func:`bench.freshness.apply_visibility`). It
prints p50 / p99 / max per phase for the small tables and for ``big``, and the ratio of
the small tables' p50 of each phase over the last phase's (above 1: the last phase
serves the small tables sooner). No target: the issue asks that one big table not
starve the rest, which this measures.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from dataclasses import dataclass

from bench.freshness import (
    ArrivalWatcher,
    apply_visibility,
    percentile,
    visible_latencies_ms,
)
from bench.pipeline_run import (
    PREFIX,
    PipelineRun,
    Service,
    add_run_arguments,
    load_average,
    machine,
    pipeline_run,
    say,
)
from schemas.naming import table_topic

SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}


@dataclass(frozen=True, slots=True)
class Phase:
    mode: str
    small_ms: list[float]
    big_ms: list[float]
    changes: int
    load: float


def _tables(small: int) -> list[str]:
    return ["big", *(f"small_{i}" for i in range(1, small + 1))]


def _create(run: PipelineRun, big_rows: int, small: int) -> None:
    with run.connect() as conn:
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, n int NOT NULL, pad text)")
        conn.execute(
            "INSERT INTO big SELECT g, 0, repeat(md5(g::text), 3) FROM generate_series(1, %s) g",
            [big_rows],
        )
        for name in _tables(small)[1:]:
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL)")
            conn.execute(f"INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 1000) g")
        conn.execute("ANALYZE")


class Writer:
    """The workload, on a thread: one round a second."""

    def __init__(self, run: PipelineRun, args: argparse.Namespace) -> None:
        self._run = run
        self._args = args
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.failure: BaseException | None = None

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.failure is not None:
            raise self.failure

    def _loop(self) -> None:
        args, rng = self._args, random.Random(3)
        try:
            with self._run.connect() as conn:
                while not self._stop.is_set():
                    started = time.monotonic()
                    first = rng.randint(1, max(1, args.big_rows - args.big_per_s))
                    conn.execute(
                        "UPDATE big SET n = n + 1 WHERE id BETWEEN %s AND %s",
                        [first, first + args.big_per_s - 1],
                    )
                    for name in _tables(args.small)[1:]:
                        first = rng.randint(1, 1000 - args.small_per_s + 1)
                        conn.execute(
                            f"UPDATE {name} SET n = n + 1 WHERE id BETWEEN %s AND %s",
                            [first, first + args.small_per_s - 1],
                        )
                    self._stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))
        except BaseException as exc:  # raised by __exit__ on the main thread
            self.failure = exc


def _phase(run: PipelineRun, args: argparse.Namespace, mode: str) -> Phase:
    tables = _tables(args.small)
    topics = [table_topic(PREFIX, "public", t) for t in tables]
    watcher = ArrivalWatcher(run.bootstrap, topics)
    watcher.start()
    say(f"{mode}: the workload for {args.seconds} s")
    with Writer(run, args):
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            run.check_services()
            time.sleep(1)
    load = load_average()[0]
    run.wait_caught_up(1800)
    arrivals = watcher.stop()
    records = list(arrivals.commit_us)
    big_topic = topics[0]

    def split(latencies: list[float]) -> tuple[list[float], list[float]]:
        pairs = list(zip(records, latencies, strict=True))
        return (
            [ms for r, ms in pairs if r[0] != big_topic],
            [ms for r, ms in pairs if r[0] == big_topic],
        )

    small, big = split(visible_latencies_ms(arrivals, apply_visibility(run.lake, tables)))
    return Phase(mode, small, big, len(records), load)


MODES = ("FIFO", "FAIR", "LANE")


def _configure(run: PipelineRun, mode: str) -> None:
    """Apply's settings for ``mode`` (module docstring), for the next start."""
    conf = dict(SPARK_CONF)
    if mode == "FIFO":
        conf["spark.scheduler.mode"] = "FIFO"
    run.env_overrides["APPLY_SPARK__CONF"] = json.dumps(conf)
    if mode == "LANE":
        run.env_overrides["APPLY_LANES"] = json.dumps({"big": ["public.big"]})
    else:
        run.env_overrides.pop("APPLY_LANES", None)


def _phases(text: str) -> list[str]:
    phases = [p.strip().upper() for p in text.split(",") if p.strip()]
    unknown = [p for p in phases if p not in MODES]
    if len(phases) < 2 or unknown:  # a ratio needs two phases
        raise argparse.ArgumentTypeError(
            f"give two or more of {', '.join(MODES)}, comma-separated (not {text!r})"
        )
    return phases


def _touch(run: PipelineRun, tables: list[str]) -> None:
    """One change in every table. The slot is confirmed past it only once apply has
    applied it, and a restart that changed the lanes first re-reads the topics from the
    start (docs/apply.md, Lanes): waiting for it keeps that re-read out of the measure."""
    with run.connect() as conn:
        for name in tables:
            conn.execute(f"UPDATE {name} SET n = n + 1 WHERE id = 1")


def _apply_with(run: PipelineRun, mode: str) -> None:
    """Restart apply with ``mode`` scheduling, on the same checkpoint and lake."""
    apply = next(s for s in run.services if s.name == "apply")
    apply.stop()
    run.services.remove(apply)
    _configure(run, mode)
    started = Service("apply", apply.argv, run.service_env(), run.root / "apply.log")
    started.start()
    run.services.append(started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fair_share", description=__doc__)
    parser.add_argument("--big-rows", type=int, default=300_000)
    parser.add_argument("--small", type=int, default=6, help="small tables")
    parser.add_argument("--big-per-s", type=int, default=3000, help="rows of big updated a s")
    parser.add_argument("--small-per-s", type=int, default=5, help="rows of each small a s")
    parser.add_argument("--seconds", type=int, default=120, help="length of each phase")
    parser.add_argument(
        "--phases",
        type=_phases,
        default=["FIFO", "FAIR"],
        help=(
            "the phases in order, comma-separated, of FIFO, FAIR, LANE (later phases "
            "run on a table the earlier ones have updated: run both orders)"
        ),
    )
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    tables = _tables(args.small)
    with pipeline_run(scale=1, trigger=args.trigger, keep=args.keep) as run:
        _create(run, args.big_rows, args.small)
        run.env_overrides.update(
            {
                "CAPTURE_POSTGRES__TABLES": json.dumps([f"public.{t}" for t in tables]),
                "APPLY_TABLE_PARALLELISM": str(len(tables)),
            }
        )
        modes: list[str] = args.phases
        _configure(run, modes[0])
        run.start_pipeline()
        say("waiting for the initial snapshot to be applied")
        while run.lag_bytes() is None:
            run.check_services()
            time.sleep(0.5)
        run.wait_caught_up(1800)
        phases = [_phase(run, args, modes[0])]
        for mode in modes[1:]:
            _apply_with(run, mode)
            _touch(run, tables)
            run.wait_caught_up(1800)
            phases.append(_phase(run, args, mode))
    lines = [
        f"machine: {machine()}",
        f"big: {args.big_rows:,} rows, {args.big_per_s:,} updated a second; {args.small} small "
        f"tables of 1,000 rows, {args.small_per_s} updated a second each; {args.seconds} s a "
        f"phase; trigger {args.trigger}; Spark local[2]",
        "",
        "| phase | changes | small tables p50 / p99 / max, ms | big p50 / p99 / max, ms "
        "| load (1 min) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for phase in phases:

        def spread(values: list[float]) -> str:
            return " / ".join(
                f"{percentile(values, q):,.0f}" if values else "-" for q in (0.5, 0.99, 1.0)
            )

        lines.append(
            f"| {phase.mode} | {phase.changes:,} | {spread(phase.small_ms)} | "
            f"{spread(phase.big_ms)} | {phase.load:.1f} |"
        )
    last = phases[-1]
    lines.append("")
    for phase in phases[:-1]:
        ratio = percentile(phase.small_ms, 0.5) / max(percentile(last.small_ms, 0.5), 1e-9)
        lines.append(f"small tables' p50, {phase.mode} over {last.mode}: {ratio:.2f}x")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
