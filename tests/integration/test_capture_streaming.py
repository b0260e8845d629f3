"""Capture with ``CAPTURE_STREAMING`` against a real server that streams transactions in
progress: the records are those of the same transactions unstreamed, nothing rolled
back is published, and a capture killed in the middle of a streamed transaction loses
and duplicates nothing once restarted (docs/streaming.md).

The streaming captures connect as a role of this module's own whose
``logical_decoding_work_mem`` is the minimum, 64 kB: the walsender decodes with its
session's value, capture's replication connection takes no session option from the
DSN, and the server is shared with other tests, so the setting lives on the role. A few
thousand rows are then streamed in many blocks.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from capture.metrics import CaptureMetrics
from capture.settings import CaptureSettings
from tests.plugins.capture import (
    CaptureProcess,
    CaptureThread,
    capture_settings,
)
from tests.plugins.services import Services
from tests.plugins.topics import (
    assert_positions_increase,
    read_to_end,
    record_count,
    schema_reader,
)
from tests.plugins.waiting import wait_for

Connection = psycopg.Connection[tuple[object, ...]]
PART = 1500
"""Rows per part of a transaction: about 350 kB of changes, several 64 kB blocks."""
SENTINEL = 1_000_000
"""The key of a small transaction written last: once its record is in, everything
before it has been received."""
STREAMED_LOG = "is streamed in progress"
FIRST_ADDED = 10_000
"""The first key of the rows written after a column was added."""
ADDED = 200
"""Rows written after each added column."""


@pytest.fixture(scope="module")
def streaming_dsn(services: Services) -> Iterator[str]:
    """A DSN of a superuser role whose sessions decode with 64 kB (module docstring)."""
    name = f"t_streaming_{uuid.uuid4().hex[:8]}"
    role = sql.Identifier(name)
    with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(role))
        admin.execute(sql.SQL("ALTER ROLE {} SET logical_decoding_work_mem = '64kB'").format(role))
    yield make_conninfo(services.postgres_dsn, user=name)
    with psycopg.connect(services.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(role))
        admin.execute(sql.SQL("DROP ROLE {}").format(role))


def _streaming(settings: CaptureSettings, dsn: str, spool: Path) -> CaptureSettings:
    postgres = settings.postgres.model_copy(update={"dsn": dsn})
    return settings.model_copy(update={"streaming": True, "postgres": postgres, "spool_dir": spool})


def _create(pg: Connection, name: str) -> sql.Identifier:
    table = sql.Identifier("public", name)
    pg.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(table))
    return table


def _insert(conn: Connection, table: sql.Identifier, first: int, last: int) -> None:
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, repeat('x', 200) FROM generate_series(%s::int, %s::int) g"
        ).format(table),
        [first, last],
    )


def _streamed(pg: Connection, slot: str) -> tuple[int, int]:
    """The transactions the slot's walsender streamed, and their bytes
    (``pg_stat_replication_slots``)."""
    row = pg.execute(
        "SELECT stream_txns, stream_bytes FROM pg_stat_replication_slots WHERE slot_name = %s",
        [slot],
    ).fetchone()
    return (0, 0) if row is None else (int(str(row[0])), int(str(row[1])))


def _wait_streamed(pg: Connection, slot: str, transactions: int, more_than: int) -> int:
    """Until the slot's walsender streamed ``transactions`` transactions and more than
    ``more_than`` bytes; the bytes. A rollback waits for this: PostgreSQL 18 drops a
    transaction it finds aborted when its memory runs out, instead of streaming it, and
    the walsender may decode the changes only after the rollback (17 and earlier stream
    it and send Stream Abort)."""
    wait_for(
        lambda: _streamed(pg, slot)[0] >= transactions and _streamed(pg, slot)[1] > more_than,
        f"the server never streamed {transactions} transaction(s), more than {more_than} bytes",
        20,
        detail=lambda: str(_streamed(pg, slot)),
    )
    return _streamed(pg, slot)[1]


def _metric(metrics: CaptureMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(f"cdc_capture_{name}")


def _records(
    settings: CaptureSettings, table: str, expected: int
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The decoded key and value of every record of ``table``'s topic, in position order
    (each partition's checked to increase), once ``expected`` records are in and the
    last is the sentinel's: nothing committed before it can come later."""
    bootstrap = settings.kafka.bootstrap_servers
    topic = f"{settings.kafka.topic_prefix}.public.{table}"
    wait_for(
        lambda: record_count(bootstrap, topic) >= expected,
        f"{topic} never held {expected} records",
        60,
    )
    reader = schema_reader(bootstrap, settings.kafka.schema_topic, 1)
    messages = read_to_end(bootstrap, topic)
    assert_positions_increase(reader, messages)
    records = [(reader.decode_key(m.key()), reader.decode_value(m.value())) for m in messages]
    records.sort(key=lambda kv: (kv[1]["commit_lsn"], kv[1]["ordinal"]))
    assert int(records[-1][0]["id"]) == SENTINEL
    return records


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-stream", "python-loop"])
def test_streamed_transactions_publish_the_unstreamed_records_and_nothing_rolled_back(
    services: Services,
    pg: Connection,
    unique_name: str,
    streaming_dsn: str,
    tmp_path: Path,
    compiled: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``compiled``: the streaming capture spools the blocks' rows and replays through
    the compiled stream, or with ``CAPTURE_COMPILED_STREAM=false`` through the Python
    loop.

    The streamed transactions: one with a rolled-back savepoint that added a column; one
    rolled back whole; and one open while another transaction adds a column to the table,
    that then writes rows under it, adds a column itself and writes rows again. Rows are
    encoded as they arrive, each by the table as it was when it was written, and make the
    records of the unstreamed path."""
    caplog.set_level(logging.INFO, logger="capture.stream.loop")
    name = unique_name
    table = _create(pg, name)
    other = _create(pg, f"{name}_o")
    tables = [f"public.{name}", f"public.{name}_o"]
    settings = _streaming(capture_settings(services, f"{name}_s", tables), streaming_dsn, tmp_path)
    metrics = CaptureMetrics()
    streamed = CaptureThread(
        settings.model_copy(update={"compiled_stream": compiled}), metrics=metrics
    )
    unstreamed = CaptureThread(capture_settings(services, f"{name}_u", tables))
    streamed.start(pg)
    unstreamed.start(pg)
    try:
        slot = f"{name}_s"
        with psycopg.connect(services.postgres_dsn) as writer:
            _insert(writer, table, 1, PART)
            streamed_bytes = _wait_streamed(pg, slot, 1, 0)
            # The open transaction's spool, as the metrics show it (the loop sets them at
            # every status interval).
            wait_for(
                lambda: (
                    (_metric(metrics, "streamed_spool_bytes") or 0) > 0
                    and _metric(metrics, "streamed_open_transactions") == 1
                ),
                "the metrics never showed the open streamed transaction's spool",
                20,
            )
            # A savepoint that changes the table's shape, writes under it, is streamed, and
            # rolls back.
            writer.execute("SAVEPOINT s")
            writer.execute(sql.SQL("ALTER TABLE {} ADD COLUMN extra int DEFAULT 7").format(table))
            _insert(writer, table, PART + 1, 2 * PART)
            streamed_bytes = _wait_streamed(pg, slot, 1, streamed_bytes)
            writer.execute("ROLLBACK TO SAVEPOINT s")
            _insert(writer, table, 2 * PART + 1, 3 * PART)
            writer.commit()
            # A whole transaction rolled back after the server streamed some of it.
            _insert(writer, table, 3 * PART + 1, 4 * PART)
            streamed_bytes = _wait_streamed(pg, slot, 2, streamed_bytes)
            writer.rollback()
            # Schema changes while a streamed transaction is open: a column added by
            # another transaction, then one by the streamed transaction itself.
            with psycopg.connect(services.postgres_dsn) as concurrent:
                _insert(concurrent, other, 1, PART)
                _wait_streamed(pg, slot, 3, streamed_bytes)
                writer.execute(sql.SQL("ALTER TABLE {} ADD COLUMN note text").format(table))
                writer.commit()
                concurrent.execute(
                    sql.SQL(
                        "INSERT INTO {} SELECT g, repeat('x', 200), 'n' || g "
                        "FROM generate_series(%s::int, %s::int) g"
                    ).format(table),
                    [FIRST_ADDED, FIRST_ADDED + ADDED - 1],
                )
                concurrent.execute(sql.SQL("ALTER TABLE {} ADD COLUMN rank int").format(table))
                concurrent.execute(
                    sql.SQL(
                        "INSERT INTO {} SELECT g, repeat('x', 200), 'n' || g, mod(g, 7) "
                        "FROM generate_series(%s::int, %s::int) g"
                    ).format(table),
                    [FIRST_ADDED + ADDED, FIRST_ADDED + 2 * ADDED - 1],
                )
                concurrent.commit()
            _insert(writer, table, SENTINEL, SENTINEL)
            writer.commit()
        expected = 2 * PART + 2 * ADDED + 1
        streamed_records = _records(streamed.settings, name, expected)
        unstreamed_records = _records(unstreamed.settings, name, expected)
        assert not streamed.errors, streamed.errors
    finally:
        streamed.close(pg)
        unstreamed.close(pg)
    # The bytes the compiled stream spooled itself, from the streaming capture's last
    # words (the unstreamed one streams nothing and says nothing of it).
    (spooled,) = [
        int(str(record.args[2]))
        for record in caplog.records
        if record.msg.startswith("transactions streamed in progress")
        and isinstance(record.args, tuple)
    ]
    assert (spooled > 0) is compiled
    # The three transactions above streamed (one rolled back), and possibly more: the
    # walsender decodes the whole server's WAL with 64 kB, so another test's big
    # transaction on the shared server is streamed too (a Stream Start, no row of a
    # published table; one CI run counted four). None open and nothing spooled once the
    # attempt ended.
    assert (_metric(metrics, "streamed_transactions_total") or 0) >= 3
    assert _metric(metrics, "streamed_open_transactions") == 0
    assert _metric(metrics, "streamed_spool_bytes") == 0
    kept = [*range(1, PART + 1), *range(2 * PART + 1, 3 * PART + 1)]
    added = list(range(FIRST_ADDED, FIRST_ADDED + 2 * ADDED))
    assert [int(key["id"]) for key, _ in streamed_records] == [*kept, *added, SENTINEL]
    # Field for field, positions included: the records of the same transactions sent
    # whole at their commit.
    assert streamed_records == unstreamed_records
    assert all("extra" not in value["after"] for _, value in streamed_records)
    first, altered = streamed_records[: len(kept)], streamed_records[len(kept) : -1]
    # The second's ordinals follow the rows it wrote to the other table first.
    for transaction, start in ((first, 0), (altered, PART)):
        assert len({value["commit_lsn"] for _, value in transaction}) == 1
        ordinals = [value["ordinal"] for _, value in transaction]
        assert ordinals == list(range(start, start + len(transaction)))
    # Each row as the table was when it was written: the rows before the second column
    # was added have only the first.
    assert [sorted(value["after"]) for _, value in altered] == [
        *[["id", "note", "v"]] * ADDED,
        *[["id", "note", "rank", "v"]] * ADDED,
    ]
    assert altered[-1][1]["after"]["rank"] == added[-1] % 7


def test_capture_killed_mid_stream_publishes_the_transaction_once_after_a_restart(
    services: Services,
    pg: Connection,
    unique_name: str,
    streaming_dsn: str,
    tmp_path: Path,
) -> None:
    name = unique_name
    table = _create(pg, name)
    settings = _streaming(
        capture_settings(services, name, [f"public.{name}"]), streaming_dsn, tmp_path / "spool"
    )
    log = tmp_path / "capture.log"
    first = CaptureProcess(settings, log)
    second = CaptureProcess(settings, log)

    def streamed_starts() -> int:
        return log.read_text().count(STREAMED_LOG)

    first.start(pg)
    try:
        with psycopg.connect(services.postgres_dsn) as writer:
            _insert(writer, table, 1, PART)
            wait_for(
                lambda: streamed_starts() >= 1,
                "capture never received a block of the transaction",
                60,
                detail=log.read_text,
            )
            first.kill(pg)
            _insert(writer, table, PART + 1, 2 * PART)
            second.start(pg)
            # The new walsender streams the open transaction again from its first change.
            wait_for(
                lambda: streamed_starts() >= 2,
                "the restarted capture never received the transaction streamed again",
                60,
                detail=log.read_text,
            )
            writer.commit()
            _insert(writer, table, SENTINEL, SENTINEL)
            writer.commit()
        records = _records(settings, name, 2 * PART + 1)
        assert second.process is not None
        assert second.process.poll() is None, log.read_text()
    finally:
        first.kill(pg)
        second.kill(pg)
        pg.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            [name],
        )
    # Every row exactly once, in one transaction's positions, none lost or repeated.
    assert [int(key["id"]) for key, _ in records] == [*range(1, 2 * PART + 1), SENTINEL]
    assert len({value["commit_lsn"] for _, value in records[:-1]}) == 1
    assert [value["ordinal"] for _, value in records[:-1]] == list(range(2 * PART))


def test_a_transaction_past_the_spool_limit_is_published_whole_without_streaming(
    services: Services,
    pg: Connection,
    unique_name: str,
    streaming_dsn: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A streamed transaction whose spool outgrows ``CAPTURE_STREAMING_SPOOL_MAX_BYTES``
    does not stop capture: the attempt ends, the next one asks for no streaming, and the
    server sends the transaction whole at its commit. Every row once, in one
    transaction's positions, and the transactions after it too."""
    caplog.set_level(logging.WARNING, logger="runtime.retry")
    name = unique_name
    table = _create(pg, name)
    settings = _streaming(
        capture_settings(services, name, [f"public.{name}"]), streaming_dsn, tmp_path
    )
    # About a third of the transaction's changes as pgoutput sends them.
    settings = settings.model_copy(update={"streaming_spool_max_bytes": 100_000})
    metrics = CaptureMetrics()
    capture = CaptureThread(settings, metrics=metrics, retry=True)
    capture.start(pg)
    try:
        with psycopg.connect(services.postgres_dsn) as writer:
            _insert(writer, table, 1, PART)
            _wait_streamed(pg, name, 1, 0)
            wait_for(
                lambda: _metric(metrics, "streaming") == 0,
                "capture never gave up streaming when the spool outgrew its limit",
                30,
            )
            _insert(writer, table, PART + 1, 2 * PART)
            writer.commit()
            _insert(writer, table, SENTINEL, SENTINEL)
            writer.commit()
        records = _records(settings, name, 2 * PART + 1)
        assert not capture.errors, capture.errors
    finally:
        capture.close(pg)
    assert [int(key["id"]) for key, _ in records] == [*range(1, 2 * PART + 1), SENTINEL]
    assert len({value["commit_lsn"] for _, value in records[:-1]}) == 1
    assert [value["ordinal"] for _, value in records[:-1]] == list(range(2 * PART))
    # What the operator reads: which transaction, the limit, and what capture does now.
    (warning,) = [
        r.getMessage() for r in caplog.records if "outgrew the spools' limit" in r.getMessage()
    ]
    assert "CAPTURE_STREAMING_SPOOL_MAX_BYTES (100000 bytes" in warning
    assert "goes on without streaming" in warning
