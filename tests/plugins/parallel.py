"""How the suite is split across pytest-xdist workers (``make test`` runs ``-n`` of them
with ``--dist loadgroup``; see docs/testing.md for why and for the time budget).

Most of the suite's wall time is spent waiting: on a broker to start, a slot to be
confirmed, a Spark micro-batch, a killed process to come back. Two or three test modules
running at once fill those waits on two cores. What must not be split or doubled:

- a module: its module-scoped fixtures (a stack of its own, a capture or apply process)
  would be started once per worker, and its tests sometimes build on one another's
  state. So every test is grouped with its module by default;
- a service that a session-scoped fixture starts for several modules and that is costly
  to start twice (:data:`SHARED_SERVICE_GROUPS`): the modules that use it form one group,
  so one worker starts it once and runs them one after another. The standalone Spark
  cluster also takes every core while an application runs, so its tests must not meet.

Tests still name their own slots, topics and lake roots, so two groups never interfere
through the shared PostgreSQL and Kafka (:mod:`tests.plugins.services`).

A few modules are split instead (:data:`SPLIT_MODULES`): the e2e fault scenarios each
take minutes, build a pipeline of their own on the module's stack and never build on
another's state, so each scenario is a group of its own. A worker that runs one starts
the module's stack for itself (tens of seconds, against minutes saved), and a scenario
that stops or kills a service only ever touches its own worker's stack.

Groups are dealt out in collection order (``make test`` passes
``--no-loadscope-reorder``; xdist would otherwise deal the groups with the most tests
first, leaving the e2e modules, few tests of minutes each, for the end): e2e first, then
integration, then unit, so the run does not end on one worker with a long test left.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

# fixture -> the group of every module that uses it (first match wins).
SHARED_SERVICE_GROUPS: dict[str, str] = {
    "spark_cluster": "spark-cluster",
    "schema_registry_url": "schema-registry",
    "object_store": "object-store",
}


SPLIT_MODULES = frozenset(
    {
        "tests/e2e/test_pipeline_faults.py",
        "tests/e2e/test_pipeline_network.py",
        "tests/e2e/test_pipeline_scenarios.py",
    }
)
"""Modules whose tests each go to any worker (see the module docstring)."""


def module_group(fixtures: set[str], module: str) -> str:
    """The xdist group of a module whose tests use ``fixtures``."""
    for fixture, group in SHARED_SERVICE_GROUPS.items():
        if fixture in fixtures:
            return group
    return module


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    fixtures: dict[str, set[str]] = defaultdict(set)
    for item in items:
        fixtures[item.nodeid.split("::", 1)[0]].update(getattr(item, "fixturenames", ()))
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::", 1)[0]
        group = item.nodeid if module in SPLIT_MODULES else module_group(fixtures[module], module)
        item.add_marker(pytest.mark.xdist_group(group))
