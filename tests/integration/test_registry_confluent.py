"""A consumer we did not write reads the registry-framed topics: capture in
``CAPTURE_KAFKA__ENCODING=registry`` mode streams a type-rich table (a column of every
mapped type, tests/plugins/type_cases.py) through a real Kafka into the
real Apicurio Registry, and confluent-kafka's ``AvroDeserializer`` with its
``SchemaRegistryClient`` decodes every key and value to the values our
:class:`~schemas.reader.ContractReader` gives for the same record.

Only temporal values Python's ``datetime`` can hold are inserted: fastavro, on which
every Python Avro deserializer stands, raises on ``infinity``, years BC or after 9999
and ``24:00:00``, where our reader returns ``UnrepresentableTemporal``; those values are
proven through the schemas' own test and the Spark path (test_avro_contract_spark.py).
"""

from __future__ import annotations

import json
import re
import struct
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from psycopg import sql

from schemas import registry_framing, single_object
from schemas.column_type import AvroKind, ColumnType
from schemas.headers import SCHEMA_FINGERPRINT
from schemas.naming import table_topic
from schemas.reader import ContractReader
from tests.plugins.capture import CaptureThread, registry_settings
from tests.plugins.services import Services
from tests.plugins.topics import wait_for_topic
from tests.plugins.type_cases import CASES, create_table

Connection = psycopg.Connection[tuple[object, ...]]

_TEMPORAL = {AvroKind.DATE, AvroKind.TIME_MICROS, AvroKind.TIMESTAMP_MICROS}
_TEMPORAL |= {AvroKind.LOCAL_TIMESTAMP_MICROS}


@pytest.fixture
def schema(pg: Connection, unique_name: str) -> Iterator[str]:
    """A schema for the type-rich table and its types (on the search path), dropped
    afterwards."""
    name = sql.Identifier(unique_name)
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(name))
    pg.execute("CREATE EXTENSION IF NOT EXISTS hstore SCHEMA public")
    pg.execute(sql.SQL("SET search_path = {}, public").format(name))
    try:
        yield unique_name
    finally:
        pg.execute("RESET search_path")
        pg.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(name))


def _temporal(column_type: ColumnType) -> bool:
    if column_type.kind is AvroKind.ARRAY:
        assert column_type.items is not None
        return _temporal(column_type.items)
    return column_type.kind in _TEMPORAL


def _python_can_hold(value: str) -> bool:
    return not (
        any(word in value for word in ("BC", "infinity", "24:00:00"))
        or re.match(r"'\d{5,}", value) is not None
    )


def _rows() -> list[list[str]]:
    """The type-rich rows, temporal values limited to what ``datetime`` holds; the last
    row is NULL throughout."""
    columns = [
        [v for v in case.values if _python_can_hold(v)]
        if _temporal(case.column_type)
        else list(case.values)
        for case in CASES
    ]
    count = max(len(values) for values in columns) + 1
    return [
        [values[row] if row < len(values) else "NULL" for values in columns] for row in range(count)
    ]


