"""The status's Kafka reader against topics created a moment before it reads them.

A capture creates a change topic when a table appears, so ``status`` meets topics whose
partitions have no settled leader yet: a broker answers the first offset requests for
them with NOT_LEADER_FOR_PARTITION. The reader asks again until its deadline instead of
failing the whole status (a real broker did so in about one read of four here).
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from pipeline.status.kafka import KafkaReader
from tests.plugins.services import Services

TOPICS = 20
PARTITIONS = 2


def test_every_new_topic_is_read_with_its_ends(services: Services, unique_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap_servers})
    control = f"{unique_name}._control"
    admin.create_topics([NewTopic(control, 2, 1)])[control].result()
    reader = KafkaReader(
        services.kafka_bootstrap_servers, control, unique_name, f"{unique_name}._schemas"
    )
    created: list[str] = []
    try:
        for i in range(TOPICS):
            topic = f"{unique_name}.app.t{i}"
            admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
            created.append(topic)
            snapshot = reader.read()
            assert snapshot.control_topic_exists
            # Every topic created so far is there, with an end for each partition; the
            # newest may be missing from a metadata answer given before it settled.
            listed = set(snapshot.change_topics.values())
            assert set(created[:-1]) <= listed, f"topics left out: {set(created) - listed}"
            for t in listed:
                assert {snapshot.ends[(t, p)] for p in range(PARTITIONS)} == {0}
    finally:
        for future in admin.delete_topics([control, *created]).values():
            future.result()
