"""A local standby's settings are what slot synchronization needs (from PostgreSQL 17;
none of its settings before, where a server refuses to start with an unknown one),
quoted for the configuration file, and a primary_conninfo without a database is refused
where slot synchronization needs one."""

from __future__ import annotations

import pytest

from deploy.local.errors import LauncherError
from deploy.local.standby import standby_settings


def test_the_settings_slot_synchronization_needs() -> None:
    text = standby_settings(
        "host=127.0.0.1 port=5432 user=postgres dbname=shop", "standby1", version=18
    )
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        "primary_conninfo = 'host=127.0.0.1 port=5432 user=postgres dbname=shop'",
        "primary_slot_name = 'standby1'",
        "hot_standby_feedback = 'on'",
        "sync_replication_slots = 'on'",
    ]


def test_quotes_are_doubled_inside_a_value() -> None:
    text = standby_settings("host=127.0.0.1 dbname='my db' application_name=x", "s", version=18)
    assert "primary_conninfo = 'host=127.0.0.1 dbname=''my db'' application_name=x'" in text


def test_a_conninfo_without_a_database_is_refused() -> None:
    with pytest.raises(LauncherError, match="names no dbname"):
        standby_settings("host=127.0.0.1 port=5432", "s", version=17)


def test_before_17_a_standby_gets_no_slot_synchronization() -> None:
    text = standby_settings("host=127.0.0.1 port=5432 user=postgres", "standby1", version=15)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        "primary_conninfo = 'host=127.0.0.1 port=5432 user=postgres'",
        "primary_slot_name = 'standby1'",
        "hot_standby_feedback = 'on'",
    ]
