"""Errors of the capture service, classified by what happens next.

The classes are the shared ones of :mod:`runtime.errors`, plus :class:`ProtocolError`;
what each means for capture:

- :class:`TransientError` -- the world may heal (PostgreSQL restarted, a broker is
  unreachable). The retry policy in :mod:`runtime.retry` backs off and tries again; the
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

from runtime.errors import ConfigError, PipelineError, TableError, TransientError

__all__ = [
    "SLOT_RESYNC",
    "ConfigError",
    "PipelineError",
    "ProtocolError",
    "TableError",
    "TransientError",
    "with_resync_cure",
]

SLOT_RESYNC = "docs/operations.md, resync after a lost slot"
"""Where the one procedure for a slot capture cannot trust (lost, dropped, advanced past
its checkpoint) is written; every message about such a slot points there."""


def slot_resync(drop: str | None = None) -> str:
    """The resync of the whole pipeline, in short, and where it is written in full;
    ``drop``: the slot to drop first (None when it is already gone)."""
    dropped = "" if drop is None else f"SELECT pg_drop_replication_slot('{drop}'); "
    return (
        f"stop capture and apply; {dropped}delete the lake and every checkpoint of apply's "
        "queries (apply and apply-* under APPLY_LAKE__CHECKPOINT_ROOT, one per lane); delete "
        "this pipeline's change, schema and control topics; start capture "
        "(CAPTURE_SNAPSHOT_MODE=initial snapshots every table anew), then apply "
        f"({SLOT_RESYNC})"
    )


class ProtocolError(PipelineError):
    """The replication stream carried bytes we cannot decode; stop, confirm nothing more."""


def with_resync_cure(table: str, message: str) -> str:
    """An errored table's message with the cure that releases it: a capture restart alone
    keeps the table errored; only a resync, which takes effect at the next start, streams
    it again. Messages that already name the resync are left as they are."""
    if "python -m capture resync" in message:
        return message
    return (
        f"{message}; once the cause is fixed: python -m capture resync {table}, then restart "
        "capture (docs/capture.md, resync of an errored table)"
    )
