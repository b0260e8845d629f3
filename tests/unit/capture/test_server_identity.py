"""Capture streams only from a server where the pipeline's positions mean what they
meant when its slot checkpoint was taken (capture/source/server_identity.py)."""

from __future__ import annotations

import logging

import pytest

from capture.errors import ConfigError
from capture.publish.control import ControlState
from capture.source.server_identity import (
    SourceServer,
    TimelineSwitch,
    check_same_server,
    parse_timeline_history,
)
from schemas.control import ServerIdentity
from schemas.lsn import Lsn

CLUSTER = 7_301_234_567_890_123_456
OTHER_CLUSTER = 7_400_000_000_000_000_001

# Timeline 3 of CLUSTER: timeline 1 ended at 0/5000000, timeline 2 at 0/9000000.
WAL_END = Lsn(0xA000000)
PROMOTED_TWICE = SourceServer(
    ServerIdentity(CLUSTER, 3),
    WAL_END,
    (TimelineSwitch(1, Lsn(0x5000000)), TimelineSwitch(2, Lsn(0x9000000))),
)


def _check(server: SourceServer, recorded: ServerIdentity | None, position: int | None) -> None:
    check_same_server(
        server, recorded, position=None if position is None else Lsn(position), slot="s"
    )


def test_the_same_server_is_accepted() -> None:
    _check(SourceServer(ServerIdentity(CLUSTER, 1), WAL_END), ServerIdentity(CLUSTER, 1), 0x9999999)


def test_nothing_recorded_yet_is_accepted() -> None:
    _check(SourceServer(ServerIdentity(CLUSTER, 1), WAL_END), None, 0x9999999)
    _check(PROMOTED_TWICE, None, None)


def test_another_cluster_is_refused_naming_both_identifiers_and_the_resync() -> None:
    with pytest.raises(ConfigError) as refused:
        _check(
            SourceServer(ServerIdentity(OTHER_CLUSTER, 1), WAL_END),
            ServerIdentity(CLUSTER, 1),
            0x100,
        )
    message = str(refused.value)
    assert f"system identifier {CLUSTER}" in message
    assert f"system identifier {OTHER_CLUSTER}" in message
    assert "Resync" in message
    assert "CAPTURE_SNAPSHOT_MODE=initial" in message


def test_another_cluster_is_refused_whatever_the_position() -> None:
    with pytest.raises(ConfigError, match="another cluster"):
        _check(
            SourceServer(ServerIdentity(OTHER_CLUSTER, 2), WAL_END),
            ServerIdentity(CLUSTER, 2),
            None,
        )


def test_a_promotion_before_which_everything_was_held_is_streamed_on_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="capture.source.server_identity"):
        _check(PROMOTED_TWICE, ServerIdentity(CLUSTER, 2), 0x9000000)
        _check(PROMOTED_TWICE, ServerIdentity(CLUSTER, 1), 0x4FFFFFF)
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.WARNING]
    assert "from timeline 2 to 3 at 0/9000000" in caplog.records[0].getMessage()


def test_a_fork_below_what_the_pipeline_holds_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"forked from timeline 2 at 0/9000000.*0/9000001"):
        _check(PROMOTED_TWICE, ServerIdentity(CLUSTER, 2), 0x9000001)
    # The position of timeline 1's checkpoint is past where timeline 1 ended, though
    # below where timeline 2 did: what came after 0/5000000 on timeline 1 is lost.
    with pytest.raises(ConfigError, match="forked from timeline 1 at 0/5000000"):
        _check(PROMOTED_TWICE, ServerIdentity(CLUSTER, 1), 0x6000000)


def test_a_server_whose_wal_ends_before_what_the_pipeline_holds_is_refused() -> None:
    # Restored from a disk snapshot: the same cluster and timeline, its WAL cut short.
    same = SourceServer(ServerIdentity(CLUSTER, 1), WAL_END)
    with pytest.raises(ConfigError, match=r"WAL ends at 0/A000000, before 0/A000001"):
        _check(same, ServerIdentity(CLUSTER, 1), WAL_END + 1)
    # Also with a checkpoint of a version that recorded no server.
    with pytest.raises(ConfigError, match="restored from a backup"):
        _check(same, None, WAL_END + 1)
    _check(same, ServerIdentity(CLUSTER, 1), WAL_END)


def test_an_older_timeline_is_a_server_the_cluster_failed_over_from() -> None:
    with pytest.raises(ConfigError, match="failed over from"):
        _check(SourceServer(ServerIdentity(CLUSTER, 2), WAL_END), ServerIdentity(CLUSTER, 3), 0x100)


def test_a_timeline_that_does_not_descend_from_the_recorded_one_is_refused() -> None:
    # Timeline 4 branched from timeline 1: timeline 3 is not among its ancestors.
    branch = SourceServer(ServerIdentity(CLUSTER, 4), WAL_END, (TimelineSwitch(1, Lsn(0x5000000)),))
    with pytest.raises(ConfigError, match="does not descend from timeline 3"):
        _check(branch, ServerIdentity(CLUSTER, 3), 0x100)


def test_a_timeline_history_file_is_parsed() -> None:
    text = (
        "1\t0/5000000\tno recovery target specified\n"
        "\n"
        "# a comment\n"
        '2\t0/9000000\tat restore point "before"\n'
    )
    assert parse_timeline_history(text) == PROMOTED_TWICE.history
    # A restore point's name is the user's text: a line boundary other than "\n" in it
    # stays in the reason.
    named = text.replace('"before"', '"be\u2028fore\x85"')
    assert parse_timeline_history(named) == PROMOTED_TWICE.history
    assert parse_timeline_history("") == ()
    with pytest.raises(ValueError, match="timeline history"):
        parse_timeline_history("one\t0/1\treason\n")
    with pytest.raises(ValueError, match="invalid LSN"):
        parse_timeline_history("1\tnot-an-lsn\n")


def test_the_newest_position_is_the_checkpoint_or_the_newest_applied_commit() -> None:
    state = ControlState(
        Lsn(0x100),
        {("cdc.public.a", 0): 5, ("cdc.public.a", 1): 3, ("other.public.b", 0): 9},
        applied_lsns={
            ("cdc.public.a", 0): Lsn(0x80),
            ("cdc.public.a", 1): Lsn(0x200),
            ("other.public.b", 0): Lsn(0x900),
        },
    )
    assert state.newest_position("cdc") == Lsn(0x200), "another pipeline's topics are not ours"
    assert ControlState(Lsn(0x100), {}).newest_position("cdc") == Lsn(0x100)
    assert ControlState(None, {}).newest_position("cdc") is None
