"""The two log formats: JSON lines with the structured fields, text with them appended."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from runtime.logs import JsonFormatter, LogSettings, TextFormatter, configure


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("capture.service", logging.WARNING, __file__, 1, message, args, None)
    rec.__dict__.update(extra)
    return rec


def test_json_line_has_the_fixed_fields_and_the_structured_ones() -> None:
    line = JsonFormatter().format(
        record("batch %d applied", 7, table="public.orders", lsn="0/16B3748", batch_id=7)
    )
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "capture.service"
    assert entry["message"] == "batch 7 applied"
    assert entry["table"] == "public.orders"
    assert entry["lsn"] == "0/16B3748"
    assert entry["batch_id"] == 7
    assert entry["time"].endswith("+00:00")


def test_json_copies_no_other_attribute_of_the_record() -> None:
    entry = json.loads(JsonFormatter().format(record("x", row={"secret": "s3cr3t"})))
    assert set(entry) == {"time", "level", "logger", "message"}


def test_json_keeps_an_exception_on_its_line() -> None:
    error = ValueError("boom")
    rec = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "failed", (), (ValueError, error, None)
    )
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    assert "ValueError: boom" in json.loads(line)["exception"]


def test_text_appends_the_structured_fields() -> None:
    line = TextFormatter().format(record("streaming", table="public.orders", lsn="0/10"))
    assert line.endswith("WARNING capture.service streaming [table=public.orders lsn=0/10]")
    assert TextFormatter().format(record("plain")).endswith("capture.service plain")


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root")
def test_configure_replaces_handlers_and_sets_the_level() -> None:
    out = io.StringIO()
    configure(LogSettings(format="json", level="WARNING"), out)
    configure(LogSettings(format="json", level="WARNING"), out)  # twice: still one line each
    logging.getLogger("apply.app").info("hidden")
    logging.getLogger("apply.app").warning("shown", extra={"batch_id": 3})
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["batch_id"] == 3
