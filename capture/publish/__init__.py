"""The Kafka side of capture: topics, the idempotent producer (confluent-kafka's or the
compiled one), the control-topic reader, key partitioning and the framing of records
(single-object encoding or a schema registry).
"""
