"""``make demo``: the pipeline end to end on the local stack, under a steady workload.

1. starts PostgreSQL and Kafka (``deploy.local``; or uses the services named by
   ``CDC_POSTGRES_DSN`` / ``CDC_KAFKA_BOOTSTRAP_SERVERS``), creates a small shop schema:
   related tables with keys of different types (bigint, text, uuid, a composite key), a
   wide table whose bodies PostgreSQL stores out of line (TOAST), and a quiet table;
2. starts ``python -m capture`` and ``python -m apply`` as processes, exactly as a user
   runs them (their logs go to ``.local/demo/*.log``), and waits for the initial snapshot
   to be in Delta;
3. drives a steady write workload for ``--seconds`` while printing live progress from
   ``python -m pipeline status``: changes per second reaching Kafka, per-table lag in
   seconds and bytes, the WAL the slot retains;
4. stops the workload, waits until the lake has everything, runs ``python -m pipeline
   verify`` (the lake equals the source, row for row), and shows how to read the Delta
   tables.

Every run starts clean: demo schema, slot, topics and lake are recreated. Ctrl-C stops
the workload and both services cleanly (SIGTERM, as an orchestrator would). The stack is
left running for ``python -m pipeline status`` and friends; ``make down`` stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import TopicPartition
from psycopg import sql

from apply.settings import ApplySettings, LakeSettings
from apply.settings import KafkaSettings as ApplyKafka
from capture.settings import CaptureSettings, PostgresSettings
from capture.settings import KafkaSettings as CaptureKafka
from deploy.local import stack
from deploy.local.jars import PROJECT_ROOT, resolve
from deploy.local.process import free_port
from deploy.local.service_process import ServiceExited, ServiceProcess
from pipeline.status import PipelineStatus, StatusReader
from schemas.control import TableState
from schemas.lsn import Lsn, parse_lsn

SCHEMA = "demo"
SLOT = "demo_slot"
PREFIX = "demo"
TABLES = ("regions", "customers", "products", "orders", "order_items", "documents")
DEMO_ROOT = PROJECT_ROOT / ".local" / "demo"
CUSTOMERS, PRODUCTS, DOCUMENTS = 2_000, 200, 60

SCHEMA_DDL = """
CREATE TABLE demo.regions (code char(2) PRIMARY KEY, name text NOT NULL);
CREATE TABLE demo.customers (
    id bigint PRIMARY KEY, name text NOT NULL, email text, region char(2) NOT NULL,
    created timestamptz NOT NULL DEFAULT now());
CREATE TABLE demo.products (
    sku text PRIMARY KEY, title text NOT NULL, price numeric(10,2) NOT NULL, tags text[]);
CREATE TABLE demo.orders (
    id uuid PRIMARY KEY, customer_id bigint NOT NULL, status text NOT NULL,
    placed timestamptz NOT NULL, total numeric(12,2) NOT NULL);
CREATE TABLE demo.order_items (
    order_id uuid NOT NULL, line int NOT NULL, sku text NOT NULL, qty int NOT NULL,
    PRIMARY KEY (order_id, line));
CREATE TABLE demo.documents (
    id bigint PRIMARY KEY, title text NOT NULL, body text NOT NULL, revision int NOT NULL,
    edited timestamptz NOT NULL);
"""

PREFILL = """
INSERT INTO demo.regions VALUES ('eu', 'Europe'), ('na', 'North America'),
    ('sa', 'South America'), ('as', 'Asia'), ('af', 'Africa');
INSERT INTO demo.customers (id, name, email, region)
    SELECT g, 'customer ' || g, 'c' || g || '@example.com',
           (ARRAY['eu','na','sa','as','af'])[1 + g % 5]
    FROM generate_series(1, {customers}) g;
INSERT INTO demo.products
    SELECT 'sku-' || lpad(g::text, 4, '0'), 'product ' || g, 1 + (g * 37 % 5000) / 100.0,
           CASE WHEN g % 3 = 0 THEN ARRAY['sale', NULL] ELSE ARRAY['new'] END
    FROM generate_series(1, {products}) g;
