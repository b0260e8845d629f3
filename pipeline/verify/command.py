"""``python -m pipeline verify``: arguments, the Spark session, exit codes.

Exit codes: 0 every table equal; 1 a difference, an errored table, or a table that
could not be compared; 2 a configuration error (bad settings, unknown table,
PostgreSQL unreachable); 3 the pipeline's slot did not reach a verify point in time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from apply import errors as apply_errors
from apply.engine.spark_jars import configured_jars
from apply.engine.spark_session import build_session
from apply.settings import ApplySettings
from capture import errors as capture_errors
from capture.settings import CaptureSettings
from pipeline.verify.report import format_human, format_json
from pipeline.verify.rounds import (
    DEFAULT_MAX_KEYS,
    DEFAULT_ROUNDS,
    DEFAULT_TIMEOUT_S,
    verify_tables,
)
from pipeline.verify.source import VerifyPointTimeoutError

EXIT_OK, EXIT_DIFFERENT, EXIT_CONFIG, EXIT_TIMEOUT = 0, 1, 2, 3


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
        return value

    return parse


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline verify",
        description=(
            "Prove that the Delta tables equal the source tables at a verify point, while the "
            "pipeline keeps running (docs/verify.md). Settings: the CAPTURE_* and APPLY_* "
            "environment of the two services."
        ),
        epilog="exit codes: 0 equal, 1 differences, 2 configuration error, 3 verify point "
        "not reached in time",
    )
    parser.add_argument(
        "--table",
        action="append",
        dest="tables",
        metavar="SCHEMA.TABLE",
        help="a table to verify (repeatable); default: every published table with a Delta table",
    )
    parser.add_argument(
        "--rounds",
        type=_positive(int),
        default=DEFAULT_ROUNDS,
        help=f"verify points at most, for keys changed meanwhile (default {DEFAULT_ROUNDS})",
    )
    parser.add_argument(
        "--timeout",
        type=_positive(float),
        default=DEFAULT_TIMEOUT_S,
        help="seconds to wait for the pipeline to reach a verify point "
        f"(default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--max-keys",
        type=_positive(int),
        default=DEFAULT_MAX_KEYS,
        help=f"sample keys shown per kind of difference (default {DEFAULT_MAX_KEYS})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser.parse_args(argv)


def main(argv: list[str], capture: CaptureSettings, apply: ApplySettings) -> int:
    arguments = parse_arguments(argv)
    try:
        jars = configured_jars(apply.spark)
    except apply_errors.ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    settings = apply.spark.model_copy(
        update={
            "app_name": "cdc-verify",
            "conf": {**apply.spark.conf, "spark.sql.session.timeZone": "UTC"},
        }
    )
    spark = build_session(settings, jars)
    try:
        report = verify_tables(
            capture,
            apply,
            spark,
            arguments.tables,
            rounds=arguments.rounds,
            timeout_s=arguments.timeout,
            max_keys=arguments.max_keys,
        )
    except (capture_errors.ConfigError, apply_errors.ConfigError) as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except VerifyPointTimeoutError as exc:
        print(f"no verify point: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    except (capture_errors.PipelineError, apply_errors.PipelineError) as exc:
        print(f"verify failed: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    finally:
        spark.stop()
    print(format_json(report) if arguments.json else format_human(report))
    return EXIT_OK if report.ok else EXIT_DIFFERENT
