"""The apply job's control-topic publisher against a real broker (auto-creation off, as
in production clusters that own their topics)."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from apply.control.feedback import ProgressPublisher
from apply.errors import ConfigError
from apply.settings import KafkaSettings
from schemas.control import AppliedProgress, decode_progress
from schemas.lsn import Lsn
from tests.plugins.services import Services
from tests.plugins.topics import consume_all, record_count


def _progress(next_offset: int, partition: int = 0) -> AppliedProgress:
    return AppliedProgress(
        "cdc.public.t",
        partition,
        next_offset,
        Lsn(0x100),
        3,
        "public.t",
        Lsn(0x100),
        1_700_000_000,
    )


def _settings(services: Services, control_topic: str) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=services.kafka_bootstrap_servers, control_topic=control_topic
    )


def test_progress_lands_on_the_control_topic(services: Services, unique_name: str) -> None:
    topic = f"{unique_name}._control"
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[
        topic
    ].result(30)

    # One publish sends the newest message of each key (the topic is compacted, so a
    # superseded one would only ever be read to be overtaken: apply.control.feedback.Outbox), in
    # the order each key last came.
    ProgressPublisher(_settings(services, topic)).publish(
        [_progress(5), _progress(7, partition=1), _progress(9)]
    )

    messages = consume_all(services.kafka_bootstrap_servers, [topic], expected=2)
    assert [decode_progress(m.key(), m.value()) for m in messages] == [
        _progress(7, partition=1),
        _progress(9),
    ]
    assert record_count(services.kafka_bootstrap_servers, topic) == 2


def test_a_missing_control_topic_is_a_config_error(services: Services, unique_name: str) -> None:
    topic = f"{unique_name}._control"
    with pytest.raises(ConfigError, match=rf"control topic {topic} does not exist.*capture"):
        ProgressPublisher(_settings(services, topic)).publish([_progress(1)])
