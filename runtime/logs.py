"""How both services write their logs: plain text for people, or one JSON object per
line for log pipelines, with the table, LSN and batch id as fields. Never row values or
secrets, in either format.

Invariants:

- :func:`configure` is the only place that installs a handler; it replaces whatever
  was there (``logging.basicConfig`` would keep the first one), so calling it twice
  never doubles lines.
- A JSON line always has ``time`` (UTC, ISO 8601 with milliseconds), ``level``,
  ``logger`` and ``message``; ``table``, ``lsn`` and ``batch_id`` appear when the call
  passed them with ``extra=`` (:data:`FIELDS`), ``exception`` when it logged one. No
  other attribute of the record is copied, so nothing reaches the output that the
  message itself did not say.
- Row values and secrets are kept out by the callers: messages carry names, counts,
  LSNs and error classes, never a value of a row or a password (the e2e test greps a
  run's logs for both).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal, TextIO

from pydantic import BaseModel, ConfigDict, Field

FIELDS = ("table", "lsn", "batch_id")
"""Structured fields a log call may pass with ``extra=``; each becomes a JSON field."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class LogSettings(BaseModel):
    """Log format and cadence (``CAPTURE_LOG__*``, ``APPLY_LOG__*``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["text", "json"] = Field(
        "text", description="text, or json: one object per line with structured fields"
    )
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")
    progress_interval_s: float = Field(
        30.0, gt=0, description="how often a progress line (rates, LSNs, lag) is logged"
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value if isinstance(value, int | float | str | bool) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # ensure_ascii keeps every line plain ASCII whatever a table is called.
        return json.dumps(entry, ensure_ascii=True, default=str)


class TextFormatter(logging.Formatter):
    """The classic line, with the structured fields appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [
            f"{name}={record.__dict__[name]}"
            for name in FIELDS
            if record.__dict__.get(name) is not None
        ]
        if not fields:
            return line
        head, newline, rest = line.partition("\n")
        return f"{head} [{' '.join(fields)}]{newline}{rest}"


def configure(settings: LogSettings, stream: TextIO | None = None) -> None:
    """Send every log record at ``settings.level`` or above to ``stream`` (stderr) in
    ``settings.format``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level)
