"""WAL safety rules over readings of pg_replication_slots, without a server."""

from __future__ import annotations

import logging

import pytest

from capture.errors import ConfigError
from capture.metrics import CaptureMetrics
from capture.source.wal_safety import SlotWal, assess, check, slot_lost_error, warn_if_unlimited


def test_assess_flags_lost_and_over_threshold() -> None:
    assert assess(SlotWal(100, "reserved", None), 1000) == assess(SlotWal(100, "extended", 5), 0)
    found = assess(SlotWal(2000, "unreserved", 0), 1000)
    assert found.over_threshold
    assert not found.lost
    assert assess(SlotWal(None, "lost", None), 1000).lost
    assert not assess(SlotWal(10**15, "reserved", None), 0).over_threshold  # 0: never warn


def test_a_reading_goes_to_the_metrics() -> None:
    metrics = CaptureMetrics()
    check(SlotWal(4096, "extended", 1024), slot="s", warn_retained_bytes=0, metrics=metrics)
    assert metrics.registry.get_sample_value("cdc_capture_slot_retained_wal_bytes") == 4096
    assert metrics.registry.get_sample_value("cdc_capture_slot_safe_wal_size_bytes") == 1024
    statuses = {
        status: metrics.registry.get_sample_value("cdc_capture_slot_wal_status", {"status": status})
        for status in ("reserved", "extended", "unreserved", "lost")
    }
    assert statuses == {"reserved": 0, "extended": 1, "unreserved": 0, "lost": 0}
    check(SlotWal(1, "reserved", None), slot="s", warn_retained_bytes=0, metrics=metrics)
    assert metrics.registry.get_sample_value("cdc_capture_slot_safe_wal_size_bytes") == -1


def test_over_the_threshold_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check(
            SlotWal(2048, "reserved", None),
            slot="s",
            warn_retained_bytes=1024,
            metrics=CaptureMetrics(),
        )
    assert "slot s retains 2048 bytes of WAL" in caplog.text


def test_a_lost_slot_is_a_config_error_naming_the_resync() -> None:
    metrics = CaptureMetrics()
    with pytest.raises(ConfigError) as raised:
        check(SlotWal(None, "lost", None), slot="cdc_slot", warn_retained_bytes=0, metrics=metrics)
    message = str(raised.value)
    assert "pg_drop_replication_slot('cdc_slot')" in message
    assert "CAPTURE_SNAPSHOT_MODE=initial" in message
    assert "docs/operations.md" in message
    assert metrics.registry.get_sample_value("cdc_capture_slot_wal_status", {"status": "lost"}) == 1


def test_a_missing_slot_reading_changes_nothing() -> None:
    metrics = CaptureMetrics()
    check(None, slot="s", warn_retained_bytes=1, metrics=metrics)
    assert metrics.registry.get_sample_value("cdc_capture_slot_retained_wal_bytes") == 0


def test_unlimited_keep_size_is_a_loud_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        warn_if_unlimited(1024)
        assert not caplog.records
        warn_if_unlimited(-1)
    assert "max_slot_wal_keep_size is -1" in caplog.text
    assert "ALTER SYSTEM SET max_slot_wal_keep_size" in caplog.text


def test_a_lost_slot_names_the_cause_the_server_gives() -> None:
    assert "max_slot_wal_keep_size" in str(slot_lost_error("s"))
    assert "max_slot_wal_keep_size" in str(slot_lost_error("s", "wal_removed"))
    idle = str(slot_lost_error("s", "idle_timeout"))
    assert "idle_replication_slot_timeout" in idle
    assert "max_slot_wal_keep_size" not in idle
    assert "invalidation_reason = rows_removed" in str(slot_lost_error("s", "rows_removed"))
    assert "Resync" in idle
