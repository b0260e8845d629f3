"""How the suite is split across pytest-xdist workers (``make test`` runs ``-n`` of them
with ``--dist loadscope --no-loadscope-reorder``; docs/testing.md says why and keeps the
time budget).

Most of the suite's wall time is spent waiting: on a broker to start, a slot to be
confirmed, a Spark micro-batch, a killed process to come back. Several test modules
running at once fill those waits on two cores. What must not be split or doubled:

- a module: its module-scoped fixtures (a stack of its own, a pipeline run once for all
  its tests) would be built once per worker, and its tests may build on one another's
  state. So every test goes with its module by default;
- a service that a session-scoped fixture starts for several modules and that is costly
  to start twice (:data:`SHARED_SERVICE_GROUPS`): the modules that use it form one group,
  so one worker starts it once and runs them one after another. The standalone Spark
  cluster also takes every core while an application runs, so its tests must not meet.

A few modules are split instead (:data:`SPLIT_MODULES`): the e2e fault scenarios each
take minutes, build a pipeline of their own on the module's stack and never build on
another's state, so each scenario is a group of its own. A worker that runs one starts
the module's stack for itself (tens of seconds, against minutes saved), and a scenario
that stops or kills a service only ever touches its own worker's stack.

The grouping is done by :class:`GroupScheduling`, a scheduler of our own: xdist's
``loadgroup`` marks a test's group by rewriting its node id, which pytest 9 no longer
lets a plugin do, so it silently dealt out single tests. The scheduler runs in the
controlling process, which sees node ids only, so the groups are named here by module
path; each worker checks at collection that every module using a shared service's
fixture is listed (:func:`pytest_collection_modifyitems`), so a new one cannot slip
through ungrouped.

Groups are dealt out in collection order (xdist would otherwise deal the groups with the
most tests first, leaving the e2e modules, few tests of minutes each, for the end): e2e
first, then integration, then unit, so the run does not end on one worker with a long
test left.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

SHARED_SERVICE_GROUPS: dict[str, str] = {
    "spark_cluster": "spark-cluster",
    "schema_registry_url": "schema-registry",
    "object_store": "object-store",
}
"""A session-scoped fixture -> the group of every module that uses it."""

SHARED_SERVICE_MODULES: dict[str, str] = {
    "tests/integration/test_apply_standalone_cluster.py": "spark-cluster",
    "tests/unit/deploy/test_local_spark_cluster.py": "spark-cluster",
    "tests/integration/test_local_registry.py": "schema-registry",
    "tests/integration/test_registry_client.py": "schema-registry",
    "tests/integration/test_registry_confluent.py": "schema-registry",
    "tests/integration/test_registry_connect.py": "schema-registry",
    "tests/integration/test_registry_pipeline.py": "schema-registry",
    "tests/integration/test_apply_object_store.py": "object-store",
}
"""Each module that uses a fixture of :data:`SHARED_SERVICE_GROUPS`, with its group."""

SPLIT_MODULES = frozenset(
    {
        "tests/e2e/test_pipeline_faults.py",
        "tests/e2e/test_pipeline_network.py",
        "tests/e2e/test_pipeline_scenarios.py",
    }
)
"""Modules whose tests each go to any worker (see the module docstring)."""


def group_of(nodeid: str) -> str:
    """The group a test is dealt out with: its own, its shared service's or its module's."""
    module = nodeid.split("::", 1)[0]
    if module in SPLIT_MODULES:
        return nodeid
    return SHARED_SERVICE_MODULES.get(module, module)


def unlisted_modules(fixtures_by_module: dict[str, set[str]]) -> list[str]:
    """Modules that use a shared service's fixture without being in its group."""
    wrong = []
    for module, fixtures in sorted(fixtures_by_module.items()):
        wanted = {group for name, group in SHARED_SERVICE_GROUPS.items() if name in fixtures}
        if wanted and SHARED_SERVICE_MODULES.get(module) not in wanted:
            wrong.append(f"{module} ({', '.join(sorted(wanted))})")
    return wrong


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped here
    """xdist's scope scheduling with :func:`group_of` as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


# optionalhook: without xdist (``-p no:xdist``) this hook has no spec, and is not needed.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling:
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    fixtures: dict[str, set[str]] = defaultdict(set)
    for item in items:
        fixtures[item.nodeid.split("::", 1)[0]].update(getattr(item, "fixturenames", ()))
    wrong = unlisted_modules(fixtures)
    if wrong:
        raise pytest.UsageError(
            "these test modules use a shared service but are not in its group in "
            f"tests/plugins/parallel.py SHARED_SERVICE_MODULES: {'; '.join(wrong)}"
        )
