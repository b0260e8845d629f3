"""Errors of the capture service, classified by what happens next.

Every failure the service can meet maps to one of three outcomes, and the class says
which, so the caller never inspects message strings:

- :class:`TransientError` -- the world may heal (PostgreSQL restarted, a broker is
  unreachable). The retry policy in :mod:`capture.retry` backs off and tries again; the
  replication slot has not moved past anything unpublished, so a retry loses nothing.
- :class:`TableError` -- one table cannot go on until someone acts (no replica
  identity, a schema change the lake cannot follow). That table is parked in the
  ``errored`` state; the others keep streaming.
- :class:`ConfigError` -- the service was started wrong. Fatal at start, with a message
  that says what to change.
- :class:`ProtocolError` -- the server sent bytes this decoder does not understand. The
  service stops without confirming anything past the last good transaction; a restart
  re-reads the same WAL, so the stop loses nothing while the cause is looked at.

Foreign exceptions (psycopg, ``KafkaException``) are translated at the boundary with
``raise X(...) from exc`` so the original stays attached.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base of every error the capture service raises on purpose."""


class TransientError(PipelineError):
    """Retry with backoff: the cause is outside us and may go away."""


class ConfigError(PipelineError):
    """Fatal at start: the settings or the source database need a change."""


class TableError(PipelineError):
    """One table is broken until someone acts; the others go on."""

    def __init__(self, table: str, message: str) -> None:
        super().__init__(f"table {table}: {message}")
        self.table = table


class ProtocolError(PipelineError):
    """The replication stream carried bytes we cannot decode; stop, confirm nothing more."""
