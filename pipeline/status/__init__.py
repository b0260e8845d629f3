"""``python -m pipeline status``: one read-only view of the whole pipeline.

Per table: capture's state, the LSN applied to the lake, the lag (bytes of WAL and
seconds) and the records waiting in Kafka, apply's errored state and parked records;
and the replication slot. Everything comes from the control topic, the change topics'
end offsets and one SQL query, never from Spark or Delta, and nothing is written
(:mod:`pipeline.status.reader`). docs/operations.md, status, describes the output.

- :func:`collect` reads once; :class:`StatusReader` keeps its connections for repeated
  reads (``read()``, ``close()``);
- :func:`main` is the command (argv without the ``status`` word).
"""

from __future__ import annotations

from pipeline.status.command import main
from pipeline.status.errors import StatusConfigError, StatusError
from pipeline.status.model import PipelineStatus, SlotView, TableView
from pipeline.status.reader import StatusReader, collect

__all__ = [
    "PipelineStatus",
    "SlotView",
    "StatusConfigError",
    "StatusError",
    "StatusReader",
    "TableView",
    "collect",
    "main",
]
