"""``make demo`` in a short form: the whole narrated run, ending with verify saying equal.

The demo is a newcomer's first contact, so it is tested like a feature: schema, both
services as processes, the workload with live progress, catch-up, verify, the hints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugins.services import Services

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_ends_with_the_lake_equal_to_the_source(
    services: Services, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAPTURE_", "APPLY_"))}
    env["CDC_POSTGRES_DSN"] = services.postgres_dsn
    env["CDC_KAFKA_BOOTSTRAP_SERVERS"] = services.kafka_bootstrap_servers
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.demo",
            "--seconds",
            "12",
            "--rate",
            "20",
            "--root",
            str(tmp_path / "demo"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, f"{out[-4000:]}\n{result.stderr[-4000:]}"
    assert "initial snapshot in Delta" in out
    assert "changes/s to Kafka" in out, "no live progress line"
    assert "OK: the lake equals the source (6 table(s)" in out
    for table in ("regions", "customers", "products", "orders", "order_items", "documents"):
        assert f"demo.{table}: OK" in out
    assert 'spark.read.format("delta")' in out
