"""``python -m pipeline verify``: prove that the lake equals the source (docs/verify.md).

``verify_tables(capture_settings, apply_settings, spark, tables=None, *, rounds=...,
timeout_s=...)`` returns a :class:`VerifyReport`; ``command.main`` is the command line.
"""

from pipeline.verify.report import TableReport, TableStatus, VerifyReport
from pipeline.verify.rounds import verify_tables

__all__ = ["TableReport", "TableStatus", "VerifyReport", "verify_tables"]
