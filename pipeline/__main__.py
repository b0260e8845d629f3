"""``python -m pipeline status|verify``: commands over the whole pipeline.

Both read the settings of the two services from the same environment the services read
(``CAPTURE_*`` and ``APPLY_*``), so they run wherever either service is configured.
``status`` only reads (docs/operations.md); ``verify`` proves the lake equals the source
(docs/verify.md). Exit code 2: the settings are invalid.
"""

from __future__ import annotations

import argparse
import logging
import sys

from pydantic import ValidationError

from apply.settings import ApplySettings
from capture.settings import CaptureSettings
from runtime.errors import ConfigError

COMMANDS = {"status": "where every table and the slot stand", "verify": "lake equals source?"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="Commands over both services, configured by their CAPTURE_* and APPLY_* "
        "environment.",
    )
    parser.add_argument(
        "command",
        choices=sorted(COMMANDS),
        help=", ".join(f"{name}: {what}" for name, what in COMMANDS.items()),
    )
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="see <command> --help")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        capture_settings = CaptureSettings()
        apply_settings = ApplySettings()
    except ValidationError as exc:
        print(f"invalid settings:\n{exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"invalid settings: {exc}", file=sys.stderr)
        return 2
    # Imported per command: status must run where pyspark is not even loaded.
    if arguments.command == "status":
        from pipeline.status import main as status_main  # noqa: PLC0415

        return status_main(arguments.arguments, capture_settings, apply_settings)
    from pipeline.verify.command import main as verify_main  # noqa: PLC0415

    return verify_main(arguments.arguments, capture_settings, apply_settings)


if __name__ == "__main__":
    sys.exit(main())
