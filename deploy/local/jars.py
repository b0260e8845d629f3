"""Where the JVM jars live and how they get there.

Each set is resolved from Maven Central by a checked-in ``pom.xml`` under
``deploy/jars/`` with ``mvn dependency:copy-dependencies``, never by Ivy at run time.
``make jars`` resolves :data:`JAR_SETS`:

- ``kafka``: an Apache Kafka broker and its runtime classpath.
- ``spark``: what the apply job adds to the pyspark wheel (the Kafka source and Delta).

:data:`ON_DEMAND_JAR_SETS` are resolved only by the test that needs them
(``resolve(name)``), so a bootstrap does not fetch what most runs never start:

- ``connect``: a Kafka Connect worker with Apicurio's Avro converter and the file sink,
  for the interop test of the registry-framed topics (about 40 MB).
- ``objectstore``: S3A (``hadoop-aws`` and the AWS SDK bundle) and ABFS at the Hadoop
  version the pyspark wheel bundles, for a lake on object storage (about 700 MB, almost
  all of it the SDK bundle). The apply image resolves it itself; locally only a test
  that needs it should, and its jars go beside the wheel's Hadoop, not into
  ``.local/jars/spark``.
- ``debezium``: a Kafka Connect worker with Debezium's PostgreSQL connector, for the
  drain benchmark's side-by-side run (``bench/capture_drain.py --debezium``); no test
  uses it.

Which of the resolved Spark jars reach ``spark.jars`` is the apply job's rule, in
:mod:`apply.engine.spark_jars`.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

from deploy.local.errors import MissingPrerequisite

PROJECT_ROOT = Path(__file__).resolve().parents[2]
POM_DIR = PROJECT_ROOT / "deploy" / "jars"
JAR_ROOT = PROJECT_ROOT / ".local" / "jars"
JAR_SETS = ("kafka", "spark")
ON_DEMAND_JAR_SETS = ("connect", "objectstore", "debezium")


def jar_dir(name: str) -> Path:
    return JAR_ROOT / name


def resolve(name: str) -> Path:
    """Copy the jar set ``name`` into ``.local/jars/<name>`` with Maven (idempotent).

    Several processes may ask at once (the test suite's workers, a test beside a demo):
    a lock per set makes the others wait for the one resolving, so none reads a
    directory another is emptying and filling."""
    target = jar_dir(name)
    if _resolved(name):
        return target
    JAR_ROOT.mkdir(parents=True, exist_ok=True)
    with (JAR_ROOT / f".{name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _resolved(name):
            _copy_dependencies(name)
    return target


def _resolved(name: str) -> bool:
    marker = jar_dir(name) / ".resolved"
    pom = POM_DIR / name / "pom.xml"
    return marker.exists() and marker.stat().st_mtime >= pom.stat().st_mtime


def _copy_dependencies(name: str) -> None:
    target = jar_dir(name)
    marker = target / ".resolved"
    pom = POM_DIR / name / "pom.xml"
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


def kafka_classpath() -> str:
    jars = sorted(jar_dir("kafka").glob("*.jar"))
    if not jars:
        raise MissingPrerequisite(
            "the Kafka broker jars are missing from .local/jars/kafka: run `make jars`"
        )
    return ":".join(str(j) for j in jars)


def spark_jars(wheel_jars: Path | None = None) -> list[str]:
    """The locally resolved jars to hand Spark, minus what the pyspark wheel ships."""
    from apply.engine.spark_jars import JarsMissing  # noqa: PLC0415 - pyspark-side module
    from apply.engine.spark_jars import spark_jars as filtered  # noqa: PLC0415

    try:
        return filtered(jar_dir("spark"), wheel_jars)
    except JarsMissing:
        raise MissingPrerequisite(
            "the Spark Kafka connector and Delta jars are missing from .local/jars/spark: "
            "run `make jars`"
        ) from None
