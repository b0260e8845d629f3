"""One local SparkSession with Delta and the Kafka source for the whole test session.

Starting a JVM costs seconds, so the session is shared; each test writes under its own
temporary directory and reads its own topics. Two local cores match the machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from apply.engine.spark_session import build_session  # noqa: PLC0415
    from apply.settings import SparkSettings  # noqa: PLC0415 - pyspark loads only when used
    from deploy.local.jars import resolve, spark_jars  # noqa: PLC0415

    resolve("spark")
    warehouse: Path = tmp_path_factory.mktemp("spark-warehouse")
    settings = SparkSettings(
        master="local[2]",
        app_name="cdc-tests",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.warehouse.dir": str(warehouse),
            "spark.driver.memory": "2g",
        },
    )
    session = build_session(settings, spark_jars())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
