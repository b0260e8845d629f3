"""The highest pgbench rate the pipeline keeps up with, and what it costs the source.

``python -m bench.sustainable_rate`` (defaults: probes of 60 s, holds of 300 s, 4 steps)
starts a stack of its own with pgbench's tables (:mod:`bench.pipeline_run`) and:

1. runs pgbench unthrottled (2 clients) for ``--probe-s`` with no pipeline: ``tps0``;
2. starts capture and apply, waits for the initial snapshot to be applied, and runs the
   same unthrottled pgbench again: ``tps1``. The OLTP slowdown the pipeline causes is
   ``1 - tps1 / tps0`` (target <= 25%); then it waits for the pipeline to catch up;
3. searches the sustainable rate from ``--start`` x ``tps0``: doubling the rate while
   steps keep up, then bisecting between the best that kept up and the lowest that fell
   behind (:func:`next_rate`). A pipeline whose rate is a small share of ``tps0`` is thus
   found in a few steps, without first running at half of ``tps0`` and waiting for that
   backlog to drain. Each step runs ``pgbench -R <rate>`` for ``--hold-s`` while
   the slot lag (WAL bytes between ``pg_current_wal_lsn()`` and the slot's confirmed
   position, which follows the lake) is sampled every second. A step **keeps up** when
   the mean lag of its last 30 s is at most ``max(1.5 x the mean lag of its first
   60 s, 8 MiB)``: a lag that grows without bound fails that, a lag that breathes with
   the micro-batches does not. The pipeline catches up between steps.

It prints the highest rate that kept up as a ratio of ``tps0`` (target >= 0.5), and with
``--charts DIR`` draws the lag and the pgbench rate over the whole run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

from bench.pipeline_run import (
    PipelineRun,
    Sampler,
    add_run_arguments,
    load_average,
    machine,
    pgbench,
    pgbench_tps,
    pipeline_run,
    say,
)

_FLAT_FLOOR = 8 * 1024**2


@dataclass
class Step:
    rate: float
    at: list[float] = field(default_factory=list)
    lag_bytes: list[int] = field(default_factory=list)
    achieved_tps: float = 0.0
    caught_up_s: float = 0.0

    @property
    def kept_up(self) -> bool:
        return keeps_up(self.at, self.lag_bytes)


def keeps_up(at: list[float], lag_bytes: list[int]) -> bool:
    """The flat-lag rule of the module docstring, over samples ``(at[i], lag_bytes[i])``
    with ``at`` in seconds from the start of the step."""
    if not at:
        return False
    end = at[-1]
    first = [lag for t, lag in zip(at, lag_bytes, strict=True) if t <= 60]
    last = [lag for t, lag in zip(at, lag_bytes, strict=True) if t >= end - 30]
    if not first or not last:
        return False
    return statistics.fmean(last) <= max(1.5 * statistics.fmean(first), _FLAT_FLOOR)


def next_rate(rate: float, kept_up: bool, low: float, high: float) -> tuple[float, float, float]:
    """After a step at ``rate``: the next rate and the new bounds ``(low, high)``, where
    ``low`` is the best rate that kept up and ``high`` the lowest that fell behind (or the
    unthrottled rate while none has)."""
    if kept_up:
        low = rate
        bisect = (low + high) / 2
        return min(2 * rate, bisect), low, high
    high = rate
    return (low + high) / 2, low, high


def _unthrottled(run: PipelineRun, seconds: int, name: str) -> float:
    log = run.root / f"{name}.log"
    run.wait_while_running(pgbench(run, seconds=seconds, rate=None, log=log))
    return pgbench_tps(log.read_text())


def _hold(run: PipelineRun, rate: float, seconds: int, index: int) -> Step:
    step = Step(rate)
    started = time.monotonic()

    def sample() -> None:
        step.at.append(time.monotonic() - started)
        step.lag_bytes.append(run.lag_bytes() or 0)

    log = run.root / f"step-{index}.log"
    with Sampler(sample):
        run.wait_while_running(pgbench(run, seconds=seconds, rate=rate, log=log))
    step.achieved_tps = pgbench_tps(log.read_text())
    step.caught_up_s = run.wait_caught_up(1800)
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sustainable_rate", description=__doc__)
    parser.add_argument("--probe-s", type=int, default=60, help="unthrottled pgbench runs")
    parser.add_argument("--hold-s", type=int, default=300, help="length of each rate step")
    parser.add_argument("--steps", type=int, default=4, help="bisection steps")
    parser.add_argument("--start", type=float, default=0.5, help="first rate, x tps0")
    parser.add_argument(
        "--floor",
        type=float,
        default=0.0,
        help="a rate, in tps, an earlier run found kept up: the search's lower bound",
    )
    add_run_arguments(parser)
    arguments = parser.parse_args(argv)
    loads = [load_average()]
    with pipeline_run(scale=arguments.scale, trigger=arguments.trigger, keep=arguments.keep) as run:
        say(f"unthrottled pgbench for {arguments.probe_s} s without the pipeline")
        tps0 = _unthrottled(run, arguments.probe_s, "unthrottled-alone")
        run.start_pipeline()
        say("waiting for the initial snapshot to be applied")
        while run.lag_bytes() is None:
            run.check_services()
            time.sleep(0.5)
        run.wait_caught_up(900)
        say(f"unthrottled pgbench for {arguments.probe_s} s with the pipeline running")
        tps1 = _unthrottled(run, arguments.probe_s, "unthrottled-with-pipeline")
        loads.append(load_average())
        caught_up_s = run.wait_caught_up(3600)
        low, high, rate = arguments.floor, tps0, arguments.start * tps0
        steps: list[Step] = []
        for index in range(arguments.steps):
            say(f"step {index + 1}: pgbench -R {rate:.0f} for {arguments.hold_s} s")
            step = _hold(run, rate, arguments.hold_s, index)
            loads.append(load_average())
            steps.append(step)
            say(f"step {index + 1}: {'kept up' if step.kept_up else 'fell behind'}")
            rate, low, high = next_rate(rate, step.kept_up, low, high)
    best = max((s.rate for s in steps if s.kept_up), default=arguments.floor)
    bounded = any(not s.kept_up for s in steps)
    lines = [
        f"machine: {machine()}; load average (1 min) at the samples: "
        f"{', '.join(f'{x[0]:.1f}' for x in loads)}",
        f"pgbench scale {arguments.scale}, 2 clients; apply trigger {arguments.trigger}",
        "",
        f"unthrottled pgbench without the pipeline (tps0): {tps0:,.0f} tps",
        f"unthrottled pgbench with the pipeline running: {tps1:,.0f} tps; OLTP slowdown "
        f"{(1 - tps1 / tps0) * 100:.0f}% (target <= 25%: "
        f"{'met' if tps1 >= 0.75 * tps0 else 'NOT met'}); the backlog took "
        f"{caught_up_s:,.0f} s to apply",
        "",
        "| step | rate, tps | achieved tps | x tps0 | mean lag first 60 s | mean lag last 30 s "
        "| kept up | catch-up s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for index, step in enumerate(steps, 1):
        first = [lag for t, lag in zip(step.at, step.lag_bytes, strict=True) if t <= 60]
        last = [
            lag for t, lag in zip(step.at, step.lag_bytes, strict=True) if t >= step.at[-1] - 30
        ]
        lines.append(
            f"| {index} | {step.rate:,.0f} | {step.achieved_tps:,.0f} | {step.rate / tps0:.2f} | "
            f"{statistics.fmean(first) / 1024**2:,.1f} MiB | "
            f"{statistics.fmean(last) / 1024**2:,.1f} MiB | "
            f"{'yes' if step.kept_up else 'no'} | {step.caught_up_s:,.0f} |"
        )
    lines += [
        "",
        f"sustainable rate: {'' if bounded else 'at least '}{best:,.0f} tps = "
        f"{best / tps0:.2f} x tps0 (target >= 0.5: "
        f"{'met' if best >= 0.5 * tps0 else 'NOT met' if bounded else 'not shown'}; held "
        f"{arguments.hold_s} s per step"
        f"{'' if bounded else '; no step fell behind, so this is a lower bound'})",
    ]
    print("\n".join(lines))
    if arguments.charts is not None:
        from bench.charts import rate_chart  # noqa: PLC0415 - matplotlib is heavy

        written = rate_chart(arguments.charts, [(s.rate, s.at, s.lag_bytes) for s in steps])
        say(f"chart: {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
