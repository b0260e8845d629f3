"""The pipeline under pgbench while the network is cut: the lake ends equal to the source.

capture and apply run as real processes (``tests/plugins/pipeline.py``) on a stack of
this module's own; a TCP proxy (``tests/plugins/tcp_proxy.py``) stands between a
service and what it talks to, and the test cuts it (open connections reset, new ones
refused) for a while, then restores it. Nobody restarts a service by hand: each must
notice the cut, retry, and pick up where the slot and the Delta commits say it was. Every
scenario ends like the fault scenarios: the workload stops, the slot passes the WAL
written, verify reports every table equal and no key is twice in Delta.

- PostgreSQL: capture's DSN names the proxy, so its replication connection, its catalog
  connection and its snapshot connections all go through it. pgbench, verify and the
  waits connect directly.
- Kafka: clients connect to the address the broker *advertises*, so the module's broker
  advertises the proxy's port (``proxied_stack``): capture's producer and control
  consumer and apply's Spark Kafka source reach the broker only through the proxy. The
  proxy reads Kafka's requests, so it can also hold the control topic's writes alone
  while reads and the change topics' writes go on.

``CDC_SOAK_SECONDS`` sets the workload length for the long form (``make soak``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from tests.plugins.capture import table_streaming
from tests.plugins.pipeline import (
    PGBENCH_TABLES,
    Pipeline,
    ProxiedStack,
    assert_lake_equals_source,
    create_database,
    dsn_through,
    one_table_pipeline,
    pgbench,
    slot_confirmed,
    start_pgbench,
    wait_caught_up,
)
from tests.plugins.tcp_proxy import Cut, TcpProxy
from tests.plugins.telemetry import status
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow
SECONDS = int(os.environ.get("CDC_SOAK_SECONDS", "30"))
RATE = "40"  # transactions per second, as in the fault scenarios
POSTGRES_CUT_S = 10
KAFKA_CUT_S = 15
BLACKHOLE_S = 20
SILENCE_S = 5  # capture's silence timeout in the blackhole scenario


@pytest.fixture
def postgres_proxy(proxied_stack: ProxiedStack) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", proxied_stack.state.postgres_port) as proxy:
        yield proxy


@pytest.fixture
def pipeline(
    proxied_stack: ProxiedStack, postgres_proxy: TcpProxy, unique_name: str, tmp_path: Path
) -> Iterator[Pipeline]:
    dsn = create_database(proxied_stack.state.postgres.dsn, unique_name)
    pgbench(dsn, "-i", "-s", "1", "-q")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE public.pgbench_history REPLICA IDENTITY FULL")
    built = Pipeline(
        name=unique_name,
        dsn=dsn,
        bootstrap=proxied_stack.bootstrap_servers,
        tables=tuple(f"public.{t}" for t in PGBENCH_TABLES),
        workdir=tmp_path,
        capture_dsn=dsn_through(dsn, postgres_proxy),
        capture_overrides={"CAPTURE_POSTGRES__SILENCE_TIMEOUT_S": str(SILENCE_S)},
    )
    yield built
    built.stop()


def _started(pipeline: Pipeline) -> None:
    """Both services run and the initial snapshot is in the lake.

    The slot is created by capture, at the WAL position of that moment, so a target read
    before it exists is passed at once. A change written after it exists is confirmed
    only once the snapshot's pin is released, i.e. once the snapshot rows are applied."""
    pipeline.capture.start()
    pipeline.apply.start()
    with psycopg.connect(pipeline.dsn, autocommit=True) as conn:
        wait_for(lambda: slot_confirmed(conn, pipeline.name) is not None, "capture's slot", 300)
        conn.execute("UPDATE public.pgbench_branches SET filler = 'started' WHERE bid = 1")
    wait_caught_up(pipeline, timeout_s=600)


def _workload(pipeline: Pipeline) -> Any:
    return start_pgbench(
        pipeline.dsn,
        "-n",
        "-c",
        "2",
        "-j",
        "1",
        "-T",
        str(SECONDS),
        "-R",
        RATE,
        log=pipeline.workdir / "pgbench.log",
    )


