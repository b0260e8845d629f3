"""How ``python -m pipeline status`` prints: units, alignment, JSON (pure)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipeline.status.model import PipelineStatus, SlotView, TableView
from pipeline.status.render import duration, render_json, render_text, size
from schemas.control import SnapshotResume, TableState
from schemas.lsn import Lsn

SLOT = SlotView(
    name="cdc_slot",
    exists=True,
    active=True,
    confirmed_flush_lsn=Lsn(0x3000148),
    restart_lsn=Lsn(0x3000110),
    retained_bytes=3 * 1024 * 1024,
    wal_status="reserved",
    safe_wal_size=None,
)
ORDERS = TableView(
    table="public.orders",
    topic="cdc.public.orders",
    capture_state=TableState.STREAMING,
    capture_message=None,
    applied_lsn=Lsn(0x3000100),
    lag_bytes=1536,
    lag_s=2.25,
    waiting=42,
    apply_errored=False,
    parked=0,
    apply_error=None,
)
ITEMS = TableView(
    table="public.items",
    topic="cdc.public.items",
    capture_state=TableState.STREAMING,
    capture_message=None,
    applied_lsn=None,
    lag_bytes=None,
    lag_s=None,
    waiting=0,
    apply_errored=True,
    parked=3,
    apply_error="SchemaChangeError: column amount changed type",
)


def status(*tables: TableView, slot: SlotView = SLOT, started: bool = True) -> PipelineStatus:
    return PipelineStatus(
        "cdc._control", started, 1_700_000_000_000_000, Lsn(0x3000180), slot, tables
    )


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 * 1024**3, "5.0 GiB"),
        (2 * 1024**6, "2048.0 PiB"),
    ],
)
def test_sizes_are_in_binary_units(n: int | None, text: str) -> None:
    assert size(n) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.0, "0.0 s"),
        (59.94, "59.9 s"),
        (185, "3m05s"),
        (7620, "2h07m"),
        (273600, "3d04h"),
    ],
)
def test_durations_are_short(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_the_table_is_aligned_with_numbers_on_the_right() -> None:
    assert render_text(status(ITEMS, ORDERS)).splitlines() == [
        "slot cdc_slot: active, wal_status reserved, confirmed 0/3000148, restart 0/3000110, "
        "retained 3.0 MiB, safe_wal_size unlimited",
        "server WAL at 0/3000180",
        "",
        "TABLE          CAPTURE    APPLY    APPLIED LSN      LAG  LAG TIME  WAITING  PARKED  "
        "MESSAGE",
        "public.items   streaming  errored  -                  -         -        0       3  "
        "apply: SchemaChangeError: column amount changed type",
        "public.orders  streaming  ok       0/3000100    1.5 KiB     2.2 s       42       0",
    ]


def test_capture_not_started_and_an_absent_or_lost_slot_are_said_plainly() -> None:
    assert render_text(status(started=False)) == (
        "capture has not started yet (no control topic cdc._control)"
    )
    absent = SlotView("cdc_slot", False, False, None, None, None, None, None)
    assert (
        render_text(status(slot=absent))
        .splitlines()[0]
        .startswith("slot cdc_slot: ABSENT (capture never started, or the slot was dropped: ")
    )
    lost = SlotView("cdc_slot", True, False, Lsn(1), None, None, "lost", 0)
    assert "LOST" in render_text(status(slot=lost)).splitlines()[0]
    assert render_text(status()).splitlines()[-1] == "no tables recorded yet"


def test_health_follows_errored_tables_and_the_slot() -> None:
    assert status(ORDERS).healthy
    assert not status(ORDERS, ITEMS).healthy
    capture_errored = replace(ORDERS, capture_state=TableState.ERRORED)
    assert not status(capture_errored).healthy
    assert not status(
        ORDERS, slot=SlotView("s", True, True, None, None, None, "lost", None)
    ).healthy
    assert not status(
        ORDERS, slot=SlotView("s", False, False, None, None, None, None, None)
    ).healthy
    assert not status(started=False).healthy


def test_json_has_lsns_as_text_sizes_in_bytes_and_nulls_where_unknown() -> None:
    document = json.loads(render_json(status(ITEMS, ORDERS)))
    assert document["healthy"] is False
    assert document["current_wal_lsn"] == "0/3000180"
    assert document["read_at"] == "2023-11-14T22:13:20+00:00"
    assert document["slot"] == {
        "name": "cdc_slot",
        "exists": True,
        "active": True,
        "lost": False,
        "confirmed_flush_lsn": "0/3000148",
        "restart_lsn": "0/3000110",
        "retained_bytes": 3 * 1024 * 1024,
        "wal_status": "reserved",
        "safe_wal_size": None,
    }
    items, orders = document["tables"]
    assert orders == {
        "table": "public.orders",
        "topic": "cdc.public.orders",
        "capture_state": "streaming",
        "capture_message": None,
        "applied_lsn": "0/3000100",
        "lag_bytes": 1536,
        "lag_s": 2.25,
        "waiting": 42,
        "apply_errored": False,
        "parked": 0,
        "apply_error": None,
        "errored": False,
        "snapshot_resume": None,
    }
    assert (items["applied_lsn"], items["lag_s"], items["parked"], items["errored"]) == (
        None,
        None,
        3,
        True,
    )


def test_a_snapshot_in_progress_says_where_a_restart_would_go_on() -> None:
    snapshotting = replace(
        ORDERS, capture_state=TableState.SNAPSHOT, snapshot_resume=SnapshotResume(4, 920)
    )
    text = render_text(status(snapshotting))
    assert "snapshot: blocks before 920 in Kafka (a restart goes on from chunk 4)" in text
    (table,) = json.loads(render_json(status(snapshotting)))["tables"]
    assert table["snapshot_resume"] == {"chunk": 4, "block": 920}
    (plain,) = json.loads(render_json(status(ORDERS)))["tables"]
    assert plain["snapshot_resume"] is None
