"""Pure parts of the streaming application: the topic pattern and the lag figure."""

from __future__ import annotations

import re
from dataclasses import replace

from apply.app import change_topic_pattern, replication_lag_s
from apply.settings import KafkaSettings
from tests.unit.apply.test_apply_progress import STATE, TOPIC, result


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
