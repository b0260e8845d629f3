"""Errors both services raise, classified by what happens next.

Every failure maps to one outcome, and the class says which, so no caller inspects
message strings, and readiness (:mod:`runtime.telemetry`) and retries
(:mod:`runtime.retry`) key on the class alone:

- :class:`TransientError` -- the world may heal (a server restarted, a broker is
  unreachable): back off and try again. Nothing is lost by the retry: capture never
  confirmed a slot position past anything unpublished, and a retried apply batch is
  idempotent.
- :class:`TableError` -- one table cannot go on until someone acts; that table is set
  aside (capture: the ``errored`` state; apply: records parked in the dead-letter table)
  while the others go on.
- :class:`ConfigError` -- the service was started wrong: fatal, with what to change.

Each service adds its own subclasses (``capture.errors``, ``apply.errors``). Foreign
exceptions (psycopg, ``KafkaException``, Py4J/Delta) are translated at the boundary
with ``raise X(...) from exc`` so the original stays attached.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error the services raise on purpose."""


class TransientError(PipelineError):
    """Retry with backoff: the cause is outside us and may go away."""


class ConfigError(PipelineError):
    """Fatal at start: the settings, the source database or the topics need a change."""


class TableError(PipelineError):
    """One table is broken until someone acts; the others go on."""

    def __init__(self, table: str, message: str) -> None:
        super().__init__(f"table {table}: {message}")
        self.table = table
