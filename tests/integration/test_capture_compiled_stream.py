"""On the real PostgreSQL and broker: the compiled stream
(capture/stream/compiled_stream.py, native/src/compiled_stream.rs) publishes exactly
what the Python loop publishes.

Two captures read the same WAL through two slots created before it was written: one with
the compiled stream, one with every frame through the Python loop. Their topics must
hold the same records -- partition, offset, key, value and headers -- for a workload
that makes the two paths take turns inside transactions: rows the compiled stream takes,
updates that change a key, unchanged TOASTed values and a type the compiled encoder
leaves to Python, a TRUNCATE, a new column (a Relation mid-stream), and a transaction
larger than one call of the compiled stream."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psycopg
import pytest

from capture.publish import native_producer
from capture.rows.native import AVAILABLE
from capture.service import CaptureService
from capture.stream import compiled_stream
from capture.stream.compiled_stream import CompiledStream
from tests.plugins.capture import capture_settings, current_lsn
from tests.plugins.services import Services
from tests.plugins.topics import read_to_end

if TYPE_CHECKING:
    from capture_native import CompiledStreamRead

pytestmark = pytest.mark.skipif(
    not AVAILABLE or native_producer.library() is None,
    reason="capture_native is not built here",
)

Connection = psycopg.Connection[tuple[object, ...]]
Record = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes]]]


@pytest.fixture
def tables(pg: Connection, unique_name: str) -> Iterator[list[str]]:
    names = [f"{unique_name}_a", f"{unique_name}_b", f"{unique_name}_c"]
    a, b, c = names
    pg.execute(
        f"CREATE TABLE {a} (id int PRIMARY KEY, name text, amount float8, at timestamptz, "
        "flag bool, doc text)"
    )
    pg.execute(f"CREATE TABLE {b} (k1 text, k2 int, payload text, PRIMARY KEY (k1, k2))")
    pg.execute(f"CREATE TABLE {c} (id bigint PRIMARY KEY, price numeric(12, 2), note text)")
    yield [f"public.{n}" for n in names]
    for name in names:
        pg.execute(f"DROP TABLE IF EXISTS {name}")


def _workload(pg: Connection, a: str, b: str, c: str) -> None:
    # A TOASTed value: long and incompressible, so an UPDATE that leaves it sends 'u'.
    doc = "".join(f"{i:08x}{(i * 2654435761) % 2**32:08x}" for i in range(2000))
    with pg.transaction():
        for i in range(300):
            pg.execute(
                f"INSERT INTO {a} VALUES (%s, %s, %s, now(), %s, %s)",
                [i, f"name {i}", i * 1.5, i % 2 == 0, doc if i % 50 == 0 else None],
            )
        for i in range(60):
            pg.execute(f"INSERT INTO {b} VALUES (%s, %s, %s)", [f"k{i % 7}", i, "p" * (i % 13)])
        for i in range(40):
            pg.execute(f"INSERT INTO {c} VALUES (%s, %s, %s)", [i, f"{i}.25", f"note {i}"])
    for round_ in range(40):
        with pg.transaction():
            pg.execute(f"UPDATE {a} SET amount = amount + 1 WHERE id %% 40 = %s", [round_])
            # Leaves the TOASTed doc unchanged ('u'): the Python path, mid-transaction.
            pg.execute(f"UPDATE {a} SET name = name || '!' WHERE id = %s", [(round_ % 6) * 50])
            pg.execute(f"UPDATE {b} SET payload = 'x' WHERE k2 = %s", [round_])
            pg.execute(f"UPDATE {c} SET price = price + 1 WHERE id = %s", [round_])
            if round_ % 5 == 0:
                pg.execute(f"DELETE FROM {a} WHERE id = %s", [299 - round_])
                # A key change: a DELETE and an INSERT from the Python path.
                pg.execute(f"UPDATE {a} SET id = id + 1000 WHERE id = %s", [round_ + 101])
    pg.execute(f"TRUNCATE {b}")
    pg.execute(f"ALTER TABLE {a} ADD COLUMN extra int")
    with pg.transaction():
        for i in range(3000):
            pg.execute(f"INSERT INTO {b} VALUES (%s, %s, %s)", [f"big{i % 11}", i, str(i)])
        pg.execute(f"UPDATE {a} SET extra = 7 WHERE id < 20")
    # A key change that leaves a TOASTed value unsent errors the table: its later
    # changes are skipped by both paths, the other tables' go on.
    with pg.transaction():
        pg.execute(f"UPDATE {a} SET amount = 0 WHERE id < 10")
        pg.execute(f"UPDATE {a} SET id = 5000 WHERE id = 50")
        pg.execute(f"UPDATE {a} SET amount = 1 WHERE id < 10")
        pg.execute(f"UPDATE {c} SET note = 'after' WHERE id < 10")
    pg.execute(f"UPDATE {a} SET amount = 2 WHERE id < 10")


def _records(services: Services, topic: str) -> list[Record]:
    """(partition, offset, key, value, headers) of every record of ``topic``."""
    return sorted(
        (m.partition(), m.offset(), m.key(), m.value(), m.headers() or [])
        for m in read_to_end(services.kafka_bootstrap_servers, topic)
    )


@pytest.mark.parametrize(
    "producer",
    [
        pytest.param({}, id="default-producer"),
        # A queue of 50 records: the compiled stream stops on a full queue again and
        # again, keeps the frame it took, and takes it first once reports made room.
        pytest.param({"queue.buffering.max.messages": "50"}, id="small-producer-queue"),
    ],
)
def test_the_compiled_stream_publishes_what_the_python_loop_publishes(
    pg: Connection,
    services: Services,
    unique_name: str,
    tables: list[str],
    monkeypatch: pytest.MonkeyPatch,
    producer: dict[str, str],
) -> None:
    a, b, c = (t.removeprefix("public.") for t in tables)
    runs = {"compiled": f"{unique_name}_c", "loop": f"{unique_name}_p"}
    for name in runs.values():
        pg.execute(f"CREATE PUBLICATION {name} FOR TABLE {a}, {b}, {c}")
        pg.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [name])
    _workload(pg, a, b, c)
    end = current_lsn(pg)

    taken: list[int] = []
    stopped_on: set[compiled_stream.Stop] = set()
    read = CompiledStream.read

    def counting(self: CompiledStream, budget: int) -> CompiledStreamRead:
        result = read(self, budget)
        stopped_on.add(result.stopped)
        taken.append(result.taken)
        return result

    monkeypatch.setattr(CompiledStream, "read", counting)
    try:
        for mode, name in runs.items():
            settings = capture_settings(services, name, tables)
            settings = settings.model_copy(
                update={
                    "compiled_stream": mode == "compiled",
                    "kafka": settings.kafka.model_copy(update={"producer": producer}),
                }
            )
            CaptureService(settings, threading.Event(), stop_at=end).run()
            if mode == "compiled":
                # The compiled stream took most frames: the comparison below is not the
                # loop's twice.
                assert sum(taken) > 3000, taken
                compiled_taken = sum(taken)
                if producer:
                    assert compiled_stream.Stop.FULL in stopped_on, "the queue never filled"
                assert compiled_stream.Stop.FRAME in stopped_on
        assert sum(taken) == compiled_taken, "the Python loop's capture used the compiled stream"
        for table in (a, b, c):
            compiled = _records(services, f"{runs['compiled']}.public.{table}")
            loop = _records(services, f"{runs['loop']}.public.{table}")
            assert compiled, table
            assert compiled == loop, table
    finally:
        for name in runs.values():
            pg.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s",
                [name],
            )
            pg.execute(f"DROP PUBLICATION IF EXISTS {name}")


def test_libpq_is_found_where_psycopg_uses_its_c_implementation() -> None:
    assert psycopg.pq.__impl__ in {"binary", "c"}
    path = compiled_stream.libpq()
    assert path is not None
    assert "libpq" in path
