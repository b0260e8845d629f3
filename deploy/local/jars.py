"""Where the JVM jars live and how they get there.

Two sets, each resolved from Maven Central by a checked-in ``pom.xml`` under
``deploy/jars/`` with ``mvn dependency:copy-dependencies`` (``make jars``), never by Ivy at
run time:

- ``kafka``: an Apache Kafka broker and its runtime classpath.
- ``spark``: what the apply job adds to the pyspark wheel (the Kafka source and Delta).

Maven hands back the full transitive closure, which repeats libraries the pyspark wheel
already ships (Hadoop, Parquet, Jackson, log4j) at other versions. Two copies of a class
on one classpath is a lottery, so :func:`spark_jars` keeps only jars whose artifact the
wheel does not carry: the wheel's copy always wins.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from deploy.local.errors import MissingPrerequisite

PROJECT_ROOT = Path(__file__).resolve().parents[2]
POM_DIR = PROJECT_ROOT / "deploy" / "jars"
JAR_ROOT = PROJECT_ROOT / ".local" / "jars"
JAR_SETS = ("kafka", "spark")

_VERSION_SUFFIX = re.compile(r"-\d[\w.]*(?:-\d+)?$")
# Libraries that must move as one family: a single member at another version than the
# wheel's (say jackson-datatype-jdk8 2.13 beside jackson-databind 2.20) breaks at run time.
_WHEEL_FAMILIES = ("jackson-", "shims")


def jar_dir(name: str) -> Path:
    return JAR_ROOT / name


def resolve(name: str) -> Path:
    """Copy the jar set ``name`` into ``.local/jars/<name>`` with Maven (idempotent)."""
    target = jar_dir(name)
    marker = target / ".resolved"
    pom = POM_DIR / name / "pom.xml"
    if marker.exists() and marker.stat().st_mtime >= pom.stat().st_mtime:
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingPrerequisite(
            "Maven (`mvn`) is needed once to fetch the Kafka and Spark jars from Maven Central: "
            "`apt-get install maven` (done by `make bootstrap` when run as root)"
        )
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    result = subprocess.run(
        [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={target}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise MissingPrerequisite(
            f"mvn could not resolve {pom.relative_to(PROJECT_ROOT)}:\n"
            f"{result.stdout[-3000:]}{result.stderr[-2000:]}"
        )
    marker.touch()
    return target


def kafka_classpath() -> str:
    jars = sorted(jar_dir("kafka").glob("*.jar"))
    if not jars:
        raise MissingPrerequisite(
            "the Kafka broker jars are missing from .local/jars/kafka: run `make jars`"
        )
    return ":".join(str(j) for j in jars)


def artifact_name(jar: Path) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return _VERSION_SUFFIX.sub("", jar.stem)


def spark_jars(wheel_jars: Path | None = None) -> list[str]:
    """The jars to hand Spark through ``spark.jars``: the resolved set minus anything the
    pyspark wheel already ships."""
    resolved = sorted(jar_dir("spark").glob("*.jar"))
    if not resolved:
        raise MissingPrerequisite(
            "the Spark Kafka connector and Delta jars are missing from .local/jars/spark: "
            "run `make jars`"
        )
    if wheel_jars is None:
        import pyspark  # noqa: PLC0415 - pyspark is optional for the launcher's other users

        wheel_jars = Path(pyspark.__file__).parent / "jars"
    shipped = {artifact_name(j) for j in wheel_jars.glob("*.jar")}
    return [
        str(j)
        for j in resolved
        if artifact_name(j) not in shipped and not artifact_name(j).startswith(_WHEEL_FAMILIES)
    ]
