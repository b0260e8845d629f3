"""Held-back changes come back in order, intact, and the spool empties."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture.errors import ConfigError
from capture.records import OutgoingRecord
from capture.snapshot.held_changes import HeldChanges
from schemas.lsn import Lsn


def _record(n: int, *, value: bool = True) -> OutgoingRecord:
    return OutgoingRecord(
        topic="cdc.public.orders",
        key=f"key{n}".encode(),
        value=f"value{n}".encode() * n if value else None,
        headers=[("pgdelta.op", b"INSERT"), ("pgdelta.commit_lsn", f"0/{n}".encode())],
        table="public.orders",
    )


def test_fifo_round_trip_with_interleaved_holds(tmp_path: Path) -> None:
    spool = HeldChanges(tmp_path)
    for n in range(5):
        spool.hold(Lsn(100 + n), _record(n, value=n != 3))
    first = list(spool.release(2))
    spool.hold(Lsn(200), _record(9))
    rest = list(spool.release(100))
    assert [lsn for lsn, _ in first + rest] == [100, 101, 102, 103, 104, 200]
    assert [r for _, r in first + rest] == [_record(n, value=n != 3) for n in range(5)] + [
        _record(9)
    ]
    assert len(spool) == 0
    spool.close()


def test_nothing_is_left_on_disk(tmp_path: Path) -> None:
    spool = HeldChanges(tmp_path)
    spool.hold(Lsn(1), _record(1))
    assert list(tmp_path.iterdir()) == [], "the spool file has no name to leak"
    spool.close()


def test_a_missing_spool_directory_is_created(tmp_path: Path) -> None:
    directory = tmp_path / "not" / "yet"
    spool = HeldChanges(directory)
    try:
        assert directory.is_dir()
    finally:
        spool.close()


def test_an_unusable_spool_directory_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="CAPTURE_SPOOL_DIR"):
        HeldChanges(blocker / "spool")
