"""Metrics and health over HTTP, the same for both services.

One port serves ``/metrics`` (Prometheus text format), ``/healthz`` (the process is
alive: its main loop or query is running) and ``/readyz`` (connected and making
progress: a service that has been retrying a transient failure for longer than
``not_ready_after_s`` is not ready).

Invariants:

- Each service builds its own :class:`~prometheus_client.CollectorRegistry`; nothing is
  registered in prometheus_client's global one, so a test process can run several
  services side by side and scrape each on its own port.
- The server runs in one daemon thread and only *reads*: the registry's collectors and
  :class:`Health`. The services update both from their own threads; :class:`Health`
  takes a lock for every change, so a probe never sees half an update.
- Readiness is a pure rule (:func:`readiness`) over a few facts and a clock, so it is
  unit-tested without sockets or time passing. A service is not ready before its first
  connection; once connected, a transient failure keeps it ready while the retries are
  younger than ``not_ready_after_s`` (a broker restart should not pull a pod out of
  its Service), and not ready after that until a connection succeeds again.
- ``enabled=False`` starts no server and opens no port; the metrics are still counted
  (the objects exist either way), so no code path depends on the setting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field

from runtime.errors import ConfigError

log = logging.getLogger(__name__)


class MetricsSettings(BaseModel):
    """Where the metrics and health endpoint listens (``CAPTURE_METRICS__*``,
    ``APPLY_METRICS__*``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="serve /metrics, /healthz and /readyz over HTTP")
    host: str = Field(
        "127.0.0.1", description="address to listen on (0.0.0.0 in a container or pod)"
    )
    port: int = Field(9108, ge=0, le=65535, description="port to listen on (0: any free port)")
    not_ready_after_s: float = Field(
        120.0,
        gt=0,
        description="a transient failure retried for longer than this makes /readyz fail",
    )


def readiness(
    *,
    ever_connected: bool,
    failing_since: float | None,
    now: float,
    not_ready_after_s: float,
) -> str | None:
    """Why the service is not ready, or None when it is.

    ``failing_since`` is when the current run of transient failures began (None while
    connected and healthy)."""
    if not ever_connected:
        return "not connected yet"
    if failing_since is not None and now - failing_since > not_ready_after_s:
        return f"retrying a transient failure for {now - failing_since:.0f}s"
    return None


@dataclass(frozen=True, slots=True)
class MetricDoc:
    """One metric as docs/operations.md lists it."""

    name: str
    """As a scrape shows it: counters end in ``_total``."""
    kind: str
    labels: tuple[str, ...]
    help: str