INSERT INTO demo.documents
    SELECT g, 'document ' || g,
           (SELECT string_agg(md5((g * 1000 + i)::text), ' ') FROM generate_series(1, 900) i),
           1, now()
    FROM generate_series(1, {documents}) g;
"""


def say(text: str) -> None:
    print(f"demo: {text}", flush=True)


@dataclass(frozen=True, slots=True)
class Services:
    dsn: str
    bootstrap: str


def start_services() -> Services:
    dsn = os.environ.get("CDC_POSTGRES_DSN")
    bootstrap = os.environ.get("CDC_KAFKA_BOOTSTRAP_SERVERS")
    if dsn and bootstrap:
        say("using the PostgreSQL and Kafka named by CDC_POSTGRES_DSN, CDC_KAFKA_BOOTSTRAP_SERVERS")
        return Services(dsn, bootstrap)
    say("starting PostgreSQL and Kafka (make up)")
    state = stack.up()
    return Services(state.postgres.dsn, state.kafka.bootstrap_servers)


def prepare_source(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
        "WHERE slot_name = %s AND NOT active",
        [SLOT],
    )
    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(SLOT)))
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    conn.execute(SCHEMA_DDL)
    conn.execute(
        PREFILL.format(customers=CUSTOMERS, products=PRODUCTS, documents=DOCUMENTS).encode()
    )


def reset_kafka(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{PREFIX}.")]
    for future in admin.delete_topics(existing).values() if existing else []:
        future.result(30)
    # Deletion is asynchronous on the broker; capture must not find the old topics.
    deadline = time.monotonic() + 60
    while any(t.startswith(f"{PREFIX}.") for t in admin.list_topics(timeout=10).topics):
        if time.monotonic() > deadline:
            raise SystemExit("demo: old demo topics are still being deleted; run it again")
        time.sleep(0.5)


class Workload:
    """A shop's writes: orders with items, status changes, customer edits, document
    revisions that leave the TOASTed body unchanged (so the stream omits it), now and then
    a new body, and deletes. ``regions`` is never written: the quiet table."""

    def __init__(self, dsn: str, rate: float, stop: threading.Event) -> None:
        self._dsn = dsn
        self._interval = 1.0 / rate
        self._stop = stop
        self._random = random.Random(7)  # noqa: S311 - a workload, not a secret
        self._orders: list[uuid.UUID] = []
        self.transactions = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self._dsn, autocommit=True) as conn:
                next_at = time.monotonic()
                while not self._stop.is_set():
                    with conn.transaction():
                        self._one(conn)
                    self.transactions += 1
                    next_at += self._interval
                    self._stop.wait(max(0.0, next_at - time.monotonic()))
        except BaseException as exc:  # reported by the main thread
            self.failure = exc

    def _one(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        r = self._random
        kind = r.random()
        if kind < 0.45 or not self._orders:
            order = uuid.UUID(int=r.getrandbits(128), version=4)
            lines = r.randint(1, 4)
            conn.execute(
                "INSERT INTO demo.orders VALUES (%s, %s, 'new', now(), 0)",
                [order, r.randint(1, CUSTOMERS)],
            )
            for line in range(1, lines + 1):
                conn.execute(
                    "INSERT INTO demo.order_items VALUES (%s, %s, %s, %s)",
                    [order, line, f"sku-{r.randint(1, PRODUCTS):04d}", r.randint(1, 5)],
                )
            conn.execute(
                "UPDATE demo.orders o SET total = (SELECT sum(i.qty * p.price) FROM "
                "demo.order_items i JOIN demo.products p USING (sku) WHERE i.order_id = o.id) "
                "WHERE o.id = %s",
                [order],
            )
            self._orders.append(order)
        elif kind < 0.70:
            status = r.choice(["paid", "shipped", "delivered"])
            conn.execute(
                "UPDATE demo.orders SET status = %s WHERE id = %s",
                [status, r.choice(self._orders)],
            )
        elif kind < 0.80:
            customer = r.randint(1, CUSTOMERS)
            email = None if r.random() < 0.2 else f"c{customer}.{r.randint(1, 99)}@example.org"
            conn.execute("UPDATE demo.customers SET email = %s WHERE id = %s", [email, customer])
        elif kind < 0.90:
            conn.execute(
                "UPDATE demo.documents SET revision = revision + 1, edited = now() WHERE id = %s",
                [r.randint(1, DOCUMENTS)],
            )
        elif kind < 0.93:
            document = r.randint(1, DOCUMENTS)
            conn.execute(
                "UPDATE demo.documents SET body = repeat(md5(%s::text), 1000), "
                "revision = revision + 1, edited = now() WHERE id = %s",
                [r.random(), document],
            )
        elif kind < 0.97:
            conn.execute(
                "UPDATE demo.products SET price = price + 0.01 WHERE sku = %s",
                [f"sku-{r.randint(1, PRODUCTS):04d}"],
            )
        else:
            order = self._orders.pop(r.randrange(len(self._orders)))
            conn.execute("DELETE FROM demo.order_items WHERE order_id = %s", [order])
            conn.execute("DELETE FROM demo.orders WHERE id = %s", [order])


@dataclass(frozen=True, slots=True)
class MetricsPorts:
    """Where each service serves /metrics, /healthz and /readyz: free ports chosen per
    run, so a demo never clashes with another one or with services on the defaults."""

    capture: int
    apply: int


def service_env(services: Services, root: Path, ports: MetricsPorts) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CAPTURE_", "APPLY_"))}
    return {
        **base,
        "CAPTURE_METRICS__PORT": str(ports.capture),
        "APPLY_METRICS__PORT": str(ports.apply),
        "CAPTURE_POSTGRES__DSN": services.dsn,
        "CAPTURE_POSTGRES__SLOT": SLOT,
        "CAPTURE_POSTGRES__PUBLICATION": SLOT,
        "CAPTURE_POSTGRES__TABLES": json.dumps([f"{SCHEMA}.{t}" for t in TABLES]),
        "CAPTURE_KAFKA__BOOTSTRAP_SERVERS": services.bootstrap,
        "CAPTURE_KAFKA__TOPIC_PREFIX": PREFIX,
        "CAPTURE_KAFKA__CONTROL_TOPIC": f"{PREFIX}._control",
        "CAPTURE_KAFKA__SCHEMA_TOPIC": f"{PREFIX}._schemas",
        "CAPTURE_STATUS_INTERVAL_S": "1",
        "APPLY_KAFKA__BOOTSTRAP_SERVERS": services.bootstrap,
        "APPLY_KAFKA__TOPIC_PREFIX": PREFIX,
        "APPLY_KAFKA__CONTROL_TOPIC": f"{PREFIX}._control",
        "APPLY_KAFKA__SCHEMA_TOPIC": f"{PREFIX}._schemas",
        "APPLY_LAKE__ROOT": str(root / "lake"),
        "APPLY_LAKE__CHECKPOINT_ROOT": str(root / "checkpoints"),
        "APPLY_TRIGGER__INTERVAL": "2 seconds",
        "APPLY_SPARK__MASTER": "local[2]",
        "APPLY_SPARK__CONF": json.dumps(
            {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"}
        ),
    }


def settings(services: Services, root: Path) -> tuple[CaptureSettings, ApplySettings]:
    kafka = {
        "bootstrap_servers": services.bootstrap,
        "topic_prefix": PREFIX,
        "control_topic": f"{PREFIX}._control",
        "schema_topic": f"{PREFIX}._schemas",
    }
    capture = CaptureSettings(
        postgres=PostgresSettings(
            dsn=services.dsn,
            slot=SLOT,
            publication=SLOT,
            tables=[f"{SCHEMA}.{t}" for t in TABLES],
        ),
        kafka=CaptureKafka(**kafka),
    )
    apply = ApplySettings(
        kafka=ApplyKafka(**kafka),
        lake=LakeSettings(root=str(root / "lake"), checkpoint_root=str(root / "checkpoints")),
    )
    return capture, apply


def topic_records(consumer: Consumer, topics: list[str]) -> int:
    """Records on the change topics right now (high watermarks summed)."""
    total = 0
    for topic in topics:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            continue
        for partition in metadata.partitions:
            try:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
            except KafkaException:
                continue  # a topic created a moment ago may have no leader yet
            total += high
    return total


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def progress_line(status: PipelineStatus, elapsed: float, changes_per_s: float) -> str:
    lags = []
    for table in status.tables:
        name = table.table.split(".", 1)[1]
        seconds = "?" if table.lag_s is None else f"{table.lag_s:.1f}s"
        lags.append(f"{name} {seconds}/{human_bytes(table.lag_bytes)}")
    return (
        f"  t={elapsed:4.0f}s  {changes_per_s:6.0f} changes/s to Kafka  "
        f"retained WAL {human_bytes(status.slot.retained_bytes)}  lag: {', '.join(lags)}"
    )


def wait(
    predicate: Callable[[], bool], what: str, timeout_s: float, check: Callable[[], None]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        check()
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def wal_lsn(conn: psycopg.Connection[tuple[object, ...]]) -> Lsn:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(str(row[0]))


def confirmed(conn: psycopg.Connection[tuple[object, ...]]) -> Lsn | None:
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [SLOT]
    ).fetchone()
    return None if row is None or row[0] is None else parse_lsn(str(row[0]))


def snapshot_applied(status: PipelineStatus) -> bool:
    """Every demo table's snapshot is in its Delta table: capture streams the table (its
    snapshot is published), and nothing of it waits in Kafka for apply (a table with no
    rows yet has nothing to apply). The workload starts then, so its lag is the
    pipeline's, not the job's start."""
    views = {view.table: view for view in status.tables}
    return all(
        (view := views.get(f"{SCHEMA}.{table}")) is not None
        and view.capture_state is TableState.STREAMING
        and view.waiting == 0
        for table in TABLES
    )


def caught_up(conn: psycopg.Connection[tuple[object, ...]], target: Lsn) -> bool:
    position = confirmed(conn)
    return position is not None and position >= target


def run(seconds: float, rate: float, root: Path, stop: threading.Event) -> int:
    resolve("spark")
    services = start_services()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ports = MetricsPorts(capture=free_port(), apply=free_port())
    env = service_env(services, root, ports)
    capture = ServiceProcess(
        "capture", [sys.executable, "-m", "capture"], env, root / "capture.log"
    )
    apply = ServiceProcess("apply", [sys.executable, "-m", "apply"], env, root / "apply.log")

    def check() -> None:
        capture.check()
        apply.check()
        if stop.is_set():
            raise KeyboardInterrupt

    with psycopg.connect(services.dsn, autocommit=True) as conn:
        say(f"creating schema {SCHEMA}: {', '.join(TABLES)} (documents hold ~30 kB TOASTed bodies)")
        prepare_source(conn)
        reset_kafka(services.bootstrap)
        capture_settings, apply_settings = settings(services, root)
        try:
            say(f"starting python -m capture and python -m apply (logs in {root})")
            capture.start()
            apply.start()
            for name, port in (("capture", ports.capture), ("apply", ports.apply)):
                say(f"{name}: http://127.0.0.1:{port}/metrics (also /healthz, /readyz)")
            start = wal_lsn(conn)
            with StatusReader(capture_settings, apply_settings) as snapshot_reader:
                # The slot is confirmed at once (nothing is in flight yet); the snapshot
                # is in Delta once every table streams and apply holds all it was sent.
                wait(
                    lambda: caught_up(conn, start) and snapshot_applied(snapshot_reader.read()),
                    "the initial snapshot to reach Delta (see the logs above)",
                    600,
                    check,
                )
            say("initial snapshot in Delta; every table streams")
            topics = [f"{PREFIX}.{SCHEMA}.{t}" for t in TABLES]
            stop_workload = threading.Event()
            workload = Workload(services.dsn, rate, stop_workload)
            writer = threading.Thread(target=workload.run, name="workload", daemon=True)
            consumer = Consumer({"bootstrap.servers": services.bootstrap, "group.id": "demo"})
            say(f"workload: ~{rate:.0f} transactions/s for {seconds:.0f} s; live progress:")
            began = time.monotonic()
            writer.start()
            with StatusReader(capture_settings, apply_settings) as reader:
                before, before_at = topic_records(consumer, topics), time.monotonic()
                while time.monotonic() - began < seconds:
                    stop.wait(3)
                    check()
                    if workload.failure is not None:
                        raise SystemExit(f"demo: the workload failed: {workload.failure}")
                    records, now = topic_records(consumer, topics), time.monotonic()
                    rate_now = (records - before) / (now - before_at)
                    before, before_at = records, now
                    print(progress_line(reader.read(), now - began, rate_now), flush=True)
                stop_workload.set()
                writer.join(30)
                end = wal_lsn(conn)
                say(f"workload stopped after {workload.transactions} transactions; catching up")
                wait(lambda: caught_up(conn, end), "the lake to catch up", 600, check)
                print(progress_line(reader.read(), time.monotonic() - began, 0.0), flush=True)
            consumer.close()
            say("python -m pipeline verify (the lake against the source, row for row):")
            verify_log = root / "verify.log"
            # The report is verify's standard output; its standard error is Spark's own
            # log (JVM WARN lines a newcomer cannot act on), kept beside the services'.
            with verify_log.open("w") as log_file:
                verified = subprocess.run(
                    [sys.executable, "-m", "pipeline", "verify", "--timeout", "300"],
                    cwd=PROJECT_ROOT,
                    env=env,
                    stderr=log_file,
                    check=False,
                )
            if verified.returncode != 0:
                tail = verify_log.read_text(errors="replace").splitlines()[-15:]
                say(f"verify exited {verified.returncode}; the end of {verify_log}:")
                print("\n".join(tail), flush=True)
            show_lake(root)
            return verified.returncode
        finally:
            say("stopping apply and capture (SIGTERM)")
            apply.stop()
            capture.stop()
            say("stack left running: `python -m pipeline status` works on it; `make down` stops it")


def show_lake(root: Path) -> None:
    lake = root / "lake"
    say(f"Delta tables under {lake}/{SCHEMA}/<table>; read them with PySpark:")
    print(
        f"""
    .venv/bin/python -m apply jars   # the jars, for --jars / spark.jars
    from apply.settings import SparkSettings
    from apply.engine.spark_jars import configured_jars
    from apply.engine.spark_session import build_session
    spark = build_session(SparkSettings(), configured_jars(SparkSettings()))
    spark.read.format("delta").load("{lake}/{SCHEMA}/orders").groupBy("status").count().show()
    spark.sql("DESCRIBE HISTORY delta.`{lake}/{SCHEMA}/orders`").select(
        "version", "operation", "userMetadata").show(truncate=False)
""",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.demo", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="workload length")
    parser.add_argument("--rate", type=float, default=40.0, help="transactions per second")
    parser.add_argument(
        "--root", type=Path, default=DEMO_ROOT, help="lake, checkpoints and logs (recreated)"
    )
    arguments = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        return run(arguments.seconds, arguments.rate, arguments.root, stop)
    except ServiceExited as exc:
        say(str(exc))
        return 1
    except KeyboardInterrupt:
        say("interrupted: stopped cleanly")
        return 130


if __name__ == "__main__":
    sys.exit(main())
