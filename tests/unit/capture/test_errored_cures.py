"""What capture tells the operator about an errored table: the cause, then the resync that
releases it (a restart alone keeps it errored), read from the line the flow logs and the
status it publishes (issue #33)."""

from __future__ import annotations

import logging

import pytest

from capture.errors import TableError
from capture.rows.typemap import map_column
from schemas.control import TableState
from tests.plugins.table_flow import table_flow

RESYNC = "python -m capture resync public.t"


def _errored_line(caplog: pytest.LogCaptureFixture, message: str) -> tuple[str, str | None]:
    flow, publisher, _runs = table_flow()
    with caplog.at_level(logging.ERROR, logger="capture.stream.table_flow"):
        flow.errored("public.t", message)
    (record,) = [r for r in caplog.records if r.name == "capture.stream.table_flow"]
    (status,) = [s for s in publisher.statuses if s.state is TableState.ERRORED]
    return record.getMessage(), status.message


def test_an_errored_table_is_told_to_resync(caplog: pytest.LogCaptureFixture) -> None:
    """A cause whose message names no cure (a change the stream cannot encode, a check
    at start) gets the resync."""
    line, status = _errored_line(caplog, "table public.t: change could not be encoded")
    assert line.startswith("table errored: table public.t: change could not be encoded; ")
    assert f"once the cause is fixed: {RESYNC}, then restart capture" in line
    assert status is not None
    assert line.endswith(status)


def test_a_type_map_error_names_the_resync_once(caplog: pytest.LogCaptureFixture) -> None:
    numeric_10_2 = ((10 << 16) | 2) + 4  # the typmod of numeric(10,2)
    column = map_column(1700, numeric_10_2, {}, table="public.t", column="c")
    with pytest.raises(TableError) as raised:
        column.parse(b"NaN")
    line, _status = _errored_line(caplog, str(raised.value))
    assert line.endswith(f"then run {RESYNC} and restart capture")
    assert line.count("capture resync") == 1
    assert "restart the table" not in line
