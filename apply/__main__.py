"""``python -m apply``: read settings, build the Spark session, run the query until
SIGTERM/SIGINT (or until caught up, with the ``available_now`` trigger).

``python -m apply errored`` lists the errored tables from the control topic, without
Spark (``--from-lake`` reads the dead-letter table instead); ``python -m apply reapply
<schema.table>`` re-applies a table's parked records once its cause is fixed, and
``python -m apply discard <schema.table> <topic>/<partition>/<offset>`` sets aside a
parked record that can never be applied (docs/apply.md, errored tables).
``python -m apply jars`` prints the jars for ``spark-submit --jars`` (docs/apply.md,
running it)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from pydantic import ValidationError

from apply.app import ApplyJob
from apply.control.table_status import errored_line, format_errored, read_table_statuses
from apply.engine.spark_jars import configured_jars
from apply.engine.spark_session import build_session
from apply.errors import ConfigError, TableError, TransientError
from apply.metrics import ApplyMetrics
from apply.settings import ApplySettings
from runtime import logs
from runtime.settings_env import env_prefix
from runtime.settings_table import settings_table
from runtime.telemetry import Health, serve

RUN, ERRORED, REAPPLY, DISCARD, JARS = ("run", "errored", "reapply", "discard", "jars")


def record_coordinates(text: str) -> tuple[str, int, int]:
    """``<topic>/<partition>/<offset>`` (topic names never contain ``/``)."""
    parts = text.rsplit("/", 2)
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not <topic>/<partition>/<offset>, e.g. cdc.public.orders/0/1234"
        )
    return parts[0], int(parts[1]), int(parts[2])


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m apply",
        description="Apply the change topics to Delta tables with Spark Structured Streaming.",
        epilog=settings_table(ApplySettings, "settings (environment variables)"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="command")
    commands.add_parser(RUN, help="run the streaming job (the default)")
    errored = commands.add_parser(
        ERRORED,
        help="list the errored tables and why they stopped (from the control topic, no Spark)",
    )
    errored.add_argument(
        "--from-lake",
        action="store_true",
        help="read the dead-letter Delta table with Spark instead (the truth, when the "
        "control topic may lag behind: docs/apply.md, errored tables)",
    )
    reapply = commands.add_parser(
        REAPPLY,
        help="re-apply the parked records of an errored table after fixing the cause",
    )
    reapply.add_argument("table", help="the table as `errored` lists it: schema.table")
    commands.add_parser(
        JARS,
        help="print the jars the job loads, comma-separated, for spark-submit --jars",
    )
    discard = commands.add_parser(
        DISCARD,
        help="set aside one parked record that can never be applied, so reapply can go on",
    )
    discard.add_argument("table", help="the table as `errored` lists it: schema.table")
    discard.add_argument(
        "record",
        type=record_coordinates,
        help="the record as the error names it: <topic>/<partition>/<offset>",
    )
    return parser.parse_args(argv)


def _report(job: ApplyJob, arguments: argparse.Namespace) -> int:
    if arguments.command == ERRORED:
        for table in job.errored():
            error = f"{table.error_kind}: {table.error}"
            print(errored_line(table.table, table.records, error, table.since_batch))
        return 0
    if arguments.command == DISCARD:
        topic, partition, offset = arguments.record
        if not job.discard(arguments.table, topic, partition, offset):
            print(
                f"{arguments.table}: no parked record waits at {topic}/{partition}/{offset} "
                "(see python -m apply errored)",
                file=sys.stderr,
            )
            return 1
        print(
            f"{arguments.table}: the record at {topic}/{partition}/{offset} is discarded (it "
            "stays in the dead-letter table); run python -m apply reapply "
            f"{arguments.table}"
        )
        return 0
    outcome = job.reapply(arguments.table)
    applied = sum(p.records for p in outcome.passes)
    print(f"{outcome.table}: re-applied {applied} parked records")
    if outcome.still_waiting:
        print(
            f"{outcome.table}: {outcome.still_waiting} records were parked while this ran and "
            "still wait: run the command again",
            file=sys.stderr,
        )
        return 1
    return 0


def _errored_from_control_topic(settings: ApplySettings, log: logging.Logger) -> int:
    """``errored`` without Spark: the statuses apply published (apply/control/table_status.py)."""
    try:
        statuses = read_table_statuses(settings.kafka)
    except ConfigError as exc:
        log.error("%s", exc)  # noqa: TRY400 - the message is the help
        return 2
    except TransientError as exc:
        log.error("%s", exc)  # noqa: TRY400
        return 1
    print(format_errored(statuses))
    return 0


def main(argv: list[str] | None = None) -> int:
    arguments = _arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    log = logging.getLogger("apply")
    try:
        settings = ApplySettings()
    except ValidationError as exc:
        print(f"invalid apply settings:\n{exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"invalid apply settings: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log)
    if arguments.command == ERRORED and not arguments.from_lake:
        return _errored_from_control_topic(settings, log)
    try:
        jars = configured_jars(settings.spark)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)  # noqa: TRY400 - the message is the help
        return 2
    if arguments.command == JARS:
        print(",".join(jars))
        return 0
    stop = threading.Event()
    if arguments.command in (None, RUN):
        # Before the session: a SIGTERM while Spark starts stops the job once it is up,
        # and the JVM leaves the signal to this handler (apply.engine.spark_session).
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    spark = build_session(settings.spark, jars, settings.lake)
    context = spark.sparkContext
    log.info("Spark master %s, application %s", context.master, context.appName)
    server = None
    job: ApplyJob | None = None
    try:
        health = Health(settings.metrics.not_ready_after_s)
        metrics = ApplyMetrics(health=health)
        job = ApplyJob(settings, spark, metrics=metrics, health=health)
        if arguments.command in (ERRORED, REAPPLY, DISCARD):
            return _report(job, arguments)
        # Only the streaming job serves: a one-off command beside it must not take its port.
        server = serve(
            settings.metrics, metrics.registry, health, env_prefix=env_prefix(ApplySettings)
        )
        job.run(stop)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)  # noqa: TRY400
        return 2
    except (TableError, TransientError) as exc:
        # Only the reapply command lets these out: the table stays errored, nothing lost.
        log.error("%s", exc)  # noqa: TRY400
        return 1
    finally:
        if server is not None:
            server.close()
        if job is not None:
            job.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
