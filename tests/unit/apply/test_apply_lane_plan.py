"""Lanes: which change topics each streaming query reads, where it checkpoints, and how
a table's recorded state is told to be another lane's."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import pytest

from apply.app import queries_ended
from apply.batch import ApplyContext
from apply.errors import ConfigError
from apply.lake.spark_merge import transaction_app_id
from apply.lanes import DEFAULT_LANE, Lane, plan_lanes
from tests.plugins.table_states import STATE


def _plan(lanes: dict[str, list[str]], prefix: str = "cdc") -> dict[str, Lane]:
    planned = plan_lanes(
        lanes,
        topic_prefix=prefix,
        control_topic=f"{prefix}._control",
        schema_topic=f"{prefix}._schemas",
        checkpoint_root="s3a://bucket/checkpoints/",
    )
    assert planned[0].name == DEFAULT_LANE, "the default lane comes first"
    return {lane.name: lane for lane in planned}


def _reads(lane: Lane, topic: str) -> bool:
    return re.match(lane.topic_pattern, topic) is not None


TOPICS = [
    "cdc.public.events",
    "cdc.public.orders",
    "cdc.public.events_archive",
    "cdc.audit.log",
    "cdc.audit.log_2",
    "cdc.my-2dschema.t_1",
    "cdc.Public.Events",
]


def test_without_lanes_the_default_lane_reads_every_change_topic() -> None:
    lanes = _plan({})
    assert list(lanes) == [DEFAULT_LANE]
    default = lanes[DEFAULT_LANE]
    assert all(_reads(default, topic) for topic in TOPICS)
    assert not _reads(default, "cdc._control")
    assert not _reads(default, "cdc._schemas")
    assert default.checkpoint == "s3a://bucket/checkpoints/apply", "the pre-lanes location"
    assert default.query_name == "pgdelta-apply"


def test_every_change_topic_is_read_by_exactly_one_lane() -> None:
    lanes = _plan({"events": ["public.events"], "audit": ["audit.*"], "odd": ["my-schema.t_1"]})
    owners = {topic: [n for n, lane in lanes.items() if _reads(lane, topic)] for topic in TOPICS}
    assert owners == {
        "cdc.public.events": ["events"],
        "cdc.public.orders": [DEFAULT_LANE],
        "cdc.public.events_archive": [DEFAULT_LANE],
        "cdc.audit.log": ["audit"],
        "cdc.audit.log_2": ["audit"],
        "cdc.my-2dschema.t_1": ["odd"],  # the escaped segment, as capture names it
        "cdc.Public.Events": [DEFAULT_LANE],  # names are case-sensitive
    }
    assert not any(_reads(lane, "cdc._control") for lane in lanes.values())


def test_a_lane_checkpoints_beside_the_default_one_under_a_name_of_what_it_reads() -> None:
    lanes = _plan({"events": ["public.events"]})
    events, default = lanes["events"], lanes[DEFAULT_LANE]
    assert re.fullmatch(r"s3a://bucket/checkpoints/apply-events-[0-9a-f]{12}", events.checkpoint)
    assert re.fullmatch(r"s3a://bucket/checkpoints/apply-default-[0-9a-f]{12}", default.checkpoint)
    assert events.query_name == "pgdelta-apply-events"
    ids = {transaction_app_id(lane.checkpoint) for lane in lanes.values()}
    assert len(ids) == 2, "each lane commits under its own txnAppId"
    # The same lanes, written another way, keep their checkpoints.
    again = _plan({"events": ["public.events", "public.events"]})
    assert {n: lane.checkpoint for n, lane in again.items()} == {
        n: lane.checkpoint for n, lane in lanes.items()
    }


def test_a_lane_whose_tables_change_starts_a_new_checkpoint() -> None:
    """Spark fails a query whose topic set shrank (data loss), so none may go on."""
    before = _plan({"events": ["public.events"]})
    after = _plan({"events": ["public.events", "public.orders"], "audit": ["audit.*"]})
    assert after["events"].checkpoint != before["events"].checkpoint
    assert after[DEFAULT_LANE].checkpoint != before[DEFAULT_LANE].checkpoint
    assert _plan({})[DEFAULT_LANE].checkpoint not in {
        before[DEFAULT_LANE].checkpoint,
        after[DEFAULT_LANE].checkpoint,
    }
    unchanged = _plan({"events": ["public.events"], "audit": ["audit.*"]})
    assert unchanged["events"].checkpoint == before["events"].checkpoint


def test_a_prefix_with_dots_is_matched_literally() -> None:
    lanes = _plan({"events": ["public.events"]}, prefix="prod.cdc")
    assert _reads(lanes["events"], "prod.cdc.public.events")
    assert not _reads(lanes["events"], "prodXcdc.public.events")
    assert not _reads(lanes[DEFAULT_LANE], "prod.cdc.public.events")
    assert _reads(lanes[DEFAULT_LANE], "prod.cdc.public.orders")


@pytest.mark.parametrize(
    ("lanes", "message"),
    [
        ({"a": ["public.events"], "b": ["public.events"]}, "belongs to one lane only"),
        ({"a": ["public.*"], "b": ["public.events"]}, "belongs to one lane only"),
        ({"a": ["public.events"], "b": ["public.*"]}, "belongs to one lane only"),
        ({"default": ["public.events"]}, "not usable"),
        ({"Big": ["public.events"]}, "not usable"),
        ({"a/b": ["public.events"]}, "not usable"),
        ({"a": []}, "names no table"),
        ({"a": ["events"]}, "not a table selector"),
        ({"a": ["public.events.x"]}, "names containing '.'"),
        ({"a": [".events"]}, "not a table selector"),
    ],
)
def test_bad_lanes_are_refused_with_what_to_do(lanes: dict[str, list[str]], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        _plan(lanes)


def test_overlap_within_one_lane_is_harmless() -> None:
    lanes = _plan({"a": ["public.*", "public.events", "public.events"]})
    assert _reads(lanes["a"], "cdc.public.events")
    assert not _reads(lanes[DEFAULT_LANE], "cdc.public.orders")


def test_batch_ids_compare_only_with_the_query_that_wrote_the_state() -> None:
    default_id = transaction_app_id("/cp/apply")
    lane_id = transaction_app_id("/cp/apply-events-0123456789ab")
    in_lane = ApplyContext("/lake", lane_id, {}, default_txn_app_id=default_id)
    in_default = ApplyContext("/lake", default_id, {}, default_txn_app_id=default_id)
    by_default = replace(STATE, txn_app_id=default_id)
    by_lane = replace(STATE, txn_app_id=lane_id)
    before_lanes = replace(STATE, txn_app_id=None)

    assert in_lane.wrote(by_lane)
    assert not in_lane.wrote(by_default), "the lane just took the table over"
    assert not in_lane.wrote(before_lanes), "states from before lanes are the default's"
    assert in_default.wrote(by_default)
    assert in_default.wrote(before_lanes)
    assert not in_default.wrote(by_lane), "the table came back from a lane"
    # Without a default lane's id (direct callers, reapply): taken as this query's.
    assert ApplyContext("/lake", lane_id, {}).wrote(before_lanes)


@dataclass
class _Query:
    """What :func:`queries_ended` asks of a streaming query."""

    isActive: bool  # StreamingQuery's name
    error: str | None = None

    def exception(self) -> str | None:
        return self.error


def _ended(each_ends: bool, *queries: _Query) -> bool:
    return queries_ended(queries, each_ends)  # type: ignore[arg-type]


def test_the_job_ends_when_a_lane_fails_or_when_every_lane_has_ended() -> None:
    running, done, failed = _Query(True), _Query(False), _Query(False, "boom")
    assert not _ended(False, running, running)
    assert _ended(False, running, done), "a processing-time query only ends if stopped"
    assert not _ended(True, running, done), "available_now: the others still read"
    assert _ended(True, done, done)
    assert _ended(True, running, failed), "a failed lane ends the job in any mode"
    assert _ended(False, failed)
