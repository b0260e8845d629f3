"""The eleven-table scenario's pure parts: its tables, the writer's schedule, latencies
gathered per group of tables, and the footprint's share of a core."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench.freshness import Arrivals, Footprint, tables_of
from bench.pipeline_run import BENCH_TRIGGER, DEFAULT_TRIGGER, PipelineRun, scenario_trigger
from bench.scenario import (
    PGBENCH_TABLES,
    PROBE_TABLE,
    QUIET_TABLES,
    SEEDED_ROWS,
    Group,
    Scenario,
    by_group,
    group_of,
    schedule,
    writes_per_group,
)
from deploy.local import stack


def test_the_eleven_tables_are_pgbench_s_a_probe_and_six_quiet_ones() -> None:
    assert len(Scenario.ELEVEN.tables) == 11
    assert len(set(Scenario.ELEVEN.tables)) == 11
    assert Scenario.ELEVEN.tables[:4] == PGBENCH_TABLES
    assert PROBE_TABLE in Scenario.ELEVEN.seeded_tables
    assert set(QUIET_TABLES) <= set(Scenario.ELEVEN.seeded_tables)
    assert "pgbench_history" in Scenario.ELEVEN.seeded_tables, "its topic exists from the start"
    assert "pgbench_history" not in Scenario.PGBENCH.seeded_tables, "pgbench -i leaves it empty"
    assert Scenario.PGBENCH.tables == PGBENCH_TABLES
    assert Scenario.PGBENCH.extra_tables == ()


def test_the_schedule_writes_the_probe_every_fifth_of_a_second_and_each_quiet_table_every_2_s() -> (
    None
):
    writes = schedule(Scenario.ELEVEN, 30)
    per_table = Counter(w.table for w in writes)
    assert per_table[PROBE_TABLE] == 150
    assert all(per_table[t] == 15 for t in QUIET_TABLES)
    assert set(per_table) == {PROBE_TABLE, *QUIET_TABLES}
    assert [w.at_s for w in writes] == sorted(w.at_s for w in writes)
    assert all(0 <= w.at_s < 30 for w in writes), "nothing past the window"
    probe = [w.at_s for w in writes if w.table == PROBE_TABLE]
    assert probe[:3] == [0.0, 0.2, 0.4]
    assert probe[-1] == pytest.approx(29.8)


def test_the_quiet_tables_are_staggered_over_their_period() -> None:
    firsts: dict[str, float] = {}
    for write in schedule(Scenario.ELEVEN, 10):
        firsts.setdefault(write.table, write.at_s)
    starts = sorted(firsts[t] for t in QUIET_TABLES)
    assert starts == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0, 4 / 3, 5 / 3], abs=1e-6)


def test_each_write_updates_the_next_seeded_row_and_wraps_around() -> None:
    probe = [
        w.row_id for w in schedule(Scenario.ELEVEN, SEEDED_ROWS * 0.2 + 1) if w.table == PROBE_TABLE
    ]
    assert probe[:3] == [1, 2, 3]
    assert probe[SEEDED_ROWS - 1] == SEEDED_ROWS
    assert probe[SEEDED_ROWS] == 1
    assert all(1 <= r <= SEEDED_ROWS for r in probe)


def test_a_window_shorter_than_a_period_still_writes_once_each() -> None:
    assert Counter(w.table for w in schedule(Scenario.ELEVEN, 0.1)) == {
        PROBE_TABLE: 1,
        QUIET_TABLES[0]: 1,
    }
    assert schedule(Scenario.ELEVEN, 0) == []
    assert schedule(Scenario.PGBENCH, 30) == [], "pgbench's tables alone: no other writer"


def test_latencies_gather_per_group_in_group_order() -> None:
    pairs = [
        ("bench_quiet_3", 9.0),
        ("pgbench_accounts", 1.0),
        (PROBE_TABLE, 4.0),
        ("pgbench_history", 2.0),
        ("bench_quiet_1", 8.0),
    ]
    grouped = by_group(pairs)
    assert list(grouped) == [Group.PGBENCH, Group.PROBE, Group.QUIET]
    assert grouped == {Group.PGBENCH: [1.0, 2.0], Group.PROBE: [4.0], Group.QUIET: [9.0, 8.0]}
    assert by_group([("pgbench_tellers", 3.0)]) == {Group.PGBENCH: [3.0]}, "no empty groups"
    with pytest.raises(ValueError, match="no group"):
        group_of("orders")


def test_writes_add_up_per_group() -> None:
    done = {PROBE_TABLE: 150, "bench_quiet_1": 15, "bench_quiet_2": 14}
    assert writes_per_group(done) == {Group.PROBE: 150, Group.QUIET: 29}


def test_records_are_mapped_to_their_tables_in_arrival_order() -> None:
    arrivals = Arrivals(
        commit_us={
            ("bench.public.bench_probe", 0, 7): 1,
            ("bench.public.pgbench_accounts", 0, 3): 2,
            ("bench.public.bench_quiet_4", 0, 0): 3,
        }
    )
    assert tables_of(arrivals, Scenario.ELEVEN.tables) == [
        PROBE_TABLE,
        "pgbench_accounts",
        "bench_quiet_4",
    ]
    with pytest.raises(KeyError):
        tables_of(arrivals, Scenario.PGBENCH.tables)


def test_the_share_of_one_core_is_cpu_seconds_over_the_window() -> None:
    footprint = Footprint(
        cpu_before={"apply": 100.0, "capture": 5.0},
        cpu_after={"apply": 145.0, "capture": 8.0},
        peak_rss={},
        window_s=60.0,
    )
    assert footprint.cpu_s("apply") == pytest.approx(45.0)
    assert footprint.of_one_core("apply") == pytest.approx(0.75)
    assert footprint.of_one_core("capture") == pytest.approx(0.05)
    assert Footprint({}, {}, {}, 0.0).of_one_core("apply") == 0.0


def _run(scenario: Scenario, trigger: str) -> PipelineRun:
    state = stack.StackState(
        postgres_root="/nonexistent/postgres",
        postgres_port=1,
        kafka_root="/nonexistent/kafka",
        kafka_port=2,
        kafka_controller_port=3,
    )
    return PipelineRun(Path("/nonexistent"), state, trigger, scenario=scenario)


def test_the_eleven_table_run_leaves_apply_at_its_defaults() -> None:
    env = _run(Scenario.ELEVEN, DEFAULT_TRIGGER).service_env()
    assert not {"APPLY_TRIGGER__INTERVAL", "APPLY_SPARK__MASTER", "APPLY_SPARK__CONF"} & set(env)
    assert json.loads(env["CAPTURE_POSTGRES__TABLES"]) == [
        f"public.{t}" for t in Scenario.ELEVEN.tables
    ]
    assert _run(Scenario.ELEVEN, DEFAULT_TRIGGER).trigger_interval == "5 seconds"


def test_the_pgbench_run_keeps_the_benchmark_s_settings() -> None:
    env = _run(Scenario.PGBENCH, "2 seconds").service_env()
    assert env["APPLY_TRIGGER__INTERVAL"] == "2 seconds"
    assert env["APPLY_SPARK__MASTER"] == "local[2]"
    assert len(json.loads(env["CAPTURE_POSTGRES__TABLES"])) == 4
    assert "APPLY_TRIGGER__INTERVAL" not in _run(Scenario.PGBENCH, DEFAULT_TRIGGER).service_env()
    assert _run(Scenario.ELEVEN, "1 second").service_env()["APPLY_TRIGGER__INTERVAL"] == "1 second"


def test_the_trigger_is_the_scenario_s_unless_given() -> None:
    assert scenario_trigger(Scenario.ELEVEN, None) == DEFAULT_TRIGGER
    assert scenario_trigger(Scenario.PGBENCH, None) == BENCH_TRIGGER
    assert scenario_trigger(Scenario.ELEVEN, "1 second") == "1 second"
    assert scenario_trigger(Scenario.PGBENCH, DEFAULT_TRIGGER) == DEFAULT_TRIGGER