def _cut_for(proxy: TcpProxy, seconds: float) -> None:
    """Cut ``proxy`` (reset) for ``seconds``, then restore it."""
    proxy.cut(Cut.RESET)
    time.sleep(seconds)  # the outage itself: how long the network is away
    proxy.restore()


def _finish(spark: Any, pipeline: Pipeline, bench: Any) -> None:
    assert bench.wait(SECONDS + 120) == 0, (pipeline.workdir / "pgbench.log").read_text()
    wait_caught_up(pipeline)
    # Recovered on their own: the processes started at the beginning are still the ones
    # running, and nobody restarted them.
    assert pipeline.capture.running(), pipeline.logs()
    assert pipeline.apply.running(), pipeline.logs()
    assert pipeline.capture.kills == pipeline.apply.kills == 0
    assert_lake_equals_source(spark, pipeline)


def test_capture_cut_off_postgres_recovers_by_itself(
    spark: Any, pipeline: Pipeline, postgres_proxy: TcpProxy
) -> None:
    _started(pipeline)
    bench = _workload(pipeline)
    time.sleep(SECONDS / 4)  # let changes flow before the cut
    before = postgres_proxy.forwarded
    _cut_for(postgres_proxy, POSTGRES_CUT_S)
    # capture noticed (its connections were reset) and retried: the retry policy logged it
    # and new connections went through the proxy after the restore.
    wait_for(
        lambda: "transient failure, retrying" in pipeline.capture.log.read_text(),
        "capture to log its retry",
        60,
    )
    wait_for(lambda: postgres_proxy.forwarded > before, "capture to reconnect", 120)
    _finish(spark, pipeline, bench)


def test_capture_behind_a_dead_network_recovers_by_itself(
    spark: Any, pipeline: Pipeline, postgres_proxy: TcpProxy
) -> None:
    _started(pipeline)
    bench = _workload(pipeline)
    time.sleep(SECONDS / 4)  # let changes flow before the cut
    postgres_proxy.cut(Cut.BLACKHOLE)
    # Nothing is closed: capture notices only because the server stops answering.
    wait_for(
        lambda: "the network to it may be dead" in pipeline.capture.log.read_text(),
        "capture to take the silent connection as dead",
        BLACKHOLE_S + 60,
    )
    time.sleep(BLACKHOLE_S)  # the rest of the outage
    before = postgres_proxy.forwarded
    postgres_proxy.restore()
    wait_for(lambda: postgres_proxy.forwarded > before, "capture to reconnect", 120)
    _finish(spark, pipeline, bench)


def test_services_cut_off_kafka_recover_by_themselves(
    spark: Any, pipeline: Pipeline, proxied_stack: ProxiedStack
) -> None:
    kafka_proxy = proxied_stack.kafka_proxy
    _started(pipeline)
    bench = _workload(pipeline)
    time.sleep(SECONDS / 4)  # let changes flow before the cut
    before = kafka_proxy.forwarded
    _cut_for(kafka_proxy, KAFKA_CUT_S)
    wait_for(lambda: kafka_proxy.forwarded > before, "the Kafka clients to reconnect", 120)
    _finish(spark, pipeline, bench)


SNAPSHOT_ROWS = 2_000
APPLY_CLIENT = "apply-under-test"
FAILING_S = 15
"""How long the broker stays away once apply's publish is failing: three attempts or
more (each waits 5 s for acknowledgements, then backs off, apply/control/feedback.py), where
three failed the job before."""