class MetricSet:
    """A service's metrics: one registry of its own, and the reference of every metric
    made through it (what docs/operations.md lists, checked by a test)."""

    def __init__(
        self,
        prefix: str,
        registry: CollectorRegistry | None = None,
        *,
        health: Health | None = None,
    ) -> None:
        """``health``: also expose its probes' answers (``<prefix>alive``, ``_ready``)."""
        self.prefix = prefix
        self.registry = registry or CollectorRegistry()
        self.reference: list[MetricDoc] = []
        if health is not None:
            self.custom(
                HealthCollector(health, prefix),
                [
                    MetricDoc(f"{prefix}alive", "gauge", (), "1 while /healthz answers 200"),
                    MetricDoc(f"{prefix}ready", "gauge", (), "1 while /readyz answers 200"),
                ],
            )

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        self._doc(f"{self.prefix}{name}", "gauge", labels, documentation)
        return Gauge(f"{self.prefix}{name}", documentation, labels, registry=self.registry)

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        self._doc(f"{self.prefix}{name}_total", "counter", labels, documentation)
        return Counter(f"{self.prefix}{name}", documentation, labels, registry=self.registry)

    def histogram(
        self, name: str, documentation: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        self._doc(f"{self.prefix}{name}", "histogram", labels, documentation)
        return Histogram(
            f"{self.prefix}{name}",
            documentation,
            labels,
            registry=self.registry,
            buckets=buckets,
        )

    def custom(self, collector: Collector, docs: Iterable[MetricDoc]) -> None:
        """A collector of our own (values read at scrape time), with what it exposes."""
        self.registry.register(collector)
        self.reference.extend(docs)

    def names(self) -> set[str]:
        """Every metric name this set's registry exposes, as Prometheus sees them."""
        return metric_names(self.registry)

    def _doc(self, name: str, kind: str, labels: Sequence[str], documentation: str) -> None:
        self.reference.append(MetricDoc(name, kind, tuple(labels), documentation))


def reference_table(docs: Iterable[MetricDoc]) -> str:
    """The Markdown table docs/operations.md holds for ``docs``."""
    lines = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    lines += [
        f"| `{d.name}` | {d.kind} | {', '.join(d.labels) or '-'} | {d.help} |"
        for d in sorted(docs, key=lambda d: d.name)
    ]
    return "\n".join(lines) + "\n"


def metric_names(registry: CollectorRegistry) -> set[str]:
    """Every name a scrape of ``registry`` can show: the samples it has now, and each
    family's name (with ``_total`` for a counter) so a labelled metric that has no
    series yet still counts."""
    names: set[str] = set()
    for family in registry.collect():
        names.update(sample.name for sample in family.samples)
        names.add(family.name + ("_total" if family.type == "counter" else ""))
        if family.type == "histogram":
            names.update(f"{family.name}_{suffix}" for suffix in ("bucket", "count", "sum"))
    return names


class Health:
    """What a service tells its probes: updated by the service, read by the server.

    ``alive`` is asked on every ``/healthz``: capture answers whether its loop still
    runs, apply whether its streaming query is active."""

    def __init__(
        self,
        not_ready_after_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._not_ready_after_s = not_ready_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ever_connected = False
        self._failing_since: float | None = None
        self._last_failure: str | None = None
        self._alive: Callable[[], bool] = lambda: True
        self._stopped: str | None = None

    def connected(self) -> None:
        """A connection (or a batch) succeeded: any run of failures is over."""
        with self._lock:
            self._ever_connected = True
            self._failing_since = None
            self._last_failure = None

    def transient_failure(self, reason: str) -> None:
        """A transient failure is being retried; the first of a run starts the clock."""
        with self._lock:
            if self._failing_since is None:
                self._failing_since = self._clock()
            self._last_failure = reason

    def watch(self, alive: Callable[[], bool]) -> None:
        """Ask ``alive`` on every liveness probe from now on."""
        with self._lock:
            self._alive = alive

    def stopped(self, reason: str) -> None:
        """The service's loop or query has ended: not alive any more."""
        with self._lock:
            self._stopped = reason

    def liveness(self) -> str | None:
        """Why the service is not alive, or None when it is."""
        with self._lock:
            stopped, alive = self._stopped, self._alive
        if stopped is not None:
            return stopped
        try:
            return None if alive() else "the service's main loop or query is not running"
        except Exception as exc:  # a probe answers, it never raises
            return f"liveness check failed: {type(exc).__name__}"

    def readiness(self) -> str | None:
        """Why the service is not ready, or None when it is (:func:`readiness`)."""
        with self._lock:
            reason = readiness(
                ever_connected=self._ever_connected,
                failing_since=self._failing_since,
                now=self._clock(),
                not_ready_after_s=self._not_ready_after_s,
            )
            last = self._last_failure
        if reason is not None and last is not None:
            return f"{reason}: {last}"
        return reason


class HealthCollector(Collector):
    """``<prefix>alive`` and ``<prefix>ready`` (1 or 0) at scrape time: the probes'
    answers as series, so an alert can say how long a service has not been ready."""

    def __init__(self, health: Health, prefix: str) -> None:
        self._health = health
        self._prefix = prefix

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(f"{self._prefix}alive", "1 while /healthz answers 200"),
            GaugeMetricFamily(f"{self._prefix}ready", "1 while /readyz answers 200"),
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        alive, ready = self._families()
        alive.add_metric([], 1 if self._health.liveness() is None else 0)
        ready.add_metric([], 1 if self._health.readiness() is None else 0)
        yield alive
        yield ready

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return self._families()


def _handler(registry: CollectorRegistry, health: Health) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._probe(health.liveness())
            elif path == "/readyz":
                self._probe(health.readiness())
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n")

        def _probe(self, reason: str | None) -> None:
            if reason is None:
                self._send(200, b"ok\n")
            else:
                self._send(503, f"{reason}\n".encode())

        def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # A probe every few seconds would drown the service's own log lines.
            return

    return Handler


class TelemetryServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one port, in a daemon thread."""

    def __init__(
        self,
        settings: MetricsSettings,
        registry: CollectorRegistry,
        health: Health,
        *,
        env_prefix: str = "",
    ) -> None:
        """``env_prefix``: the service's (``CAPTURE_``, ``APPLY_``), for the message that
        names the setting to change when the port is taken."""
        try:
            self._server = ThreadingHTTPServer(
                (settings.host, settings.port), _handler(registry, health)
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {settings.host}:{settings.port}: {exc.strerror}; "
                f"set {env_prefix}METRICS__PORT to a free port (0: any) or "
                f"{env_prefix}METRICS__ENABLED=false"
            ) from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="telemetry", daemon=True
        )
        self._thread.start()
        log.info("metrics and health at %s (/metrics, /healthz, /readyz)", self.url)

    @property
    def port(self) -> int:
        """The bound port (the one the system chose when the settings said 0)."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> TelemetryServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve(
    settings: MetricsSettings, registry: CollectorRegistry, health: Health, *, env_prefix: str
) -> TelemetryServer | None:
    """Start the endpoint, or nothing when ``settings.enabled`` is false. ``env_prefix``:
    the service's, which the message about a taken port names its settings with."""
    if not settings.enabled:
        return None
    return TelemetryServer(settings, registry, health, env_prefix=env_prefix)
