# syntax=docker/dockerfile:1
#
# The apply job (`python -m apply`): PySpark plus the JVM jars of deploy/jars/spark/pom.xml
# and the object-store jars of deploy/jars/objectstore/pom.xml. The same image is the
# Spark driver and, on Kubernetes (deploy/helm: apply.spark.mode=kubernetes), its
# executors. Build from the repository root:
#   docker build -f deploy/docker/apply.Dockerfile -t pgdelta-cdc-apply .

# Stage 1: the Kafka source, Avro functions and Delta jars, resolved from Maven Central by
# the same pom as `make jars`. Only the pom is copied, so this layer is rebuilt only when
# the pom changes.
FROM maven:3.9-eclipse-temurin-17 AS jars
WORKDIR /src
COPY deploy/jars/spark/pom.xml deploy/jars/spark/pom.xml
RUN mvn -B -f deploy/jars/spark/pom.xml dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory=/jars

# Stage 1b: S3A (hadoop-aws and the AWS SDK bundle, about 690 MB) and ABFS, at the
# Hadoop version the pyspark wheel bundles. A stage of its own so that changing one pom
# does not re-download the other set.
FROM maven:3.9-eclipse-temurin-17 AS objectstore-jars
WORKDIR /src
COPY deploy/jars/objectstore/pom.xml deploy/jars/objectstore/pom.xml
RUN mvn -B -f deploy/jars/objectstore/pom.xml dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory=/jars

# Stage 1c: the compiled part (native/, the `capture_native` extension), whose change
# decoder decodes the records of the batches the driver writes itself
# (apply.lake.driver_plan; without it fastavro does, slower). Built as capture's image
# builds it: a wheel from the Rust toolchain in a stage of its own, so the final image
# carries no compiler; abi3 (CPython 3.11 and later), so the Debian python3 of this
# stage builds it for the image's 3.11.
FROM rust:1-slim-bookworm AS native
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/maturin && /opt/maturin/bin/pip install -q "maturin>=1.9.4,<2"
WORKDIR /tmp/native
COPY native ./
RUN /opt/maturin/bin/maturin build --release --quiet -o /wheels

# Stage 2: Python 3.11 with a Java 17 runtime. The JRE is taken from the Temurin image
# rather than from apt because the Debian release under python:3.11-slim decides which
# OpenJDK versions apt offers, and Spark is run and tested here on 17.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    JAVA_HOME=/opt/java/openjdk \
    PATH=/opt/java/openjdk/bin:$PATH

COPY --from=eclipse-temurin:17-jre /opt/java/openjdk /opt/java/openjdk

# The [apply] extra pins pyspark and delta-spark to the releases the pom's jars belong to.
WORKDIR /tmp/src
COPY pyproject.toml README.md ./
COPY capture ./capture
COPY apply ./apply
COPY schemas ./schemas
COPY runtime ./runtime
COPY pipeline ./pipeline
COPY deploy ./deploy
COPY --from=native /wheels /tmp/wheels
RUN pip install ".[apply]" /tmp/wheels/*.whl && rm -rf /tmp/src /tmp/wheels

# Every resolved jar is copied, including the libraries the pyspark wheel already ships at
# other versions: the apply job drops those at start (deploy.local.jars.spark_jars keeps
# only artifacts the wheel lacks), so the wheel's copy of a class always wins.
COPY --from=jars /jars /opt/cdc/jars
ENV APPLY_SPARK__JARS_DIR=/opt/cdc/jars

# The object-store jars go into the wheel's own jars directory (Spark's home), not
# /opt/cdc/jars: every JVM then has them on its class path from the start, the driver
# and, on Kubernetes, each executor, where anything in spark.jars would instead be
# downloaded from the driver by every executor at start (690 MB each). Only artifacts the
# wheel lacks are copied (the same rule as the job's jar filter), so the wheel's Hadoop
# and HTTP client stay the only ones; and because the wheel now ships them, the job's
# filter keeps them out of spark.jars. A bind mount, so the stage's copy is no layer.
RUN --mount=type=bind,from=objectstore-jars,source=/jars,target=/tmp/objectstore-jars \
    python -c 'import shutil; from pathlib import Path; \
from apply.engine.spark_jars import spark_jars, wheel_jar_dir; \
[shutil.copy2(jar, wheel_jar_dir()) for jar in spark_jars(Path("/tmp/objectstore-jars"))]'

# The executor's entrypoint on Kubernetes (the chart's executor pod template runs it).
COPY --chmod=755 deploy/docker/spark-executor.sh /opt/cdc/bin/spark-executor

# A numeric UID, so Kubernetes' runAsNonRoot can verify it. The user has a passwd entry
# because Hadoop's login code, which Spark runs at start, needs a name for the UID.
# /lake belongs to it so that a fresh named volume mounted there (compose copies the
# image directory's ownership into an empty volume) is writable.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/cdc cdc \
    && mkdir /lake \
    && chown 10001:10001 /lake
USER 10001:10001
WORKDIR /home/cdc

# The process is PID 1, and the kernel drops signals PID 1 has no handler for, so the
# default SIGTERM would be ignored until the runtime's SIGKILL. Python always handles
# SIGINT (KeyboardInterrupt), so a stop request reaches the job and unwinds it instead
# of waiting out the grace period.
STOPSIGNAL SIGINT

# No HEALTHCHECK: the job serves no endpoint a probe could ask (the Spark UI is off by
# default), and it exits when its streaming query fails, which the restart policy or the
# Deployment acts on.
ENTRYPOINT ["python", "-m", "apply"]