def consume_all(bootstrap: str, topic: str, count: int, timeout_s: float = 120) -> list[Any]:
    """The first ``count`` records of every partition of ``topic`` together."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "enable.auto.commit": False}
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(records) < count:
            assert time.monotonic() < deadline, f"{len(records)} of {count} records on {topic}"
            for message in consumer.consume(500, timeout=0.5):
                assert message.error() is None, message.error()
                records.append(message)
        return records
    finally:
        consumer.close()


def contract_reader(bootstrap: str, schema_topic: str) -> ContractReader:
    """A reader knowing every schema on ``schema_topic`` (read to its end)."""
    reader = ContractReader(schema_topic)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{schema_topic}-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(schema_topic, timeout=30)
        partitions = sorted(metadata.topics[schema_topic].partitions)
        consumer.assign([TopicPartition(schema_topic, p, 0) for p in partitions])
        at_end: set[int] = set()
        while len(at_end) < len(partitions):
            for message in consumer.consume(100, timeout=0.5):
                if message.error() is not None:
                    at_end.add(message.partition() or 0)
                    continue
                key = message.key()
                assert key is not None
                reader.add_schema_message(key, message.value())
    finally:
        consumer.close()
    return reader


def same(theirs: Any, ours: Any) -> bool:
    """Equal values; a float equal bit for bit (NaN is not equal to itself, and -0.0
    equals 0.0 under ``==``)."""
    if isinstance(theirs, float) and isinstance(ours, float):
        return struct.pack("<d", theirs) == struct.pack("<d", ours)
    if isinstance(theirs, dict) and isinstance(ours, dict):
        return theirs.keys() == ours.keys() and all(same(theirs[k], ours[k]) for k in theirs)
    if isinstance(theirs, list) and isinstance(ours, list):
        return len(theirs) == len(ours) and all(map(same, theirs, ours))
    return type(theirs) is type(ours) and bool(theirs == ours)


def differences(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    out = [k for k in theirs.keys() | ours.keys() if not same(theirs.get(k), ours.get(k))]
    for image in ("before", "after"):
        if image in out and isinstance(theirs[image], dict) and isinstance(ours[image], dict):
            row_t, row_o = theirs[image], ours[image]
            out += [
                f"{image}.{c}: {row_t.get(c)!r} != {row_o.get(c)!r}"
                for c in row_t
                if not same(row_t.get(c), row_o.get(c))
            ]
    return out


def as_single_object(record: Any) -> bytes:
    """The single-object form of a registry-framed value: the same body behind the
    fingerprint header its ``pgdelta.schema`` Kafka header names."""
    _, body = registry_framing.split(record.value())
    fingerprint_hex = dict(record.headers())[SCHEMA_FINGERPRINT].decode("ascii")
    fingerprint = single_object.Fingerprint(
        int.from_bytes(bytes.fromhex(fingerprint_hex), "little")
    )
    return single_object.header(fingerprint) + bytes(body)


def test_confluent_avro_deserializer_reads_what_our_reader_reads(
    services: Services,
    pg: Connection,
    schema: str,
    unique_name: str,
    schema_registry_url: str,
    request: pytest.FixtureRequest,
) -> None:
    table = sql.Identifier(schema, "rich")
    create_table(pg, table)
    settings = registry_settings(services, unique_name, schema_registry_url)
    settings = settings.model_copy(
        update={"postgres": settings.postgres.model_copy(update={"tables": [f"{schema}.rich"]})}
    )
    runner = CaptureThread(settings)
    runner.start(pg)
    try:
        names = sql.SQL(", ").join(
            [sql.Identifier("id")] + [sql.Identifier(case.column) for case in CASES]
        )
        rows = _rows()
        for index, row in enumerate(rows):
            values = sql.SQL(", ").join([sql.Literal(index)] + [sql.SQL(v) for v in row])
            pg.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(table, names, values))
        pg.execute(sql.SQL("UPDATE {} SET i4 = 7 WHERE id = 0").format(table))
        pg.execute(sql.SQL("DELETE FROM {} WHERE id = 1").format(table))
        pg.execute(sql.SQL("TRUNCATE {}").format(table))
        expected = len(rows) + 3
        topic = table_topic(unique_name, schema, "rich")
        wait_for_topic(services.kafka_bootstrap_servers, topic)
        records = consume_all(services.kafka_bootstrap_servers, topic, expected)
    finally:
        runner.close(pg)
    assert not runner.errors, runner.errors

    reader = contract_reader(services.kafka_bootstrap_servers, f"{unique_name}._schemas")
    registry = SchemaRegistryClient({"url": schema_registry_url})
    request.addfinalizer(registry.close)
    values = AvroDeserializer(registry)
    keys = AvroDeserializer(registry)
    ops = []
    for record in records:
        value, key = record.value(), record.key()
        assert registry_framing.framing_of(value) is registry_framing.Framing.REGISTRY
        assert registry_framing.framing_of(key) is registry_framing.Framing.REGISTRY
        theirs = values(value, SerializationContext(topic, MessageField.VALUE))
        ours = reader.decode_value(as_single_object(record))
        assert same(theirs, ours), differences(theirs, ours)
        ops.append(theirs["op"])
        # The key: their decoding equals ours of the same body with the schema the
        # registry holds for its id (the key's own schema, or TableKey for TRUNCATE).
        schema_id, body = registry_framing.split(key)
        key_schema_text = registry.get_schema(schema_id).schema_str
        assert key_schema_text is not None
        key_schema = json.loads(key_schema_text)
        fingerprint = single_object.schema_fingerprint(key_schema)
        reader.add_schema(json.dumps(key_schema))
        ours_key = reader.decode_key(single_object.header(fingerprint) + bytes(body))
        if theirs["op"] == "TRUNCATE":
            # TableKey has no fields, so the key is the 5-byte header alone: valid Avro,
            # but confluent-kafka's Python deserializer refuses any record of 5 bytes or
            # less (docs/wire-contract.md, Schema Registry wire format).
            assert key_schema["name"] == "TableKey"
            assert (len(key), ours_key) == (registry_framing.HEADER_SIZE, {})
            continue
        assert keys(key, SerializationContext(topic, MessageField.KEY)) == ours_key
    assert sorted(ops) == sorted(["INSERT"] * len(rows) + ["UPDATE", "DELETE", "TRUNCATE"])

    # The subjects capture registered, and the compatibility it set on them.
    def level(subject: str) -> str:
        with urllib.request.urlopen(f"{schema_registry_url}/config/{subject}") as response:
            return str(json.loads(response.read())["compatibilityLevel"])

    assert level(f"{topic}-value") == "FULL_TRANSITIVE"
    assert level(f"{topic}-key") == "NONE"
