"""The apply job as Structured Streaming queries: wiring, not logic.

One query per lane (:mod:`apply.lanes`; without ``APPLY_LANES`` just the default lane,
which reads every change topic of the prefix through a pattern, so tables added later
are picked up without a restart) hands each micro-batch to
:func:`apply.batch.apply_batch`; after the Delta commits, the applied progress goes to
the control topic. The default lane's checkpoint lives at ``<checkpoint_root>/apply``;
each query's Delta ``txnAppId`` is derived from its checkpoint location, so a replayed
batch is skipped by Delta. The queries' ``foreachBatch`` calls run on their own driver
threads, so the schema catalog and the control-topic producer are shared under locks.

At start, before anything else touches the tables, the job folds what a log of the
retired change log still holds into its table (:mod:`apply.lake.retired_log`); then it
re-publishes the progress recorded in every Delta table it finds under the lake root,
and the offsets of the records parked in the dead-letter table: if it died between a
commit and its publish, capture still learns about it. Stopping (SIGTERM) stops the
query; a batch cut short is replayed on restart and Delta's transaction ids make the
replay harmless.

A batch that fails with a :class:`~apply.errors.TransientError` is retried in place a
few times with backoff (a retried batch is idempotent, :mod:`apply.batch`); after that
the query fails, the job stops the other lanes' queries and the process exits, for its
supervisor to restart it. The publish after the commits is different: it waits until
the broker has the messages, however long the broker is away (:mod:`apply.control.feedback`
says why), and the batch, hence the lane's next batch, waits with it; only a stop
(SIGTERM) ends the wait, leaving the messages to the next start's re-publish.

Metrics (:mod:`apply.metrics`) are counted from each batch's result after its progress
is published; health (:mod:`runtime.telemetry`): alive while every lane's query is
active, ready once they run and while neither a batch nor a publish has been failing
transiently for longer than ``not_ready_after_s``.

:meth:`ApplyJob.reapply` wires ``python -m apply reapply`` (:mod:`apply.reapply`), and
:meth:`ApplyJob.discard` ``python -m apply discard``.

Each table's errored state and parked count also go to the control topic
(:mod:`apply.control.table_status`), always after the dead-letter commit that changed them:
after a batch that parked new records, after ``reapply`` and ``discard``, and at start
for every table with rows in the dead-letter table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from apply.batch import ApplyContext, apply_batch, recorded_state
from apply.batch.held_batch import HeldBatchReader
from apply.batch.table_pool import POOL_PROPERTY
from apply.control.feedback import ProgressPublisher, SchemaCatalog
from apply.control.progress import (
    BatchResult,
    ParkedTable,
    TableResult,
    batch_progress,
    recovered_progress,
)
from apply.control.table_status import now_micros, table_statuses
from apply.engine.kafka_clients import HELD_GROUP, client_conf, spark_source_options
from apply.errors import TableError, UnknownSchemaError, parked_cure
from apply.lake.dead_letter import ErroredTable, discard, errored_tables, parked_offsets
from apply.lake.driver_merge import DriverTables
from apply.lake.driver_store import DriverStore, driver_store
from apply.lake.known_tables import KnownTables
from apply.lake.retired_log import fold_retired_logs
from apply.lake.spark_merge import transaction_app_id
from apply.lake.tables import table_of_segments, table_of_topic
from apply.lake.upkeep import TableUpkeep
from apply.lanes import DEFAULT_LANE, Lane, checkpoint_of, default_topic_pattern, plan_lanes
from apply.metrics import ApplyMetrics
from apply.reapply import ReapplyOutcome, reapply_app_id, reapply_table
from apply.settings import ApplySettings, KafkaSettings
from runtime.errors import TransientError
from runtime.retry import Backoff, call_with_retry, run_with_retry
from runtime.telemetry import Health
from schemas.control import AppliedProgress, ApplyTableStatus
from schemas.lsn import format_lsn

_TRANSIENT_ATTEMPTS = 3
_BATCH_BACKOFF = Backoff(initial_s=2.0, maximum_s=8.0)

log = logging.getLogger(__name__)


def change_topic_pattern(kafka: KafkaSettings) -> str:
    """Java regex of every change topic: ``<prefix>.<schema>.<table>``, never the control
    or schema topic even when they share the prefix (the default lane's without lanes)."""
    return default_topic_pattern(kafka.topic_prefix, kafka.control_topic, kafka.schema_topic)


def checkpoint_location(settings: ApplySettings) -> str:
    """``<checkpoint_root>/apply``: the checkpoint of the one query the job runs without
    lanes. Its ``txnAppId`` is the writer of every table state that names none (written
    before lanes existed), and the base of ``reapply``'s."""
    return checkpoint_of(settings.lake.checkpoint_root, DEFAULT_LANE)


def lanes_of(settings: ApplySettings) -> tuple[Lane, ...]:
    return plan_lanes(
        settings.lanes,
        topic_prefix=settings.kafka.topic_prefix,
        control_topic=settings.kafka.control_topic,
        schema_topic=settings.kafka.schema_topic,
        checkpoint_root=settings.lake.checkpoint_root,
    )


def replication_lag_s(result: TableResult, now_unix_s: float) -> float | None:
    """Seconds between the newest applied source commit and now: how far the table lags."""
    commit_ts = result.state.commit_ts
    return None if commit_ts is None else max(0.0, now_unix_s - commit_ts / 1_000_000)


def log_results(
    batch_id: int,
    results: list[TableResult],
    started: float,
    parked: tuple[ParkedTable, ...] = (),
) -> None:
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
            extra={
                "table": r.table,
                "batch_id": batch_id,
                "lsn": None if r.state.table_lsn is None else format_lsn(r.state.table_lsn),
            },
        )
    for p in parked:
        log.warning(
            "batch %d table %s: errored, records=%d parked=%d error=%s: %s; cure: %s",
            batch_id,
            p.table,
            p.records,
            p.parked,
            p.error_kind,
            p.error,
            parked_cure(p.error_kind, p.table),
            extra={"table": p.table, "batch_id": batch_id},
        )


