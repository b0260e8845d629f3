# syntax=docker/dockerfile:1
#
# The capture service (`python -m capture`). Build from the repository root:
#   docker build -f deploy/docker/capture.Dockerfile -t pgdelta-cdc-capture .
# Only the project's base dependencies are installed: capture needs no JVM and no pyspark.

# capture's compiled row encoder (native/): a wheel built with the Rust toolchain in a
# stage of its own, so the final image carries no compiler. The wheel is abi3 (CPython
# 3.11 and later), so the Debian python3 of this stage builds it for the image's 3.11.
FROM rust:1-slim-bookworm AS native
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/maturin && /opt/maturin/bin/pip install -q "maturin>=1.9.4,<2"
WORKDIR /tmp/native
COPY native ./
RUN /opt/maturin/bin/maturin build --release --quiet -o /wheels

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# psycopg[binary], confluent-kafka and fastavro ship manylinux wheels, so no compiler or
# libpq package is needed here. The source is built into site-packages and then removed: the
# process must run the installed package, not a checkout next to it.
WORKDIR /tmp/src
COPY pyproject.toml README.md ./
COPY capture ./capture
COPY apply ./apply
COPY schemas ./schemas
COPY runtime ./runtime
COPY pipeline ./pipeline
COPY deploy ./deploy
COPY --from=native /wheels /tmp/wheels
RUN pip install . /tmp/wheels/*.whl && rm -rf /tmp/src /tmp/wheels

# A numeric UID, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/cdc cdc
USER 10001:10001
WORKDIR /home/cdc

# The process is PID 1, and the kernel drops signals PID 1 has no handler for, so the
# default SIGTERM would be ignored until the runtime's SIGKILL. Python always handles
# SIGINT (KeyboardInterrupt), so a stop request reaches the process and unwinds it
# instead of waiting out the grace period.
STOPSIGNAL SIGINT

# No HEALTHCHECK: capture serves no endpoint a probe could ask, and it exits on any
# failure it does not retry, so "the container is running" is already the whole answer;
# the restart policy (compose) or the Deployment (Kubernetes) acts on the exit.
ENTRYPOINT ["python", "-m", "capture"]
