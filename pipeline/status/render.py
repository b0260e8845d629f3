"""The status as text: an aligned table for people, JSON for scripts. Pure."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from capture.errors import SLOT_RESYNC
from pipeline.status.model import PipelineStatus, SlotView, TableView
from schemas.lsn import Lsn, format_lsn

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_NONE = "-"


def size(n: int | None) -> str:
    """Bytes in binary units: ``0 B``, ``512 B``, ``1.5 KiB``, ``3.0 GiB``."""
    if n is None:
        return _NONE
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # the last unit always returns


def duration(seconds: float | None) -> str:
    """``0.4 s``, ``59.9 s``, ``3m05s``, ``2h07m``, ``3d04h``."""
    if seconds is None:
        return _NONE
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _lsn(lsn: Lsn | None) -> str:
    return _NONE if lsn is None else format_lsn(lsn)


def _columns(rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Rows aligned in columns (numbers right-aligned); the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row[:-1])
        ]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


def _slot_line(slot: SlotView) -> str:
    if not slot.exists:
        return (
            f"slot {slot.name}: ABSENT (capture never started, or the slot was dropped: "
            f"{SLOT_RESYNC})"
        )
    state = "active" if slot.active else "inactive"
    if slot.lost:
        state += f", LOST (its WAL is gone: resync the pipeline, {SLOT_RESYNC})"
    return (
        f"slot {slot.name}: {state}, wal_status {slot.wal_status or _NONE}, "
        f"confirmed {_lsn(slot.confirmed_flush_lsn)}, restart {_lsn(slot.restart_lsn)}, "
        f"retained {size(slot.retained_bytes)}, safe_wal_size "
        f"{'unlimited' if slot.safe_wal_size is None else size(slot.safe_wal_size)}"
    )


def _message(table: TableView) -> str:
    parts = []
    if table.snapshot_resume is not None:
        parts.append(
            f"snapshot: blocks before {table.snapshot_resume.block} in Kafka "
            f"(a restart goes on from chunk {table.snapshot_resume.chunk})"
        )
    if table.apply_error:
        parts.append(f"apply: {table.apply_error}")
    if table.capture_message:
        parts.append(f"capture: {table.capture_message}")
    return "; ".join(parts)


_HEADER = (
    "TABLE",
    "CAPTURE",
    "APPLY",
    "APPLIED LSN",
    "LAG",
    "LAG TIME",
    "WAITING",
    "PARKED",
    "MESSAGE",
)
_RIGHT = {4, 5, 6, 7}


def render_text(status: PipelineStatus) -> str:
    """What ``python -m pipeline status`` prints."""
    if not status.capture_started:
        return f"capture has not started yet (no control topic {status.control_topic})"
    lines = [
        _slot_line(status.slot),
        f"server WAL at {format_lsn(status.current_wal_lsn)}",
        "",
    ]
    if not status.tables:
        lines.append("no tables recorded yet")
        return "\n".join(lines)
    rows = [list(_HEADER)]
    for t in status.tables:
        rows.append(
            [
                t.table,
                _NONE if t.capture_state is None else t.capture_state.value,
                "errored" if t.apply_errored else "ok",
                _lsn(t.applied_lsn),
                size(t.lag_bytes),
                duration(t.lag_s),
                str(t.waiting),
                str(t.parked),
                _message(t),
            ]
        )
    lines.extend(_columns(rows, _RIGHT))
    return "\n".join(lines)


def _slot_json(slot: SlotView) -> dict[str, Any]:
    return {
        "name": slot.name,
        "exists": slot.exists,
        "active": slot.active,
        "lost": slot.lost,
        "confirmed_flush_lsn": None
        if slot.confirmed_flush_lsn is None
        else _lsn(slot.confirmed_flush_lsn),
        "restart_lsn": None if slot.restart_lsn is None else _lsn(slot.restart_lsn),
        "retained_bytes": slot.retained_bytes,
        "wal_status": slot.wal_status,
        "safe_wal_size": slot.safe_wal_size,
    }


def _table_json(t: TableView) -> dict[str, Any]:
    return {
        "table": t.table,
        "topic": t.topic,
        "capture_state": None if t.capture_state is None else t.capture_state.value,
        "capture_message": t.capture_message,
        "applied_lsn": None if t.applied_lsn is None else _lsn(t.applied_lsn),
        "lag_bytes": t.lag_bytes,
        "lag_s": t.lag_s,
        "waiting": t.waiting,
        "apply_errored": t.apply_errored,
        "parked": t.parked,
        "apply_error": t.apply_error,
        "errored": t.errored,
        "snapshot_resume": None
        if t.snapshot_resume is None
        else {"chunk": t.snapshot_resume.chunk, "block": t.snapshot_resume.block},
    }


def to_json(status: PipelineStatus) -> dict[str, Any]:
    """The ``--json`` document: LSNs in PostgreSQL's text form, sizes in bytes, lags in
    seconds, null where a value cannot be told."""
    return {
        "healthy": status.healthy,
        "capture_started": status.capture_started,
        "control_topic": status.control_topic,
        "read_at": datetime.fromtimestamp(status.read_at_micros / 1e6, UTC).isoformat(),
        "current_wal_lsn": format_lsn(status.current_wal_lsn),
        "slot": _slot_json(status.slot),
        "tables": [_table_json(t) for t in status.tables],
    }


def render_json(status: PipelineStatus) -> str:
    return json.dumps(to_json(status), indent=2)
