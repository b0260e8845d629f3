"""The apply image's side of Spark on Kubernetes and of the object-store lake.

- The executor entrypoint (deploy/docker/spark-executor.sh), which the chart's executor
  pod template runs, starts Spark's KubernetesExecutorBackend with what Spark's driver
  puts in the executor pod's environment, the JVM options in Spark's order, on the
  pyspark wheel's jars; and refuses to start as anything else. Run for real with a
  stand-in ``java`` that records its arguments.
- The object-store jar set (deploy/jars/objectstore/pom.xml) is at the Hadoop version
  the pyspark wheel bundles and keeps every other Hadoop artifact out; it is resolved on
  demand only (never by ``make jars``), and the image resolves it in a stage of its own.
  Nothing here resolves it: the SDK bundle alone is about 686 MB.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from apply.engine.spark_jars import artifact_name, wheel_jar_dir
from deploy.local import jars

ROOT = Path(__file__).resolve().parents[3]
ENTRYPOINT = ROOT / "deploy" / "docker" / "spark-executor.sh"
DOCKERFILE = ROOT / "deploy" / "docker" / "apply.Dockerfile"
POM = ROOT / "deploy" / "jars" / "objectstore" / "pom.xml"
HELPERS = ROOT / "deploy" / "helm" / "pgdelta-cdc" / "templates" / "_helpers.tpl"
MAVEN = "{http://maven.apache.org/POM/4.0.0}"

# What Spark's BasicExecutorFeatureStep sets on an executor pod, as the driver would.
EXECUTOR_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@cdc-driver.data.svc:7078",
    "SPARK_EXECUTOR_ID": "3",
    "SPARK_EXECUTOR_CORES": "4",
    "SPARK_EXECUTOR_MEMORY": "8g",
    "SPARK_APPLICATION_ID": "spark-0123abcd",
    "SPARK_EXECUTOR_POD_IP": "10.1.2.3",
    "SPARK_EXECUTOR_POD_NAME": "cdc-apply-exec-3",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_CONF_DIR": "/opt/spark/conf",
    # Out of order on purpose, and past 9: Spark numbers them in the order they apply.
    "SPARK_JAVA_OPT_10": "-Dspark.driver.port=7078",
    "SPARK_JAVA_OPT_2": "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "SPARK_JAVA_OPT_0": "-Djava.net.preferIPv6Addresses=false",
    "SPARK_JAVA_OPT_1": "-XX:+IgnoreUnrecognizedVMOptions",
}


def _fake_java(tmp_path: Path) -> Path:
    """A JAVA_HOME whose java writes its arguments, one per line, to a file."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "argv"}\n')
    java.chmod(0o755)
    return home


def _run_entrypoint(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    # The python with pyspark first, as in the image.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    base = {"PATH": path, "JAVA_HOME": str(_fake_java(tmp_path))}
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_the_entrypoint_starts_the_kubernetes_executor_backend(tmp_path: Path) -> None:
    result = _run_entrypoint(tmp_path, ["executor"], {**EXECUTOR_ENV, "SPARK_HOME": "/spark"})
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv == [
        "-Djava.net.preferIPv6Addresses=false",
        "-XX:+IgnoreUnrecognizedVMOptions",
        "--add-opens=java.base/java.nio=ALL-UNNAMED",
        "-Dspark.driver.port=7078",
        "-Xms8g",
        "-Xmx8g",
        "-cp",
        "/opt/spark/conf:/spark/jars/*",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        *("--driver-url", EXECUTOR_ENV["SPARK_DRIVER_URL"]),
        *("--executor-id", "3"),
        *("--cores", "4"),
        *("--app-id", "spark-0123abcd"),
        *("--hostname", "10.1.2.3"),
        *("--resourceProfileId", "0"),
        *("--podName", "cdc-apply-exec-3"),
    ]


def test_the_entrypoint_finds_the_wheels_spark_home(tmp_path: Path) -> None:
    """Without SPARK_HOME (the image sets none) the jars are the installed wheel's."""
    env = {k: v for k, v in EXECUTOR_ENV.items() if not k.startswith("SPARK_JAVA_OPT_")}
    result = _run_entrypoint(tmp_path, ["executor"], env)
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:3] == ["-Xms8g", "-Xmx8g", "-cp"]
    assert argv[3] == f"/opt/spark/conf:{wheel_jar_dir()}/*"
    assert list(wheel_jar_dir().glob("spark-kubernetes_*.jar")), "the backend's own jar"


