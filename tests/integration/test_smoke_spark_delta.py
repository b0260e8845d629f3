"""Smoke: Spark reads a real Kafka topic, decodes fastavro-written Avro on the JVM with
``from_avro``, writes a Delta table, MERGEs into it and reads it back.

Proves the apply job's building blocks and the jar set from deploy/jars/spark/pom.xml
(the Kafka source, Delta, and the 4.0.0 token-provider jar paired with Spark 4.2).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.plugins.services import Services

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "record",
    "name": "Row",
    "namespace": "smoke",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
    ],
}


def _encode(record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(SCHEMA), record)
    return buf.getvalue()


def test_kafka_avro_to_delta_merge(
    spark: Any, services: Services, unique_name: str, tmp_path: Path
) -> None:
    from decimal import Decimal  # noqa: PLC0415

    from delta.tables import DeltaTable  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: PLC0415
    from pyspark.sql.avro.functions import from_avro  # noqa: PLC0415

    admin = AdminClient({"bootstrap.servers": services.kafka_bootstrap_servers})
    admin.create_topics([NewTopic(unique_name, 1, 1)])[unique_name].result(30)
    producer = Producer({"bootstrap.servers": services.kafka_bootstrap_servers, "acks": "all"})
    for i in range(1, 4):
        producer.produce(
            unique_name, _encode({"id": i, "name": f"n{i}", "amount": Decimal(f"{i}.25")})
        )
    assert producer.flush(30) == 0

    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", services.kafka_bootstrap_servers)
        .option("subscribe", unique_name)
        .option("startingOffsets", "earliest")
        .load()
    )
    rows = raw.select(from_avro(F.col("value"), json.dumps(SCHEMA)).alias("r")).select("r.*")
    path = str(tmp_path / "delta")
    rows.write.format("delta").save(path)

    updates = spark.createDataFrame(
        [(2, "two", Decimal("9.99")), (4, "four", Decimal("4.00"))],
        "id long, name string, amount decimal(10,2)",
    )
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(updates.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )

    result = {
        r["id"]: (r["name"], r["amount"]) for r in spark.read.format("delta").load(path).collect()
    }
    assert result == {
        1: ("n1", Decimal("1.25")),
        2: ("two", Decimal("9.99")),
        3: ("n3", Decimal("3.25")),
        4: ("four", Decimal("4.00")),
    }
    history = DeltaTable.forPath(spark, path).history().select("operation").collect()
    assert [h["operation"] for h in history] == ["MERGE", "WRITE"]
