"""What verify found, per table, and its two printed forms: a human table and JSON.

A table is OK when no key is missing, extra, different or still changing, it is not
errored in apply, and nothing stopped its comparison. Counts are always complete;
sample keys are capped (``--max-keys``) and printed as their canonical key text
(the key columns' canonical forms joined by commas, docs/verify.md).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.verify.compare import REPORTED, Outcome


class TableStatus(enum.Enum):
    OK = "ok"
    DIFFERENT = "different"
    ERRORED = "errored"
    """Apply parked the table's records (dead-letter table); differences follow."""
    FAILED = "failed"
    """The comparison could not be made (message in :attr:`TableReport.error`)."""


@dataclass
class KeyCount:
    count: int = 0
    sample: list[str] = field(default_factory=list)


@dataclass
class TableReport:
    table: str
    keys: dict[Outcome, KeyCount] = field(default_factory=dict)
    verify_points: list[str] = field(default_factory=list)
    """The verify point of each round the table took part in."""
    lake_versions: list[int] = field(default_factory=list)
    """The Delta version read in each of those rounds."""
    errored: str | None = None
    """Apply's error for an errored table."""
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    no_lake_table: bool = False

    @property
    def rounds(self) -> int:
        return len(self.verify_points)

    def count(self, outcome: Outcome) -> int:
        found = self.keys.get(outcome)
        return 0 if found is None else found.count

    @property
    def differences(self) -> int:
        return sum(self.count(outcome) for outcome in REPORTED)

    @property
    def status(self) -> TableStatus:
        if self.error is not None:
            return TableStatus.FAILED
        if self.errored is not None:
            return TableStatus.ERRORED
        return TableStatus.DIFFERENT if self.differences else TableStatus.OK

    @property
    def ok(self) -> bool:
        return self.status is TableStatus.OK

    def add(
        self, outcome: Outcome, keys: Sequence[str], max_keys: int, *, count: int | None = None
    ) -> None:
        """Count ``keys`` (or ``count`` keys of which ``keys`` are a sample)."""
        total = len(keys) if count is None else count
        if not total:
            return
        found = self.keys.setdefault(outcome, KeyCount())
        found.count += total
        room = max_keys - len(found.sample)
        found.sample.extend(sorted(keys)[: max(room, 0)])

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "status": self.status.value,
            "ok": self.ok,
            **{
                outcome.value: {"count": self.count(outcome), "sample": self._sample(outcome)}
                for outcome in REPORTED
            },
            "verify_points": self.verify_points,
            "lake_versions": self.lake_versions,
            "rounds": self.rounds,
            "no_lake_table": self.no_lake_table,
            "errored": self.errored,
            "error": self.error,
            "notes": self.notes,
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def _sample(self, outcome: Outcome) -> list[str]:
        found = self.keys.get(outcome)
        return [] if found is None else list(found.sample)


@dataclass
class VerifyReport:
    tables: list[TableReport]
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(table.ok for table in self.tables)

    def table(self, name: str) -> TableReport:
        return next(table for table in self.tables if table.table == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "elapsed_s": round(self.elapsed_s, 3),
            "tables": [table.to_json() for table in self.tables],
        }


_HINTS = {
    Outcome.MISSING: "in the source, not in the lake",
    Outcome.EXTRA: "in the lake, not in the source",
    Outcome.DIFFERENT: "values differ",
    Outcome.CHANGING: (
        "written again after every verify point: the table kept changing; run verify again "
        "when the workload is quieter, or with more --rounds"
    ),
}


def format_json(report: VerifyReport) -> str:
    return json.dumps(report.to_json(), indent=2)


def format_human(report: VerifyReport) -> str:
    lines = []
    for table in report.tables:
        versions = ", ".join(map(str, table.lake_versions)) or "-"
        points = ", ".join(table.verify_points) or "-"
        lines.append(
            f"{table.table}: {table.status.value.upper()} (verify point {points}; lake version "
            f"{versions}; {table.rounds} round(s); {table.elapsed_s:.1f} s)"
        )
        if table.errored is not None:
            lines.append(f"  errored in apply: {table.errored}")
        if table.error is not None:
            lines.append(f"  not compared: {table.error}")
        if table.no_lake_table:
            lines.append("  no Delta table under the lake root: every source row is missing")
        for outcome in REPORTED:
            found = table.keys.get(outcome)
            if found is None or not found.count:
                continue
            lines.append(f"  {outcome.value}: {found.count} key(s), {_HINTS[outcome]}")
            shown = ", ".join(found.sample)
            more = f" (first {len(found.sample)})" if len(found.sample) < found.count else ""
            lines.append(f"    keys{more}: {shown}")
        lines.extend(f"  note: {note}" for note in table.notes)
    verdict = "OK: the lake equals the source" if report.ok else "DIFFERENCES FOUND"
    lines.append(f"{verdict} ({len(report.tables)} table(s), {report.elapsed_s:.1f} s)")
    return "\n".join(lines)