@pytest.mark.parametrize("args", [[], ["driver"], ["python", "-m", "apply"]])
def test_the_entrypoint_refuses_anything_but_an_executor(tmp_path: Path, args: list[str]) -> None:
    result = _run_entrypoint(tmp_path, args, EXECUTOR_ENV)
    assert result.returncode == 64
    assert "Spark's driver starts it with 'executor'" in result.stderr
    assert not (tmp_path / "argv").exists()


def test_the_image_installs_the_entrypoint_the_chart_runs() -> None:
    command = re.search(r'define "pgdelta-cdc.executorCommand" -\}\}(\S+)\{\{', HELPERS.read_text())
    assert command is not None
    dockerfile = DOCKERFILE.read_text()
    assert f"deploy/docker/spark-executor.sh {command.group(1)}" in dockerfile
    # The object-store set resolves in a stage of its own, from its own pom.
    assert "COPY deploy/jars/objectstore/pom.xml deploy/jars/objectstore/pom.xml" in dockerfile
    assert "from=objectstore-jars" in dockerfile


def _dependencies(pom: ET.Element) -> list[ET.Element]:
    found = pom.find(f"{MAVEN}dependencies")
    assert found is not None
    return list(found)


def _text(element: ET.Element, tag: str, properties: dict[str, str]) -> str:
    node = element.find(f"{MAVEN}{tag}")
    assert node is not None
    assert node.text is not None
    return re.sub(r"\$\{([^}]+)\}", lambda m: properties[m.group(1)], node.text)


def test_objectstore_jars_match_the_wheels_hadoop() -> None:
    pom = ET.parse(POM).getroot()
    properties_node = pom.find(f"{MAVEN}properties")
    assert properties_node is not None
    properties = {p.tag.removeprefix(MAVEN): p.text or "" for p in properties_node}
    wheel_hadoop = {
        artifact_name(jar): jar.stem.removeprefix(artifact_name(jar) + "-")
        for jar in wheel_jar_dir().glob("hadoop-client-*.jar")
    }
    assert set(wheel_hadoop) == {"hadoop-client-api", "hadoop-client-runtime"}
    (hadoop_version,) = set(wheel_hadoop.values())
    artifacts = {
        (_text(d, "groupId", properties), _text(d, "artifactId", properties)): d
        for d in _dependencies(pom)
    }
    assert set(artifacts) == {
        ("org.apache.hadoop", "hadoop-aws"),
        ("org.apache.hadoop", "hadoop-azure"),
        ("software.amazon.awssdk", "bundle"),
    }
    for (group, artifact), dependency in artifacts.items():
        if group == "org.apache.hadoop":
            assert _text(dependency, "version", properties) == hadoop_version, artifact
            # No other Hadoop jar may join the wheel's shaded client.
            exclusions = {
                (_text(e, "groupId", properties), _text(e, "artifactId", properties))
                for e in dependency.iter(f"{MAVEN}exclusion")
            }
            assert ("org.apache.hadoop", "*") in exclusions, artifact
    # hadoop-aws 3.5.0 is built against this SDK (hadoop-project's aws-java-sdk-v2.version).
    bundle = artifacts[("software.amazon.awssdk", "bundle")]
    assert {"3.5.0": "2.35.4"}.get(hadoop_version) == _text(bundle, "version", properties), (
        "a new Hadoop in the wheel: take aws-java-sdk-v2.version from its hadoop-project pom"
    )


def test_objectstore_jars_are_resolved_on_demand_only() -> None:
    assert "objectstore" in jars.ON_DEMAND_JAR_SETS
    assert "objectstore" not in jars.JAR_SETS
    assert (jars.POM_DIR / "objectstore" / "pom.xml") == POM
    makefile = (ROOT / "Makefile").read_text()
    assert "objectstore" not in makefile


def test_the_chart_ci_values_name_an_object_store_the_image_can_reach() -> None:
    """The image carries S3A and ABFS; GCS needs a connector the image lacks."""
    schemes = set()
    for values in (ROOT / "deploy" / "helm" / "pgdelta-cdc" / "ci").glob("*.yaml"):
        root = (yaml.safe_load(values.read_text()).get("lake") or {}).get("root", "")
        if "://" in root:
            schemes.add(root.split("://")[0])
    assert schemes
    assert schemes <= {"s3a", "abfss"}
