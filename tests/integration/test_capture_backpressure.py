"""On the real PostgreSQL and broker: reading pauses at the in-flight bound.

With nothing applied (no apply job, no stand-in), capture may produce no more than
``max_in_flight_records`` streamed records, plus what one step of the loop takes past
the bound: one compiled-stream call, or one frame of the Python loop. The bound is what
keeps capture's memory and the topic's lead over the lake finite; it must hold on both
paths."""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.plugins.capture import CaptureThread, capture_settings
from tests.plugins.services import Services
from tests.plugins.topics import record_count

Connection = psycopg.Connection[tuple[object, ...]]
BOUND = 2_000
ROWS = 20_000
# How far past the bound one step of the loop may go: the Python loop checks it after
# every frame, the compiled stream before each call, which takes up to its budget of
# frames (capture/stream/loop.py, _COMPILED_BUDGET).
PAST_THE_BOUND = {True: 512, False: 1}


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-stream", "python-loop"])
def test_reading_pauses_at_the_in_flight_bound(
    pg: Connection, services: Services, unique_name: str, compiled: bool
) -> None:
    pg.execute(f"CREATE TABLE {unique_name} (id int PRIMARY KEY, body text)")
    settings = capture_settings(services, unique_name, [f"public.{unique_name}"])
    settings = settings.model_copy(
        update={"max_in_flight_records": BOUND, "compiled_stream": compiled}
    )
    runner = CaptureThread(settings)
    runner.start(pg)
    topic = f"{unique_name}.public.{unique_name}"
    try:
        for start in range(0, ROWS, 100):
            with pg.transaction():
                for i in range(start, start + 100):
                    pg.execute(f"INSERT INTO {unique_name} VALUES (%s, 'x')", [i])
        # Long enough for capture to read everything if nothing held it back.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert not runner.errors, runner.errors
            time.sleep(0.5)
        produced = record_count(services.kafka_bootstrap_servers, topic)
        assert produced >= BOUND, f"capture produced only {produced} records"
        assert produced <= BOUND + PAST_THE_BOUND[compiled], (
            f"{produced} records produced with nothing applied, bound {BOUND}"
        )
    finally:
        runner.close(pg)
        pg.execute(f"DROP TABLE IF EXISTS {unique_name}")