def queries_ended(queries: Sequence[StreamingQuery], each_ends: bool) -> bool:
    """Whether the job is over: a query failed, every query ended, or (unless each query
    ends by itself, ``each_ends``) any query ended."""
    ended = [query for query in queries if not query.isActive]
    if any(query.exception() is not None for query in ended):
        return True
    return len(ended) == len(queries) or (bool(ended) and not each_ends)


def _driver_store(lake_root: str, spark: SparkSession) -> DriverStore | None:
    """How the driver's delta-rs reaches the lake, as the job's Hadoop configuration says
    (:mod:`apply.lake.driver_store`); None where only Spark writes it."""
    hadoop: Any = spark.sparkContext._jsc.hadoopConfiguration()  # lives on the JVM only
    store = driver_store(lake_root, hadoop.get)
    if store is None:
        log.info("the lake %s is written by Spark only: delta-rs does not write it", lake_root)
    return store


class ApplyJob:
    def __init__(
        self,
        settings: ApplySettings,
        spark: SparkSession,
        *,
        metrics: ApplyMetrics | None = None,
        health: Health | None = None,
    ) -> None:
        """``metrics``/``health``: what the endpoint serves (a fresh, unserved pair
        when not given)."""
        self._settings = settings
        self._spark = spark
        self.metrics = metrics or ApplyMetrics()
        self.health = health or Health(settings.metrics.not_ready_after_s)
        self.lanes = lanes_of(settings)
        self._catalog = SchemaCatalog(settings.kafka)
        self._catalog_lock = threading.Lock()
        self._publisher = ProgressPublisher(settings.kafka)
        self._publish_lock = threading.Lock()
        # Set by run()'s caller on SIGTERM: the only thing that ends a publish's wait.
        self._stop = threading.Event()
        self._context_id = transaction_app_id(checkpoint_location(settings))
        # The streaming batches' tables only: reapply and discard read from Delta.
        self._known = KnownTables()
        self._store = _driver_store(settings.lake.root, spark)
        self._driver_tables = None if self._store is None else DriverTables(self._store)
        self._app_ids = {lane.name: transaction_app_id(lane.checkpoint) for lane in self.lanes}
        self._checkpoints = {lane.name: lane.checkpoint for lane in self.lanes}
        # A small batch's records read from Kafka in the driver (apply.batch.held_batch).
        self._held = HeldBatchReader(client_conf(settings.kafka) | {"group.id": HELD_GROUP})

    def _context(
        self, app_id: str, *, streaming: bool = False, checkpoint: str | None = None
    ) -> ApplyContext:
        with self._catalog_lock:
            schemas = dict(self._catalog.schemas)
        return ApplyContext(
            self._settings.lake.root,
            app_id,
            schemas,
            parallelism=self._settings.table_parallelism,
            schema_topic=self._settings.kafka.schema_topic,
            default_txn_app_id=self._context_id,
            upkeep=TableUpkeep(
                self._settings.upkeep,
                self.metrics,
                self._store,
                compact_from_driver=self._settings.lake.driver_write_records > 0,
                checked=None if self._driver_tables is None else self._driver_tables.checked,
            ),
            known=self._known if streaming else None,
            driver_write_records=self._settings.lake.driver_write_records,
            driver_tables=self._driver_tables if streaming else None,
            deletion_vectors=self._settings.lake.deletion_vectors,
            checkpoint=checkpoint,
            held_reader=self._held if streaming else None,
        )

    def close(self) -> None:
        """Close the job's Kafka producer; call it once the job is done with (after
        :meth:`run`, ``reapply`` or ``discard``), or use the job as a context manager."""
        with self._publish_lock:
            self._publisher.close()
        self._held.close()

    def __enter__(self) -> ApplyJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _refresh_schemas(self) -> None:
        with self._catalog_lock:
            self._catalog.refresh()

    def _read_schemas_at_start(self, stop: threading.Event) -> bool:
        """Read the schema topic before the queries start, waiting for the broker as
        long as it takes (not ready meanwhile, alive), as capture does: a job started
        during a broker outage comes up by itself once the broker is back, instead of
        exiting for its supervisor to restart it. False when ``stop`` came first."""

        def read() -> None:
            try:
                self._refresh_schemas()
            except TransientError as exc:
                self.health.transient_failure(f"reading the schema topic: {exc}")
                raise

        def pause(seconds: float) -> None:
            stop.wait(seconds)  # a stop ends the wait at once

        run_with_retry(read, should_stop=stop.is_set, sleep=pause)
        return not stop.is_set()

    def _publish(self, messages: Iterable[AppliedProgress | ApplyTableStatus]) -> bool:
        """Publish ``messages`` once the commits they describe are done; wait for the
        broker as long as it takes, not ready meanwhile. False only when the job stops
        first (the next start re-publishes from Delta)."""

        def failed(exc: TransientError) -> None:
            self.health.transient_failure(f"publishing applied progress: {exc}")

        # One producer for every lane: its flush waits for all queued messages, so
        # lanes publish one at a time rather than wait on each other's deliveries.
        with self._publish_lock:
            return self._publisher.publish(
                messages,
                should_stop=self._stop.is_set,
                sleep=self._stop.wait,
                on_failure=failed,
            )

    def on_batch(self, batch: DataFrame, batch_id: int) -> None:
        self.apply(batch, batch_id)

    def apply(self, batch: DataFrame, batch_id: int, lane: str = DEFAULT_LANE) -> BatchResult:
        """The ``foreachBatch`` body of ``lane``'s query: apply, then publish what was
        applied or parked."""
        started = time.monotonic()
        app_id = self._app_ids[lane]

        def attempt() -> BatchResult:
            try:
                return self._apply_loading_schemas(
                    batch, batch_id, app_id, self._checkpoints.get(lane)
                )
            except TransientError as exc:
                self.metrics.batch_failures.inc()
                self.health.transient_failure(str(exc))
                raise

        result = call_with_retry(
            attempt,
            what=f"batch {batch_id}" if lane == DEFAULT_LANE else f"lane {lane} batch {batch_id}",
            attempts=_TRANSIENT_ATTEMPTS,
            backoff=_BATCH_BACKOFF,
        )
        if not self._publish(batch_progress(result)):
            log.warning(
                "batch %d: stopping before its progress reached the control topic; the "
                "next start publishes it from Delta",
                batch_id,
            )
            return result
        self.publish_table_statuses(p.table for p in result.parked if p.parked)
        log_results(batch_id, list(result.applied), started, result.parked)
        self.health.connected()
        self.metrics.batch(result, time.monotonic() - started, time.time(), lane)
        return result

    def _apply_loading_schemas(
        self, batch: DataFrame, batch_id: int, app_id: str, checkpoint: str | None
    ) -> BatchResult:
        try:
            return apply_batch(
                batch, batch_id, self._context(app_id, streaming=True, checkpoint=checkpoint)
            )
        except UnknownSchemaError:
            # Capture flushes a schema before the first record using it: read again.
            # A table whose schema is still missing then is parked, alone.
            self._refresh_schemas()
            return apply_batch(
                batch,
                batch_id,
                self._context(app_id, streaming=True, checkpoint=checkpoint),
                park_missing_schemas=True,
            )

    def publish_table_statuses(self, tables: Iterable[str]) -> None:
        """Publish the errored state and parked count of ``tables`` as the dead-letter
        table holds them now (:mod:`apply.control.table_status`); call it only after the commit
        that changed them."""
        names = sorted(set(tables))
        if not names:
            return
        errored = errored_tables(self._spark, self._context(self._context_id).dead_letter)
        self._publish(table_statuses(names, errored, now_micros()))
        waiting = {table for table, found in errored.items() if found.records > 0}
        self.metrics.errored({*names, *errored}, waiting)

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
        context = self._context(self._context_id, streaming=True)
        states = []
        for status in statuses:
            table_path = status.getPath().getParent()
            schema, table = table_path.getParent().getName(), table_path.getName()
            try:
                table_id = table_of_segments(schema, table)
            except ValueError:
                continue  # not a folder apply writes (the dead-letter table's, say)
            try:
                state = recorded_state(self._spark, table_id, context)
            except TableError as exc:
                # Its records are parked (the dead-letter offsets below cover them).
                log.error("cannot recover the applied state of %s: %s", table_path, exc)  # noqa: TRY400
                continue
            if state is not None:
                states.append(state)
        parked = parked_offsets(self._spark, self._context(self._context_id).dead_letter)
        messages = recovered_progress(states, parked)
        self._publish(messages)
        # Every table that ever parked a record: errored ones and released ones alike,
        # so a status lost between a commit and its publish is put right.
        self.publish_table_statuses(parked)
        return len(messages)

    def errored(self) -> list[ErroredTable]:
        """The errored tables, by name: what ``python -m apply errored`` lists."""
        found = errored_tables(self._spark, self._context(self._context_id).dead_letter)
        return [found[name] for name in sorted(found)]

    def discard(self, table: str, topic: str, partition: int, offset: int) -> bool:
        """Mark one waiting parked record of ``table`` discarded: what ``python -m apply
        discard`` does for a record that can never be applied
        (:func:`apply.lake.dead_letter.discard`). False when no such record waits."""
        discarded = discard(
            self._spark,
            self._context(self._context_id).dead_letter,
            table,
            topic=topic,
            partition=partition,
            offset=offset,
        )
        if discarded:
            self.publish_table_statuses([table])
        return discarded

    def reapply(self, table: str) -> ReapplyOutcome:
        """Re-apply the parked records of ``table`` (``schema.table``) and publish the
        progress of its partitions (:mod:`apply.reapply`)."""
        self._refresh_schemas()
        context = self._context(reapply_app_id(self._context_id))
        # Reapply merges into the table: it must first hold what a retired log holds.
        self.fold_retired_logs()
        try:
            outcome = reapply_table(self._spark, table, context)
        finally:
            # A pass may have released records before a later one failed: the status is
            # published either way, from what the dead-letter table holds now.
            self.publish_table_statuses([table])
        states = {r.topic: r.state for p in outcome.passes for r in p.results}
        if states:
            parked = parked_offsets(self._spark, context.dead_letter)
            self._publish(recovered_progress(list(states.values()), {table: parked.get(table, {})}))
        return outcome

    def fold_retired_logs(self) -> None:
        """Fold what the retired change log left in the lake into the tables
        (:mod:`apply.lake.retired_log`); raises :class:`~apply.errors.RetiredChangeLogError`
        when a log's changes cannot be folded."""
        fold_retired_logs(
            self._spark, lake_root=self._settings.lake.root, default_app_id=self._context_id
        )

    def run(self, stop: threading.Event) -> None:
        """Start every lane's query and wait until ``stop`` is set or a query ends; the
        first query that fails stops the others and its error is raised. ``stop`` also
        ends a publish waiting for the broker (:meth:`_publish`)."""
        self._stop = stop
        if not self._read_schemas_at_start(stop):
            return
        # Before the progress is re-published and the queries start: a logged change
        # counted as applied, so the slot may be past changes only a log holds.
        self.fold_retired_logs()
        republished = self.republish_recorded_progress()
        log.info("re-published %d applied-progress messages from Delta", republished)
        queries: list[tuple[Lane, StreamingQuery]] = []
        try:
            for lane in self.lanes:
                queries.append((lane, self._start(lane)))
                if not lane.is_default:
                    log.info(
                        "lane %s: its own query for %s (checkpoint %s)",
                        lane.name,
                        ", ".join(str(s) for s in lane.selectors),
                        lane.checkpoint,
                    )
            # available_now: each query ends once it has read what was there; otherwise a
            # query that ends has failed or been stopped, and the job ends with it.
            each_ends = self._settings.trigger.mode == "available_now"
            self.health.watch(lambda: not queries_ended([q for _, q in queries], each_ends))
            self.health.connected()
            while not stop.is_set() and not queries_ended([q for _, q in queries], each_ends):
                active = next((q for _, q in queries if q.isActive), None)
                if active is not None:  # else the last one ended just now: asked again
                    active.awaitTermination(1)
        finally:
            for _, query in queries:
                if query.isActive:
                    query.stop()
            self.health.stopped("an apply streaming query has stopped")
        for lane, query in queries:
            error = query.exception()
            if error is not None:
                where = "" if lane.is_default else f" of lane {lane.name}"
                raise RuntimeError(f"the apply query{where} failed: {error}")

    def _start(self, lane: Lane) -> StreamingQuery:
        settings = self._settings
        reader = (
            self._spark.readStream.format("kafka")
            # bootstrap servers and the client properties' Java form (docs/security.md)
            .options(**spark_source_options(settings.kafka))
            .option("subscribePattern", lane.topic_pattern)
            .option("startingOffsets", "earliest")
            # Kept with parked records, for tools that read the dead-letter table.
            .option("includeHeaders", "true")
        )
        if settings.kafka.max_offsets_per_trigger is not None:
            reader = reader.option("maxOffsetsPerTrigger", settings.kafka.max_offsets_per_trigger)

        def on_batch(batch: DataFrame, batch_id: int) -> None:
            self.apply(batch, batch_id, lane.name)

        writer = (
            reader.load()
            .writeStream.foreachBatch(on_batch)
            .option("checkpointLocation", lane.checkpoint)
            .queryName(lane.query_name)
        )
        if settings.trigger.mode == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=settings.trigger.interval)
        # The query's thread inherits the local properties of the thread that starts it:
        # its own jobs (reading the batch, the survey, parking) go to the lane's pool, so
        # under FAIR scheduling a lane's batch does not queue behind another lane's jobs
        # in the shared default pool (each table's work has its own pool, apply.batch.table_pool).
        context = self._spark.sparkContext
        previous = context.getLocalProperty(POOL_PROPERTY)
        context.setLocalProperty(POOL_PROPERTY, lane.pool)
        try:
            return writer.start()
        finally:
            context.setLocalProperty(POOL_PROPERTY, previous)  # type: ignore[arg-type]


__all__ = [
    "ApplyJob",
    "change_topic_pattern",
    "checkpoint_location",
    "lanes_of",
    "queries_ended",
    "table_of_topic",
]
