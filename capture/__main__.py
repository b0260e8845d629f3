"""``python -m capture``: read settings, wire the service, run it until SIGTERM/SIGINT.

``python -m capture status`` prints each table's state; ``python -m capture resync
TABLE...`` requests a new snapshot of tables at the next start (:mod:`capture.admin`).

Exit codes: 0 after a graceful stop, 2 for a configuration error (nothing to retry: the
message says what to change), 3 for a stream this version cannot decode.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from pydantic import ValidationError

from capture import admin
from capture.errors import ConfigError, ProtocolError, TransientError
from capture.metrics import CaptureMetrics
from capture.publish import native_producer
from capture.rows import native as native_rows
from capture.service import CaptureService
from capture.settings import CaptureSettings
from runtime import gc_tuning, logs
from runtime.retry import run_with_retry
from runtime.settings_env import env_prefix
from runtime.settings_table import settings_table
from runtime.telemetry import Health, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m capture",
        description="Stream PostgreSQL logical replication to per-table Avro topics on Kafka.",
        epilog=settings_table(CaptureSettings, "settings (environment variables)"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("run", help="stream (the default)")
    commands.add_parser("status", help="print each table's state from the control topic")
    resync = commands.add_parser(
        "resync", help="snapshot tables again at the next start (after fixing an errored one)"
    )
    resync.add_argument("tables", nargs="+", metavar="SCHEMA.TABLE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = CaptureSettings()
    except ValidationError as exc:
        print(f"invalid capture settings:\n{exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"invalid capture settings: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log)
    try:
        if args.command == "status":
            print(admin.format_statuses(admin.table_statuses(settings)))
            return 0
        if args.command == "resync":
            for request in admin.request_resync(settings, args.tables):
                print(f"{request.table}: resync requested; restart capture to start it")
            return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TransientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log = logging.getLogger("capture")
    if native_rows.AVAILABLE:
        log.info("rows are encoded by the compiled row encoder (capture_native)")
    else:
        log.warning(
            "capture_native is not installed: rows are encoded in Python, with the same "
            "bytes and more CPU per row; build it with `make native` (Rust toolchain)"
        )
    if settings.compiled_producer and native_producer.library() is not None:
        log.info("records are produced by the compiled producer (capture_native)")
    elif settings.compiled_producer:
        log.warning(
            "the compiled producer cannot run here (capture_native not built, or not "
            "Linux): records are produced by confluent-kafka's producer, with the same "
            "guarantees and more CPU per record"
        )
    health = Health(settings.metrics.not_ready_after_s)
    metrics = CaptureMetrics(health=health)
    service = CaptureService(settings, stop, metrics=metrics, health=health)

    def interruptible_sleep(seconds: float) -> None:
        stop.wait(seconds)

    # The messages say what to do; a traceback would bury them, so no log.exception.
    try:
        server = serve(
            settings.metrics, metrics.registry, health, env_prefix=env_prefix(CaptureSettings)
        )
    except ConfigError as exc:
        log.error("configuration error: %s", exc)  # noqa: TRY400
        return 2
    gc_tuning.tune_for_streaming()
    try:
        run_with_retry(service.run, should_stop=stop.is_set, sleep=interruptible_sleep)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)  # noqa: TRY400
        return 2
    except ProtocolError as exc:
        log.error("cannot decode the replication stream: %s", exc)  # noqa: TRY400
        return 3
    finally:
        health.stopped("capture has stopped")
        if server is not None:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
