"""Pure parts of the streaming application: the topic pattern, the lag figure and the
command line."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

import pytest

from apply.__main__ import _arguments, record_coordinates
from apply.app import change_topic_pattern, replication_lag_s
from apply.settings import KafkaSettings
from tests.plugins.table_states import PROGRESS_STATE as STATE
from tests.plugins.table_states import TOPIC
from tests.plugins.table_states import table_result as result


def test_pattern_takes_change_topics_and_never_control_or_schema_topics() -> None:
    kafka = KafkaSettings(topic_prefix="cdc", control_topic="cdc.x.y", schema_topic="cdc._schemas")
    pattern = re.compile(change_topic_pattern(kafka))
    assert pattern.match("cdc.public.orders")
    assert pattern.match("cdc.my-2dschema.t_1")
    assert not pattern.match("cdc.x.y"), "a control topic shaped like a change topic"
    assert not pattern.match("cdc._schemas")
    assert not pattern.match("cdc._control")
    assert not pattern.match("other.public.orders")
    assert not pattern.match("cdcX.public.orders")
    assert not pattern.match("cdc.public.orders.extra")


def test_lag_is_seconds_since_the_newest_applied_commit() -> None:
    now = STATE.commit_ts / 1_000_000 + 2.5  # type: ignore[operator]
    assert replication_lag_s(result(((TOPIC, 0),)), now) == 2.5
    unknown = replace(result(((TOPIC, 0),)), state=replace(STATE, commit_ts=None))
    assert replication_lag_s(unknown, now) is None


def test_discard_takes_the_coordinates_an_error_names() -> None:
    assert record_coordinates("cdc.public.orders/0/1234") == ("cdc.public.orders", 0, 1234)
    for bad in ("cdc.public.orders/0", "cdc.public.orders/x/1", "/0/1", "t/0/-1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="<topic>/<partition>/<offset>"):
            record_coordinates(bad)


def test_discard_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    arguments = _arguments(["discard", "public.orders", "cdc.public.orders/2/7"])
    assert (arguments.command, arguments.table, arguments.record) == (
        "discard",
        "public.orders",
        ("cdc.public.orders", 2, 7),
    )
    with pytest.raises(SystemExit):
        _arguments(["discard", "public.orders", "cdc.public.orders:2:7"])
    assert "is not <topic>/<partition>/<offset>" in capsys.readouterr().err
