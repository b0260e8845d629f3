"""The local Spark standalone cluster's pure parts: command lines, readiness, layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.local.errors import MissingPrerequisite
from deploy.local.spark_cluster import (
    LocalSparkCluster,
    alive_workers,
    daemon_argv,
    master_arguments,
    scala_version,
    worker_arguments,
)


def test_scala_version_comes_from_the_spark_core_jar() -> None:
    jars = ["scala-library-2.13.18.jar", "spark-core_2.13-4.2.0.jar", "zstd-jni-1.5.7-6.jar"]
    assert scala_version(jars) == "2.13"


def test_a_distribution_without_spark_core_is_refused() -> None:
    with pytest.raises(MissingPrerequisite, match="spark-core"):
        scala_version(["scala-library-2.13.18.jar"])


def test_ready_counts_only_alive_workers() -> None:
    status = {
        "status": "ALIVE",
        "workers": [{"state": "ALIVE"}, {"state": "DEAD"}, {"state": "ALIVE"}],
    }
    assert alive_workers(status) == 2
    assert alive_workers({"status": "ALIVE"}) == 0, "a master without workers"


def test_daemons_bind_to_loopback_on_their_ports(tmp_path: Path) -> None:
    argv = daemon_argv("/jdk/bin/java", Path("/py/pyspark"), "Main", master_arguments(7077, 8080))
    assert argv[:4] == ["/jdk/bin/java", "-Xmx256m", "-cp", "/py/pyspark/jars/*"]
    assert argv[4:] == ["Main", "--host", "127.0.0.1", "--port", "7077", "--webui-port", "8080"]
    worker = worker_arguments(
        "spark://127.0.0.1:7077",
        port=1,
        ui_port=2,
        cores=1,
        memory="1g",
        work_dir=tmp_path / "work",
    )
    assert worker[-1] == "spark://127.0.0.1:7077", "the master URL comes last"
    assert worker[worker.index("--cores") + 1] == "1"
    assert worker[worker.index("--work-dir") + 1] == str(tmp_path / "work")


def test_each_worker_has_its_own_directory_and_ports(tmp_path: Path) -> None:
    cluster = LocalSparkCluster(tmp_path, workers=3)
    assert cluster.master_url == f"spark://127.0.0.1:{cluster.port}"
    assert [w.root for w in cluster.nodes] == [tmp_path / f"worker-{n}" for n in (1, 2, 3)]
    workers = [port for w in cluster.nodes for port in (w.port, w.ui_port)]
    ports = [cluster.port, cluster.ui_port, *workers]
    assert len(set(ports)) == len(ports)


def test_a_cluster_without_workers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 1 worker"):
        LocalSparkCluster(tmp_path, workers=0)
