"""capture's /metrics, /healthz and /readyz, scraped over HTTP while changes flow
through the real PostgreSQL and Kafka: the numbers must move with the changes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from capture.metrics import CaptureMetrics
from capture.service import CaptureService
from capture.settings import CaptureSettings, WalSettings
from capture.source.wal_safety import read_keep_size, read_slot_wal
from runtime.logs import LogSettings
from runtime.telemetry import Health, MetricsSettings, TelemetryServer
from tests.plugins.capture import capture_settings, current_lsn, slot_active, slot_streaming
from tests.plugins.services import Services
from tests.plugins.telemetry import scrape, status, value
from tests.plugins.topics import consume_all, report_applied
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]


@dataclass
class Served:
    settings: CaptureSettings
    table: str
    url: str
    errors: list[BaseException]


@pytest.fixture
def served(services: Services, pg: Connection, unique_name: str) -> Iterator[Served]:
    schema = unique_name
    table = f"{schema}.orders"
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pg.execute(
        sql.SQL("CREATE TABLE {}.orders (id bigint PRIMARY KEY, note text)").format(
            sql.Identifier(schema)
        )
    )
    pg.execute(
        sql.SQL("INSERT INTO {}.orders SELECT g, 'seed' FROM generate_series(1, 1200) g").format(
            sql.Identifier(schema)
        )
    )
    pg.execute(sql.SQL("ANALYZE {}.orders").format(sql.Identifier(schema)))
    base = capture_settings(services, unique_name, [table], snapshot_mode="initial")
    settings = base.model_copy(
        update={
            "metrics": MetricsSettings(port=0),
            # Any retained WAL is over a 1-byte threshold: the warning path runs.
            "wal": WalSettings(warn_retained_bytes=1, check_interval_s=0.2),
            "log": LogSettings(progress_interval_s=0.2),
        }
    )
    health = Health(settings.metrics.not_ready_after_s)
    metrics = CaptureMetrics(health=health)
    stop = threading.Event()
    errors: list[BaseException] = []
    service = CaptureService(settings, stop, metrics=metrics, health=health)

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)

    server = TelemetryServer(settings.metrics, metrics.registry, health)
    thread = threading.Thread(target=run, daemon=True)
    try:
        assert status(server.url, "/readyz") == 503, "ready before connecting"
        thread.start()
        wait_for(lambda: slot_streaming(pg, unique_name) or bool(errors), "the slot to stream", 60)
        # The walsender streams before the service has read START_REPLICATION's answer,
        # so the service says it is connected a moment after.
        wait_for(lambda: status(server.url, "/readyz") == 200 or bool(errors), "capture ready", 60)
        assert not errors, errors
        yield Served(settings, table, server.url, errors)
    finally:
        stop.set()
        thread.join(30)
        server.close()
        deadline = time.monotonic() + 20
        while slot_active(pg, unique_name) and time.monotonic() < deadline:
            time.sleep(0.1)
        pg.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            [unique_name],
        )


def test_capture_metrics_move_as_changes_flow(
    served: Served,
    pg: Connection,
    services: Services,
    unique_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    url, table = served.url, served.table
    assert status(url, "/healthz") == 200
    assert status(url, "/readyz") == 200
    assert value(scrape(url), "cdc_capture_ready") == 1

    # The snapshot: rows done reach the table's rows; the estimate is pg_class.reltuples.
    wait_for(
        lambda: value(scrape(url), "cdc_capture_snapshot_rows", table=table) == 1200,
        "the snapshot's rows",
        60,
    )
    samples = scrape(url)
    assert value(samples, "cdc_capture_snapshot_rows_estimate", table=table) == 1200
    wait_for(
        lambda: value(scrape(url), "cdc_capture_table_state", table=table, state="streaming") == 1,
        "the table to stream",
        60,
    )
    samples = scrape(url)
    assert value(samples, "cdc_capture_records_produced_total", table=table, operation="READ") == (
        1200
    )

    # Changes: decoded and produced counters grow by exactly what was written.
    (schema, name) = table.split(".")
    orders = sql.Identifier(schema, name)
    pg.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'new' FROM generate_series(2001, 2030) g").format(orders)
    )
    pg.execute(sql.SQL("UPDATE {} SET note = 'changed' WHERE id <= 7").format(orders))
    pg.execute(sql.SQL("DELETE FROM {} WHERE id BETWEEN 10 AND 14").format(orders))
    written_to = current_lsn(pg)

    expected = {"INSERT": 30, "UPDATE": 7, "DELETE": 5}

    def counted(name: str) -> dict[str, float | None]:
        samples = scrape(url)
        return {op: value(samples, name, table=table, operation=op) for op in expected}

    wait_for(
        lambda: counted("cdc_capture_records_produced_total") == expected, "produced counts", 60
    )
    assert counted("cdc_capture_changes_decoded_total") == expected
    samples = scrape(url)
    produced_bytes = value(samples, "cdc_capture_produced_bytes_total", table=table)
    assert produced_bytes is not None
    assert produced_bytes > 0
    received = value(samples, "cdc_capture_received_lsn_bytes")
    assert received is not None
    assert received >= written_to - 1  # at least the last commit's end
    in_flight = value(samples, "cdc_capture_in_flight_records")
    assert in_flight is not None
    assert in_flight > 0  # nothing is applied yet: no apply runs in this test
    confirmed_before = value(samples, "cdc_capture_confirmed_lsn_bytes")
    assert confirmed_before is not None
    assert confirmed_before < written_to

    # The WAL watch: the slot retains WAL, its status is reserved, the warning fired.
    wait_for(
        lambda: (value(scrape(url), "cdc_capture_slot_retained_wal_bytes") or 0) > 0,
        "retained WAL",
        60,
    )
    samples = scrape(url)
    assert value(samples, "cdc_capture_slot_wal_status", status="reserved") == 1
    assert value(samples, "cdc_capture_slot_wal_status", status="lost") == 0
    assert value(samples, "cdc_capture_slot_retained_wal_warn_bytes") == 1
    keep = value(samples, "cdc_capture_max_slot_wal_keep_size_bytes")
    assert keep == read_keep_size(pg)
    age = value(samples, "cdc_capture_keepalive_age_seconds")
    assert age is not None
    assert age >= 0
    wait_for(
        lambda: any("over the 1-byte warning threshold" in r.getMessage() for r in caplog.records),
        "the retained-WAL warning",
        60,
    )

    # Applied (as apply would report it): the confirmed LSN advances past the writes.
    messages = consume_all(services.kafka_bootstrap_servers, [f"{unique_name}.{table}"], 1242)
    assert len(messages) == 1242
    report_applied(services.kafka_bootstrap_servers, served.settings.kafka.control_topic, messages)
    wait_for(
        lambda: (value(scrape(url), "cdc_capture_confirmed_lsn_bytes") or 0) >= written_to - 1,
        "the confirmed LSN to pass the writes",
        60,
    )
    assert value(scrape(url), "cdc_capture_in_flight_records") == 0
    # The periodic progress line and the snapshot's (interval 0.2 s in this test).
    wait_for(
        lambda: any(r.getMessage().startswith("progress: ") for r in caplog.records),
        "a progress line",
        60,
    )
    assert not served.errors


def test_wal_facts_read_from_the_real_server(pg: Connection, unique_name: str) -> None:
    """The queries of the WAL watch against the server: a fresh slot reserves WAL."""
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [unique_name])
    try:
        pg.execute("SELECT pg_logical_emit_message(false, 'test', 'x')")
        reading = read_slot_wal(pg, unique_name)
        assert reading is not None
        assert reading.wal_status == "reserved"
        assert reading.retained_bytes is not None
        assert reading.retained_bytes > 0
        keep = read_keep_size(pg)
        assert (reading.safe_wal_size is None) == (keep < 0)
        assert read_slot_wal(pg, f"{unique_name}_missing") is None
    finally:
        pg.execute("SELECT pg_drop_replication_slot(%s)", [unique_name])
