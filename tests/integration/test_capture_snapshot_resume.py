"""A snapshot cut short by ``kill -9`` resumes where it stopped, against the real
PostgreSQL and Kafka, under concurrent inserts, updates (some moving rows to other
blocks) and deletes.

The test plays the apply job: it reports the records it has read as applied, which is
what lets capture publish more (the in-flight bound), and stops reporting once the
control topic says a third of the table's chunks are in Kafka. The snapshot stalls at
the bound with its workers mid-chunk, and the capture process is killed. A second
capture process then reads only the chunks left, at a new consistent point, and
publishes them at the first snapshot's position (docs/capture.md, "Resuming a
snapshot"). Then:

- the topic replays to the source table, every partition's positions strictly
  increasing, with no TRUNCATE: nothing published before the kill is undone;
- every row the second run read is in a chunk after the one the control topic named, and
  the rows read twice are at most the workers' chunks in flight (the issue's bound);
- the first run's chunks were not read again: the second run read fewer rows than the
  table holds.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer
from psycopg import sql

from capture.settings import CaptureSettings
from capture.snapshot.chunks import CHUNK_ORDINALS
from pipeline.status import collect
from pipeline.status.render import render_text
from schemas.control import TableState
from tests.plugins.capture import apply_settings_for, capture_settings, slot_active, table_status
from tests.plugins.services import Services
from tests.plugins.topics import (
    assert_positions_increase,
    end_offsets,
    read_to_end,
    replay,
    report_applied,
    schema_reader,
)
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]
REPO = Path(__file__).resolve().parents[2]
ROWS = 60_000
WORKERS = 2
CHUNK_ROWS = 2_000


_RUN_CAPTURE = """
import logging, sys, threading
from capture.service import CaptureService
from capture.settings import CaptureSettings
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
CaptureService(CaptureSettings.model_validate_json(sys.argv[1]), threading.Event()).run()
"""


def _start(settings: CaptureSettings, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", _RUN_CAPTURE, settings.model_dump_json()],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _apply_all(settings: CaptureSettings, topic: str) -> list[Any]:
    """Report every record of ``topic`` as applied, as the apply job would; its records."""
    bootstrap = settings.kafka.bootstrap_servers
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{time.time()}"})
    try:
        exists = bool(end_offsets(consumer, topic))
    finally:
        consumer.close()
    messages = read_to_end(bootstrap, topic) if exists else []
    if messages:
        report_applied(bootstrap, settings.kafka.control_topic, messages)
    return messages


def _source(pg: Connection, table: sql.Identifier) -> dict[int, tuple[int, str]]:
    rows = pg.execute(sql.SQL("SELECT id, n, v FROM {}").format(table)).fetchall()
    return {int(str(i)): (int(str(n)), str(v)) for i, n, v in rows}


def _lake(messages: list[Any], reader: Any, topic: str) -> dict[int, tuple[int, str]]:
    rows = replay(reader, messages).get(topic, {})
    return {int(r["id"]): (int(r["n"]), str(r["v"])) for r in rows.values()}


def _writer(dsn: str, table: sql.Identifier, stop: threading.Event) -> None:
    """Updates, deletes and inserts all over the table until ``stop``; a longer ``v``
    does not fit its block and moves the row, possibly into a chunk already read."""
    rng = random.Random(5)
    next_id = ROWS + 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            key = rng.randint(1, ROWS)
            if key % 7 == 0:
                conn.execute(
                    sql.SQL("UPDATE {} SET n = n + 1, v = repeat('y', 300) WHERE id = %s").format(
                        table
                    ),
                    [key],
                )
            elif key % 5 == 0:
                conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(table), [key])
                conn.execute(
                    sql.SQL("INSERT INTO {} VALUES (%s, 0, 'new')").format(table), [next_id]
                )
                next_id += 1
            else:
                conn.execute(sql.SQL("UPDATE {} SET n = n + 1 WHERE id = %s").format(table), [key])
            time.sleep(0.002)


def test_a_snapshot_killed_midway_resumes_after_its_published_chunks(
    services: Services, pg: Connection, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    table = sql.Identifier(name, "big")
    qualified = f"{name}.big"
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, n int, v text)").format(table))
    pg.execute(
        sql.SQL("INSERT INTO {} SELECT g, 0, repeat('x', 50) FROM generate_series(1, %s) g").format(
            table
        ),
        [ROWS],
    )
    pg.execute(sql.SQL("ANALYZE {}").format(table))
    settings = capture_settings(services, name, [qualified], snapshot_mode="initial")
    settings = settings.model_copy(
        update={
            "snapshot_workers": WORKERS,
            "snapshot_chunk_rows": CHUNK_ROWS,
            "max_in_flight_records": 3000,
            # Paced by the lake, so the test's applying (or not) decides where it stalls.
            "snapshot_pace": "lake",
        }
    )
    bootstrap, topic = services.kafka_bootstrap_servers, f"{name}.{name}.big"
    log = tmp_path / "capture.log"
    stop_writing = threading.Event()
    writer = threading.Thread(
        target=_writer, args=(services.postgres_dsn, table, stop_writing), daemon=True
    )
    writer.start()
    capture = _start(settings, log)
    second: subprocess.Popen[bytes] | None = None
    try:
        # Apply what arrives until a third of the chunks are recorded as in Kafka.
        def a_third_recorded() -> bool:
            _apply_all(settings, topic)
            status = table_status(settings, qualified)
            return status is not None and status.resume is not None and status.resume.chunk >= 10

        wait_for(a_third_recorded, f"no chunk was recorded as published; {log.read_text()}", 180)
        # Nothing is applied any more: capture stalls at its in-flight bound, mid-chunk.
        stalled_at = -1

        def stalled() -> bool:
            nonlocal stalled_at
            count = len(read_to_end(bootstrap, topic))
            still, stalled_at = count == stalled_at, count
            return still

        wait_for(stalled, "capture kept publishing without anything applied", 60)
        capture.send_signal(signal.SIGKILL)
        capture.wait(30)
        before_kill = read_to_end(bootstrap, topic)
        cut = table_status(settings, qualified)
        assert cut is not None
        assert cut.state is TableState.SNAPSHOT
        assert cut.resume is not None
        assert cut.snapshot_lsn is not None
        wait_for(lambda: not slot_active(pg, name), "the killed capture's slot stayed active", 60)
        # `pipeline status` tells the operator where a restart goes on.
        status = collect(settings, apply_settings_for(settings, tmp_path))
        (view,) = [t for t in status.tables if t.table == qualified]
        assert view.capture_state is TableState.SNAPSHOT
        assert view.snapshot_resume == cut.resume
        assert f"a restart goes on from chunk {cut.resume.chunk})" in render_text(status)

        second = _start(settings, log)

        def streaming() -> bool:
            _apply_all(settings, topic)
            status = table_status(settings, qualified)
            return status is not None and status.state is TableState.STREAMING

        wait_for(streaming, f"the resumed snapshot never finished; {log.read_text()}", 300)
        stop_writing.set()
        writer.join(30)
        reader = schema_reader(bootstrap, settings.kafka.schema_topic, 1)

        def equal() -> bool:
            messages = _apply_all(settings, topic)
            return _lake(messages, reader, topic) == _source(pg, table)

        wait_for(equal, "the topic never replayed to the source table", 120)
        assert second.poll() is None, log.read_text()
    finally:
        stop_writing.set()
        for process in (capture, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(30)
        wait_for(lambda: not slot_active(pg, name), "the slot stayed active", 60)
        pg.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            [name],
        )

    messages = read_to_end(bootstrap, topic)
    print(f"cut short at {cut}; the log:\n{log.read_text()}")
    assert_positions_increase(reader, messages)
    values = [(m, reader.decode_value(m.value())) for m in messages if m.value() is not None]
    assert not [v for _, v in values if v["op"] == "TRUNCATE"], "nothing published is undone"
    first_offsets = {(m.partition(), m.offset()) for m in before_kill}
    reads = [(m, v) for m, v in values if v["op"] == "READ"]
    assert {v["commit_lsn"] for _, v in reads} == {cut.snapshot_lsn}, "one position"
    first = [(m, v) for m, v in reads if (m.partition(), m.offset()) in first_offsets]
    resumed = [(m, v) for m, v in reads if (m.partition(), m.offset()) not in first_offsets]
    assert resumed, "the second run read the chunks left"
    assert min(v["ordinal"] // CHUNK_ORDINALS for _, v in resumed) > cut.resume.chunk, (
        "the resumed rows sort after every row of the chunk that was cut short"
    )
    # Rows of chunks the control topic had not recorded yet were published, then read again.
    per_chunk = Counter(v["ordinal"] // CHUNK_ORDINALS for _, v in reads)
    reread = sum(1 for _, v in first if v["ordinal"] // CHUNK_ORDINALS >= cut.resume.chunk)
    print(
        f"resumed at chunk {cut.resume.chunk} (block {cut.resume.block}): {reread} rows read "
        f"twice; {len(first)} rows read before the kill, {len(resumed)} after"
    )
    assert reread <= WORKERS * max(per_chunk.values())
    # The recorded chunks were not read again: only rows the writer moved out of their
    # blocks since (a seventh of the keys at most) can be in both runs.
    done = {
        reader.decode_key(m.key())["id"]
        for m, v in first
        if v["ordinal"] // CHUNK_ORDINALS < cut.resume.chunk
    }
    again = {reader.decode_key(m.key())["id"] for m, _ in resumed}
    assert len(done) >= 10 * CHUNK_ROWS * 0.9, f"the first run recorded {len(done)} rows"
    assert len(done & again) < len(done) / 2, f"{len(done & again)} of {len(done)} read again"
