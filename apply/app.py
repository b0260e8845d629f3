"""The apply job as a Structured Streaming query: wiring, not logic.

One query reads every change topic of the prefix (a pattern, so tables added later are
picked up without a restart) and hands each micro-batch to
:func:`apply.batch.apply_batch`; after the Delta commits, the applied progress goes to
the control topic. The checkpoint lives at ``<checkpoint_root>/apply``; Delta's
``txnAppId`` is derived from that location, so a replayed batch is skipped by Delta.

At start the job re-publishes the progress recorded in every Delta table it finds under
the lake root: if it died between a commit and its publish, capture still learns about
it. Stopping (SIGTERM) stops the query; a batch cut short is replayed on restart and
Delta's transaction ids make the replay harmless.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from apply.batch import ApplyContext, apply_batch
from apply.errors import UnknownSchemaError
from apply.feedback import ProgressPublisher, SchemaCatalog
from apply.history import recover_state
from apply.merge import transaction_app_id
from apply.progress import TableResult, applied_progress, recovered_progress
from apply.settings import ApplySettings, KafkaSettings
from apply.tables import table_of_topic

log = logging.getLogger(__name__)


def change_topic_pattern(kafka: KafkaSettings) -> str:
    """Java regex of the change topics: ``<prefix>.<schema>.<table>``, never the control or
    schema topic even when they share the prefix."""
    segment = r"[A-Za-z0-9_\-]+"
    excluded = "|".join(re.escape(t) for t in (kafka.control_topic, kafka.schema_topic))
    return rf"^(?!(?:{excluded})$){re.escape(kafka.topic_prefix)}\.{segment}\.{segment}$"


def checkpoint_location(settings: ApplySettings) -> str:
    return settings.lake.checkpoint_root.rstrip("/") + "/apply"


def replication_lag_s(result: TableResult, now_unix_s: float) -> float | None:
    """Seconds between the newest applied source commit and now: how far the table lags."""
    commit_ts = result.state.commit_ts
    return None if commit_ts is None else max(0.0, now_unix_s - commit_ts / 1_000_000)


def log_results(batch_id: int, results: list[TableResult], started: float) -> None:
    now = time.time()
    for r in results:
        lag = replication_lag_s(r, now)
        log.info(
            "batch %d table %s: records=%d replays=%d superseded=%d inserted=%d "
            "updated=%d deleted=%d version=%d committed=%s duration=%.2fs lag=%s",
            batch_id,
            r.table,
            r.records,
            r.replays,
            r.superseded,
            r.rows_inserted,
            r.rows_updated,
            r.rows_deleted,
            r.version,
            r.committed,
            time.monotonic() - started,
            "n/a" if lag is None else f"{lag:.1f}s",
        )


class ApplyJob:
    def __init__(self, settings: ApplySettings, spark: SparkSession) -> None:
        self._settings = settings
        self._spark = spark
        self._catalog = SchemaCatalog(settings.kafka)
        self._publisher = ProgressPublisher(settings.kafka)
        self._context_id = transaction_app_id(checkpoint_location(settings))

    def on_batch(self, batch: DataFrame, batch_id: int) -> None:
        self.apply(batch, batch_id)

    def apply(self, batch: DataFrame, batch_id: int) -> list[TableResult]:
        """The ``foreachBatch`` body: apply, then publish what was applied."""
        started = time.monotonic()
        for attempt in range(2):
            context = ApplyContext(
                self._settings.lake.root, self._context_id, dict(self._catalog.schemas)
            )
            try:
                results = apply_batch(batch, batch_id, context)
            except UnknownSchemaError:
                if attempt == 1:
                    raise
                # Capture flushes a schema before the first record using it: read again.
                self._catalog.refresh()
                continue
            self._publisher.publish(m for r in results for m in applied_progress(r))
            log_results(batch_id, results, started)
            return results
        return []

    def republish_recorded_progress(self) -> int:
        """Publish the progress every Delta table under the lake root recorded."""
        jvm: Any = self._spark.sparkContext._jvm  # Hadoop FS lives on the JVM only
        hadoop_conf = self._spark.sparkContext._jsc.hadoopConfiguration()
        root = jvm.org.apache.hadoop.fs.Path(self._settings.lake.root)
        fs = root.getFileSystem(hadoop_conf)
        pattern = jvm.org.apache.hadoop.fs.Path(
            self._settings.lake.root.rstrip("/") + "/*/*/_delta_log"
        )
        statuses = fs.globStatus(pattern) or []
        states = []
        for status in statuses:
            table_path = status.getPath().getParent()
            schema, table = table_path.getParent().getName(), table_path.getName()
            state = recover_state(self._spark, table_path.toString(), f"{schema}.{table}")
            if state is not None:
                states.append(state)
        messages = recovered_progress(states)
        self._publisher.publish(messages)
        return len(messages)

    def run(self, stop: threading.Event) -> None:
        settings = self._settings
        self._catalog.refresh()
        republished = self.republish_recorded_progress()
        log.info("re-published %d applied-progress messages from Delta", republished)
        reader = (
            self._spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka.bootstrap_servers)
            .option("subscribePattern", change_topic_pattern(settings.kafka))
            .option("startingOffsets", "earliest")
        )
        if settings.kafka.max_offsets_per_trigger is not None:
            reader = reader.option("maxOffsetsPerTrigger", settings.kafka.max_offsets_per_trigger)
        writer = (
            reader.load()
            .writeStream.foreachBatch(self.on_batch)
            .option("checkpointLocation", checkpoint_location(settings))
            .queryName("pgdelta-apply")
        )
        if settings.trigger.mode == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=settings.trigger.interval)
        query = writer.start()
        try:
            while query.isActive and not stop.is_set():
                query.awaitTermination(1)
        finally:
            if query.isActive:
                query.stop()
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"the apply query failed: {error}")


__all__ = ["ApplyJob", "change_topic_pattern", "checkpoint_location", "table_of_topic"]
