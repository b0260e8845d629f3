"""apply's /metrics, /healthz and /readyz, scraped over HTTP while capture streams real
changes through Kafka into Delta: the numbers move with the changes, and liveness
fails once the streaming query has stopped."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from apply.app import ApplyJob
from apply.metrics import ApplyMetrics
from apply.settings import ApplySettings, LakeSettings, TriggerSettings
from apply.settings import KafkaSettings as ApplyKafka
from runtime.telemetry import Health, MetricsSettings, TelemetryServer
from tests.plugins.capture import CaptureThread, capture_settings, current_lsn
from tests.plugins.services import Services
from tests.plugins.telemetry import scrape, status, value
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]


def test_apply_metrics_move_and_liveness_follows_the_query(
    spark: Any, services: Services, pg: Connection, unique_name: str, tmp_path: Path
) -> None:
    schema = unique_name
    table = f"{schema}.items"
    items = sql.Identifier(schema, "items")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pg.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v text)").format(items))
    runner = CaptureThread(capture_settings(services, unique_name, [table]))
    runner.start(pg)
    settings = ApplySettings(
        kafka=ApplyKafka(
            bootstrap_servers=services.kafka_bootstrap_servers,
            topic_prefix=unique_name,
            control_topic=f"{unique_name}._control",
            schema_topic=f"{unique_name}._schemas",
        ),
        lake=LakeSettings(root=str(tmp_path / "lake"), checkpoint_root=str(tmp_path / "cp")),
        trigger=TriggerSettings(interval="1 second"),
        metrics=MetricsSettings(port=0),
        table_parallelism=1,
    )
    health = Health(settings.metrics.not_ready_after_s)
    metrics = ApplyMetrics(health=health)
    job = ApplyJob(settings, spark, metrics=metrics, health=health)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            job.run(stop)
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)

    server = TelemetryServer(settings.metrics, metrics.registry, health)
    url = server.url
    thread = threading.Thread(target=run, daemon=True)
    try:
        assert status(url, "/readyz") == 503, "ready before the query runs"
        thread.start()
        wait_for(lambda: status(url, "/readyz") == 200 or bool(errors), "apply to be ready", 180)
        assert not errors, errors
        assert status(url, "/healthz") == 200

        def rows(action: str) -> float | None:
            return value(scrape(url), "cdc_apply_rows_total", table=table, action=action)

        # One step at a time: within one batch, changes of a key collapse into its last.
        insert = sql.SQL("INSERT INTO {} SELECT g, 'a' FROM generate_series(1, 40) g")
        pg.execute(insert.format(items))
        wait_for(lambda: rows("inserted") == 40, "40 inserted rows", 180)
        pg.execute(sql.SQL("UPDATE {} SET v = 'b' WHERE id <= 10").format(items))
        wait_for(lambda: rows("updated") == 10, "10 updated rows", 120)
        pg.execute(sql.SQL("DELETE FROM {} WHERE id > 35").format(items))
        last_commit = current_lsn(pg)
        wait_for(lambda: rows("deleted") == 5, "5 deleted rows", 120)

        samples = scrape(url)
        assert value(samples, "cdc_apply_records_total", table=table) == 55
        assert value(samples, "cdc_apply_replays_dropped_total", table=table) == 0
        assert value(samples, "cdc_apply_records_parked_total", table=table) is None
        applied = value(samples, "cdc_apply_applied_lsn_bytes", table=table)
        assert applied is not None
        assert 0 < applied < last_commit  # the DELETE's commit LSN: before the WAL end after it
        lag = value(samples, "cdc_apply_lag_seconds", table=table)
        assert lag is not None
        assert lag >= 0
        batches = value(samples, "cdc_apply_batch_duration_seconds_count", lane="default")
        assert batches is not None
        assert batches >= 3
        assert value(samples, "cdc_apply_errored_tables") == 0
        assert value(samples, "cdc_apply_batch_failures_total") == 0
        assert status(url, "/readyz") == 200
        assert value(scrape(url), "cdc_apply_ready") == 1

        # The query stops (as when it dies): liveness fails at once.
        query = next(q for q in spark.streams.active if q.name == "pgdelta-apply")
        query.stop()
        wait_for(lambda: status(url, "/healthz") == 503, "liveness to fail", 60)
        assert value(scrape(url), "cdc_apply_alive") == 0
        thread.join(60)
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
        job.close()
        server.close()
        runner.close(pg)
