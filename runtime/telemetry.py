"""Metrics and health over HTTP, the same for both services.

One port serves ``/metrics`` (Prometheus text format), ``/healthz`` (the process is
alive: its main loop or query is running) and ``/readyz`` (connected and making
progress: a service that has been retrying a transient failure for longer than
``not_ready_after_s`` is not ready).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MetricsSettings(BaseModel):
    """Where the metrics and health endpoint listens (``<PREFIX>_METRICS__*``)."""

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
