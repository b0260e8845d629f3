"""A real Spark standalone cluster for the tests that submit to one: a master and two
workers of one core each on loopback (:mod:`deploy.local.spark_cluster`).

Started by the first test that asks, for the rest of the session, under a temporary
directory, and stopped at the end (workers with their executors, then the master).
Applications submitted by the tests share it one after another: each takes every core
while it runs, so tests using it should not run at the same time as each other.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deploy.local.spark_cluster import LocalSparkCluster, running_cluster


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSparkCluster]:
    with running_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as cluster:
        yield cluster
