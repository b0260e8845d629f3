"""Which jars to hand Spark through ``spark.jars``.

The jar directory (``make jars`` locally, ``/opt/cdc/jars`` in the image) holds Maven's
whole transitive closure of deploy/jars/spark/pom.xml, which repeats libraries the
pyspark wheel already ships (Hadoop, Parquet, Jackson, log4j) at other versions. Two
copies of a class on one classpath is a lottery, so only jars whose artifact the wheel
does not carry are kept: the wheel's copy always wins.
"""

from __future__ import annotations

import re
from pathlib import Path

from apply.errors import ConfigError
from apply.settings import SparkSettings

_VERSION_SUFFIX = re.compile(r"-\d[\w.]*(?:-\d+)?$")
# Libraries that must move as one family: a single member at another version than the
# wheel's (say jackson-datatype-jdk8 2.13 beside jackson-databind 2.20) breaks at run time.
_WHEEL_FAMILIES = ("jackson-", "shims")


LOCAL_JARS = Path(__file__).resolve().parents[2] / ".local" / "jars" / "spark"
"""Where `make jars` puts them in a checkout."""


class JarsMissing(Exception):  # noqa: N818 - reads as a sentence at the raise site
    """The jar directory is empty or absent."""


def artifact_name(jar: Path) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return _VERSION_SUFFIX.sub("", jar.stem)


def wheel_jar_dir() -> Path:
    import pyspark  # noqa: PLC0415 - only the apply side has pyspark installed

    return Path(pyspark.__file__).parent / "jars"


def spark_jars(directory: Path, wheel_jars: Path | None = None) -> list[str]:
    """The jars of ``directory`` minus anything the pyspark wheel already ships."""
    resolved = sorted(directory.glob("*.jar"))
    if not resolved:
        raise JarsMissing(f"no jars in {directory}")
    shipped = {artifact_name(j) for j in (wheel_jars or wheel_jar_dir()).glob("*.jar")}
    return [
        str(j)
        for j in resolved
        if artifact_name(j) not in shipped and not artifact_name(j).startswith(_WHEEL_FAMILIES)
    ]


def configured_jars(settings: SparkSettings) -> list[str]:
    """Exact jars if given, else a jar directory filtered against the pyspark wheel, else
    what `make jars` resolved in this checkout."""
    if settings.jars is not None:
        return settings.jars
    directory = Path(settings.jars_dir) if settings.jars_dir else LOCAL_JARS
    try:
        return spark_jars(directory)
    except JarsMissing:
        raise ConfigError(
            f"no Spark jars in {directory}: run `make jars`, or set APPLY_SPARK__JARS_DIR "
            "(or APPLY_SPARK__JARS) to the Kafka connector and Delta jars"
        ) from None
