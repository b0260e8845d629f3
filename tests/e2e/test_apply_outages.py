"""apply's own fault scenario, in a module of its own so the suite spreads it over its
workers (docs/testing.md): a job started while the broker is away. It runs capture and
apply as processes on this module's own PostgreSQL and Kafka
(``tests/plugins/pipeline.py``); the lake ends equal to the source.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from deploy.local import stack
from tests.plugins.capture import table_streaming
from tests.plugins.pipeline import (
    assert_lake_equals_source,
    one_table_pipeline,
    wait_caught_up,
)
from tests.plugins.telemetry import status
from tests.plugins.waiting import wait_for

pytestmark = pytest.mark.slow
SNAPSHOT_ROWS = 20_000
FAILING_S = 15  # longer than a schema-topic read's own timeouts: several retries


def test_apply_started_while_the_broker_is_down_comes_up_by_itself(
    spark: Any, own_stack: stack.StackState, unique_name: str, tmp_path: Path
) -> None:
    """apply started during a broker outage stays up (alive, not ready) and waits for
    the broker, then applies what capture published before, as capture does; it does
    not exit for its supervisor to restart it (docs/architecture.md, failure model)."""
    pipeline = one_table_pipeline(own_stack, unique_name, tmp_path, SNAPSHOT_ROWS)
    pipeline.apply.env["APPLY_METRICS__NOT_READY_AFTER_S"] = "1"
    kafka = own_stack.kafka
    try:
        pipeline.capture.start()
        capture_settings, _ = pipeline.settings()

        wait_for(
            lambda: table_streaming(capture_settings, "public.t"),
            f"the snapshot of public.t\n{pipeline.logs()}",
            300,
        )
        assert kafka.stop()
        pipeline.apply.start()
        apply_url = pipeline.apply.metrics_url(timeout_s=300)

        def retrying() -> bool:
            log = pipeline.apply.log.read_text(errors="replace")
            return "transient failure, retrying in" in log and "schema topic" in log

        wait_for(retrying, f"apply to retry reading the schema topic\n{pipeline.logs()}", 180)
        time.sleep(FAILING_S)
        assert pipeline.apply.running(), pipeline.logs()
        assert status(apply_url, "/readyz") == 503
        assert status(apply_url, "/healthz") == 200
        kafka.start()
        wait_caught_up(pipeline)
        assert pipeline.apply.running(), pipeline.logs()
        assert_lake_equals_source(spark, pipeline)
    finally:
        if not kafka.running():
            kafka.start()
        pipeline.stop()
