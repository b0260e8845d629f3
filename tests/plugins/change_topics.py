"""Change topics for the apply tests: changes made by the contract's own encoder, produced
to a fresh topic and read back as the DataFrame ``foreachBatch`` hands over, and the lake
they land in read back by Spark.

Shared by the apply-batch integration modules (``test_apply_batch.py``, the isolation,
fair-pool, driver-merge and resync modules).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from apply.batch import ApplyContext
from apply.lake.spark_merge import transaction_app_id
from schemas.change_record import Change, ChangeEncoder, TableSchemas
from schemas.lsn import Lsn
from schemas.naming import table_topic
from schemas.operation import Operation
from tests.plugins.services import Services

INSERT, UPDATE, DELETE, TRUNCATE = (
    Operation.INSERT,
    Operation.UPDATE,
    Operation.DELETE,
    Operation.TRUNCATE,
)
COMMIT_TS = 1_715_941_815_000_000


def change(op: Operation, lsn: int, ordinal: int, **images: Any) -> Change:
    """A change of the transaction committed at ``lsn``; its commit time follows the LSN."""
    return Change(op, Lsn(lsn), Lsn(lsn + ordinal), lsn, COMMIT_TS + lsn, ordinal, **images)


class ChangeTopic:
    """A fresh change topic and a producer writing to chosen partitions."""

    def __init__(self, services: Services, table: str, partitions: int) -> None:
        self.name = table_topic("cdc", "public", table)
        self.bootstrap = services.kafka_bootstrap_servers
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(self.name, partitions, 1)])[self.name].result(30)
        self.producer = Producer(
            {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all"}
        )
        self.offsets = dict.fromkeys(range(partitions), 0)

    def send(self, encoder: ChangeEncoder, partition: int, *changes: Change) -> None:
        for item in changes:
            self.raw(partition, encoder.encode_key(item), encoder.encode_value(item))
            if item.op is DELETE:
                self.raw(partition, encoder.encode_key(item), None)  # its tombstone

    def raw(self, partition: int, key: bytes, value: bytes | None) -> None:
        self.producer.produce(self.name, value, key, partition=partition)
        self.offsets[partition] += 1

    def mark(self) -> dict[int, int]:
        """Flush, and return the next offset of every partition."""
        assert self.producer.flush(30) == 0
        return dict(self.offsets)

    def batch(self, spark: Any, start: dict[int, int], end: dict[int, int]) -> Any:
        def offsets(marks: dict[int, int]) -> str:
            return json.dumps({self.name: {str(p): o for p, o in marks.items()}})

        return (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", self.name)
            .option("startingOffsets", offsets(start))
            .option("endingOffsets", offsets(end))
            .load()
        )


def context(tmp_path: Path, *schemas: TableSchemas) -> ApplyContext:
    return ApplyContext(
        lake_root=str(tmp_path / "lake"),
        txn_app_id=transaction_app_id(str(tmp_path / "checkpoint")),
        writer_schemas={s.value_fingerprint: s.value_schema_json for s in schemas},
    )


def dead_letter_rows(spark: Any, ctx: ApplyContext) -> list[tuple[Any, ...]]:
    """The dead-letter table: table, partition, offset, fingerprint, position, parking
    batch and re-applied version, in Kafka order."""
    table = spark.read.format("delta").load(ctx.dead_letter)
    return sorted(
        tuple(row)
        for row in table.select(
            "source_table",
            "partition",
            "offset",
            "fingerprint",
            "commit_lsn",
            "ordinal",
            "batch_id",
            "reapplied_version",
        ).collect()
    )


def rows(spark: Any, path: str, *columns: str) -> dict[int, tuple[Any, ...]]:
    """The table's rows by id: the given columns or SQL expressions."""
    table = spark.read.format("delta").load(path)
    return {row[0]: tuple(row[1:]) for row in table.selectExpr("id", *columns).collect()}


def versions(spark: Any, *paths: str) -> list[int]:
    from delta.tables import DeltaTable  # noqa: PLC0415 - pyspark only when Spark runs

    newest = [DeltaTable.forPath(spark, path).history(1).head() for path in paths]
    return [int(row["version"]) for row in newest if row is not None]
