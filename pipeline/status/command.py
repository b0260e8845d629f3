"""``python -m pipeline status``: read once, print, exit 0 when all is well.

Exit status: 0 when capture has started, the slot exists and is not lost, and no table
is errored (in capture or in apply); 1 otherwise, or when a service cannot be read.
"""

from __future__ import annotations

import argparse
import logging
import sys

from apply.settings import ApplySettings
from capture.settings import CaptureSettings
from pipeline.status.errors import StatusError
from pipeline.status.reader import collect
from pipeline.status.render import render_json, render_text

HEALTHY, UNHEALTHY = 0, 1


def main(argv: list[str], capture: CaptureSettings, apply: ApplySettings) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline status",
        description=(
            "One read-only view of the pipeline: each table's capture state, applied LSN, "
            "lag and parked records, and the replication slot. Exits 1 when a table is "
            "errored, the slot is lost or absent, or capture has not started."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    arguments = parser.parse_args(argv)
    try:
        status = collect(capture, apply)
    except StatusError as exc:
        logging.getLogger("pipeline.status").error("%s", exc)  # noqa: TRY400 - says what failed
        return UNHEALTHY
    print(render_json(status) if arguments.json else render_text(status))
    sys.stdout.flush()
    return HEALTHY if status.healthy else UNHEALTHY
