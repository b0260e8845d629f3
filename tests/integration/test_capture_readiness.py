"""/readyz follows capture's connection to PostgreSQL: ready while streaming, not ready
once a run of transient failures outlasts ``not_ready_after_s``, ready again after the
reconnect. The connection runs through a TCP proxy the test cuts."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from capture.metrics import CaptureMetrics
from capture.service import CaptureService
from runtime.retry import run_with_retry
from runtime.telemetry import Health, MetricsSettings, TelemetryServer
from tests.plugins.capture import capture_settings, slot_active
from tests.plugins.pipeline import dsn_through
from tests.plugins.services import Services
from tests.plugins.tcp_proxy import Cut, TcpProxy
from tests.plugins.telemetry import scrape, status, value
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def proxy(services: Services) -> Iterator[TcpProxy]:
    info = psycopg.conninfo.conninfo_to_dict(services.postgres_dsn)
    with TcpProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)) as p:
        yield p


def test_readiness_fails_after_the_grace_and_returns_with_the_connection(
    services: Services, pg: Connection, unique_name: str, proxy: TcpProxy
) -> None:
    schema = unique_name
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pg.execute(sql.SQL("CREATE TABLE {}.t (id int PRIMARY KEY)").format(sql.Identifier(schema)))
    base = capture_settings(services, unique_name, [f"{schema}.t"])
    settings = base.model_copy(
        update={
            "postgres": base.postgres.model_copy(
                update={"dsn": dsn_through(services.postgres_dsn, proxy)}
            ),
            "metrics": MetricsSettings(port=0, not_ready_after_s=1.0),
        }
    )
    health = Health(settings.metrics.not_ready_after_s)
    metrics = CaptureMetrics(health=health)
    stop = threading.Event()
    service = CaptureService(settings, stop, metrics=metrics, health=health)
    errors: list[BaseException] = []

    def sleep(seconds: float) -> None:
        stop.wait(seconds)

    def run() -> None:
        try:
            run_with_retry(service.run, should_stop=stop.is_set, sleep=sleep)
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    with TelemetryServer(settings.metrics, metrics.registry, health) as server:
        url = server.url
        thread.start()
        try:
            wait_for(lambda: status(url, "/readyz") == 200 or bool(errors), "ready", 60)
            assert not errors, errors

            proxy.cut(Cut.RESET)
            wait_for(lambda: status(url, "/readyz") == 503, "not ready after the grace", 60)
            assert status(url, "/healthz") == 200, "retrying is alive"
            samples = scrape(url)
            assert value(samples, "cdc_capture_ready") == 0
            transient = value(samples, "cdc_capture_errors_total", kind="TransientError")
            assert transient is not None
            assert transient >= 1

            proxy.restore()
            wait_for(lambda: status(url, "/readyz") == 200, "ready after the reconnect", 120)
            reconnects = value(scrape(url), "cdc_capture_reconnects_total")
            assert reconnects is not None
            assert reconnects >= 1
            assert not errors, errors
        finally:
            stop.set()
            thread.join(30)
            wait_for(lambda: not slot_active(pg, unique_name), "the slot to be released", 30)
            pg.execute("SELECT pg_drop_replication_slot(%s)", [unique_name])
