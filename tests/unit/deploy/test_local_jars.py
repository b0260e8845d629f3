"""The jar filter that keeps the pyspark wheel's copy of every library it ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from apply.engine.spark_jars import LOCAL_JARS, artifact_name
from deploy.local import jars
from deploy.local.errors import MissingPrerequisite


@pytest.mark.parametrize(
    ("file_name", "artifact"),
    [
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2_2.13"),
        ("zstd-jni-1.5.7-3.jar", "zstd-jni"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("RoaringBitmap-0.9.25.jar", "RoaringBitmap"),
    ],
)
def test_artifact_name_drops_the_version(file_name: str, artifact: str) -> None:
    assert artifact_name(Path(file_name)) == artifact


def test_spark_jars_keeps_only_what_the_wheel_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolved = tmp_path / "resolved" / "spark"
    wheel = tmp_path / "wheel"
    resolved.mkdir(parents=True)
    wheel.mkdir()
    for name in [
        "delta-spark_4.2_2.13-4.4.0.jar",
        "kafka-clients-3.9.2.jar",
        "parquet-hadoop-1.16.0.jar",
        "jackson-datatype-jdk8-2.13.5.jar",
        "shims-0.9.25.jar",
    ]:
        (resolved / name).touch()
    for name in ["parquet-hadoop-1.15.2.jar", "jackson-databind-2.20.0.jar"]:
        (wheel / name).touch()
    monkeypatch.setattr(jars, "JAR_ROOT", tmp_path / "resolved")

    kept = [Path(j).name for j in jars.spark_jars(wheel)]

    assert kept == ["delta-spark_4.2_2.13-4.4.0.jar", "kafka-clients-3.9.2.jar"]


def test_missing_jars_name_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jars, "JAR_ROOT", tmp_path)
    with pytest.raises(MissingPrerequisite, match="make jars"):
        jars.spark_jars(tmp_path)
    with pytest.raises(MissingPrerequisite, match="make jars"):
        jars.kafka_classpath()


def test_apply_looks_for_its_jars_where_make_jars_puts_them() -> None:
    # Both are computed from their own module's place in the tree: a module moved to
    # another folder must not lose the checkout's root.
    assert LOCAL_JARS == jars.JAR_ROOT / "spark"