def _writes(dsn: str, stop: threading.Event) -> None:
    """The operator's workload: an insert and an update every second."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        n = 0
        while not stop.wait(1.0):
            n += 1
            conn.execute("INSERT INTO public.t VALUES (%s, 'new')", [SNAPSHOT_ROWS + n])
            conn.execute("UPDATE public.t SET v = 'changed' WHERE id = %s", [n])


def test_apply_waits_out_a_broker_stopped_during_its_publish(
    spark: Any, proxied_stack: ProxiedStack, unique_name: str, tmp_path: Path
) -> None:
    """A batch read its records and committed them, and its publish to the control topic
    gets no answer (the proxy holds the control topic's writes: no race with how fast the
    batch is); then the broker stops altogether. apply stays up, not ready while the
    publish fails, and once the broker is back and answers, the publish gets through,
    the slot passes the WAL written and the lake equals the source (docs/architecture.md,
    failure model)."""
    kafka_proxy = proxied_stack.kafka_proxy
    kafka = proxied_stack.state.kafka
    pipeline = one_table_pipeline(
        proxied_stack.state,
        unique_name,
        tmp_path,
        SNAPSHOT_ROWS,
        bootstrap=proxied_stack.bootstrap_servers,
    )
    control_topic = f"{unique_name}._control"
    # Not ready a second into a run of failures, so the outage shows on /readyz at once.
    pipeline.apply.env["APPLY_METRICS__NOT_READY_AFTER_S"] = "1"
    # Named, so the proxy holds apply's writes alone: capture's checkpoints go on, and its
    # change records with them (they share its producer's connection).
    pipeline.apply.env["APPLY_KAFKA__CLIENT"] = json.dumps({"client.id": APPLY_CLIENT})
    stop_writes = threading.Event()
    writer = threading.Thread(target=_writes, args=(pipeline.dsn, stop_writes), daemon=True)
    try:
        pipeline.capture.start()
        capture_settings, _ = pipeline.settings()

        wait_for(
            lambda: table_streaming(capture_settings, "public.t"),
            f"the snapshot of public.t\n{pipeline.logs()}",
            300,
        )
        pipeline.apply.start()
        apply_url = pipeline.apply.metrics_url(timeout_s=300)
        # The snapshot's batch is committed and published (its line is logged after the
        # publish), and apply is ready.
        wait_for(
            lambda: "batch 0 table public.t: records=" in pipeline.apply.log.read_text(),
            f"apply to apply and publish the snapshot\n{pipeline.logs()}",
            300,
        )
        wait_for(lambda: status(apply_url, "/readyz") == 200, "apply to be ready", 60)
        lake = DeltaTable(pipeline.table_path("public.t"))
        assert lake.count() == SNAPSHOT_ROWS
        applied = lake.version()

        kafka_proxy.hold_writes(control_topic, client_id=APPLY_CLIENT)
        writer.start()
        # The next batch commits, its publish gets no answer, a second later apply is
        # not ready.
        refused = f"publishing to {control_topic} failed, retrying until it succeeds"
        wait_for(
            lambda: refused in pipeline.apply.log.read_text(errors="replace"),
            f"apply's publish to fail\n{pipeline.logs()}",
            120,
        )
        assert kafka_proxy.holding >= 1
        wait_for(
            lambda: status(apply_url, "/readyz") == 503,
            f"apply to turn not ready while it cannot publish\n{pipeline.logs()}",
            60,
        )
        lake.update_incremental()
        assert lake.version() > applied, "no batch was committed before the failed publish"
        # The broker itself goes while the publish waits, past the attempts that once
        # failed the job, and the operator's writes go on.
        assert kafka.stop()
        time.sleep(FAILING_S)
        assert pipeline.apply.running(), pipeline.logs()
        assert status(apply_url, "/readyz") == 503
        assert status(apply_url, "/healthz") == 200
        kafka.start()
        kafka_proxy.release_writes()
        wait_for(
            lambda: status(apply_url, "/readyz") == 200,
            f"apply to be ready again\n{pipeline.logs()}",
            120,
        )
        stop_writes.set()
        writer.join(10)
        wait_caught_up(pipeline)
        assert pipeline.apply.running(), pipeline.logs()
        assert pipeline.capture.running(), pipeline.logs()
        log = pipeline.apply.log.read_text(errors="replace")
        assert f"publishing to {control_topic} succeeded after" in log
        assert "STREAM_FAILED" not in log
        assert_lake_equals_source(spark, pipeline)
    finally:
        stop_writes.set()
        kafka_proxy.release_writes()
        if not kafka.running():
            kafka.start()
        pipeline.stop()
