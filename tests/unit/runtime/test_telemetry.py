"""The metrics/health endpoint: the readiness rule over a fake clock, the probes and
/metrics over a real loopback socket, and the endpoint's settings."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from runtime.errors import ConfigError
from runtime.telemetry import Health, MetricsSettings, metric_names, readiness, serve


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


@pytest.mark.parametrize(
    ("ever_connected", "failing_since", "ready"),
    [
        (False, None, False),  # starting: not connected yet
        (False, 990.0, False),  # never connected, failing
        (True, None, True),
        (True, 950.0, True),  # failing for 50 s of the 60 allowed
        (True, 940.0, True),  # exactly 60 s: still within the bound
        (True, 939.0, False),  # 61 s
    ],
)
def test_readiness_rule(ever_connected: bool, failing_since: float | None, ready: bool) -> None:
    reason = readiness(
        ever_connected=ever_connected,
        failing_since=failing_since,
        now=1000.0,
        not_ready_after_s=60.0,
    )
    assert (reason is None) == ready


def test_a_run_of_failures_is_timed_from_its_first_and_ends_with_a_connection() -> None:
    clock = FakeClock()
    health = Health(60.0, clock=clock)
    assert health.readiness() == "not connected yet"
    health.connected()
    assert health.readiness() is None
    health.transient_failure("cannot connect to PostgreSQL")
    clock.now += 40
    health.transient_failure("cannot connect to PostgreSQL again")  # same run: clock kept
    clock.now += 30
    reason = health.readiness()
    assert reason is not None
    assert "retrying a transient failure for 70s" in reason
    assert "again" in reason  # the latest failure says why
    health.connected()
    assert health.readiness() is None
    clock.now += 1000
    health.transient_failure("broke")  # a new run starts the clock anew
    assert health.readiness() is None


def test_liveness_asks_the_service_and_ends_with_stopped() -> None:
    health = Health(60.0)
    assert health.liveness() is None
    running = [True]
    health.watch(lambda: running[0])
    assert health.liveness() is None
    running[0] = False
    assert health.liveness() is not None

    def broken() -> bool:
        raise RuntimeError("py4j is gone")

    health.watch(broken)
    assert health.liveness() == "liveness check failed: RuntimeError"
    health.watch(lambda: True)
    health.stopped("capture has stopped")
    assert health.liveness() == "capture has stopped"


def test_the_endpoint_serves_metrics_and_probes_on_a_free_port() -> None:
    registry = CollectorRegistry()
    Counter("cdc_test_things", "things", registry=registry).inc(3)
    clock = FakeClock()
    health = Health(10.0, clock=clock)
    server = serve(MetricsSettings(port=0), registry, health, env_prefix="APPLY_")
    assert server is not None
    try:
        assert server.port > 0
        status, body = get(f"{server.url}/metrics")
        assert status == 200
        assert "cdc_test_things_total 3.0" in body
        assert get(f"{server.url}/healthz") == (200, "ok\n")
        assert get(f"{server.url}/readyz") == (503, "not connected yet\n")
        health.connected()
        assert get(f"{server.url}/readyz") == (200, "ok\n")
        health.transient_failure("kafka unreachable")
        clock.now += 11
        status, body = get(f"{server.url}/readyz")
        assert status == 503
        assert "kafka unreachable" in body
        health.stopped("stopped")
        assert get(f"{server.url}/healthz")[0] == 503
        assert get(f"{server.url}/nothing")[0] == 404
    finally:
        server.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_disabled_means_no_server() -> None:
    assert (
        serve(MetricsSettings(enabled=False), CollectorRegistry(), Health(1.0), env_prefix="")
        is None
    )


def test_a_taken_port_is_a_config_error_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as raised:
            serve(MetricsSettings(port=port), CollectorRegistry(), Health(1.0), env_prefix="APPLY_")
    message = str(raised.value)
    assert "set APPLY_METRICS__PORT to a free port (0: any) or APPLY_METRICS__ENABLED=false" in (
        message
    )
    assert "<" not in message


def test_metric_names_include_series_not_born_yet() -> None:
    registry = CollectorRegistry()
    Counter("cdc_test_errors", "errors", ["kind"], registry=registry)
    Histogram("cdc_test_duration_seconds", "d", ["table"], registry=registry)
    names = metric_names(registry)
    assert {
        "cdc_test_errors_total",
        "cdc_test_duration_seconds_bucket",
        "cdc_test_duration_seconds_count",
        "cdc_test_duration_seconds_sum",
    } <= names
