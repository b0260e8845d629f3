"""``python -m apply``: read settings, build the Spark session, run the query until
SIGTERM/SIGINT (or until caught up, with the ``available_now`` trigger)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from pydantic import ValidationError

from apply.app import ApplyJob
from apply.errors import ConfigError
from apply.settings import ApplySettings
from apply.spark_jars import configured_jars
from apply.spark_session import build_session
from deploy.settings_reference import settings_table


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m apply",
        description="Apply the change topics to Delta tables with Spark Structured Streaming.",
        epilog=settings_table(ApplySettings, "settings (environment variables)"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    log = logging.getLogger("apply")
    try:
        settings = ApplySettings()
    except ValidationError as exc:
        print(f"invalid apply settings:\n{exc}", file=sys.stderr)
        return 2
    try:
        jars = configured_jars(settings.spark)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)  # noqa: TRY400 - the message is the help
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    spark = build_session(settings.spark, jars)
    try:
        ApplyJob(settings, spark).run(stop)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)  # noqa: TRY400
        return 2
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
