"""``python -m apply``'s program runs under ``spark-submit`` as it does by itself: the
master given to spark-submit is the one the job runs on, with no setting naming it, and
``python -m apply jars`` gives spark-submit the jars."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import apply.__main__ as entry_point
from tests.plugins.services import Services

pytestmark = pytest.mark.slow


def test_the_entry_point_runs_under_spark_submit(services: Services, tmp_path: Path) -> None:
    from deploy.local.jars import resolve  # noqa: PLC0415 - resolves jars only when run

    resolve("spark")
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("APPLY_", "PYSPARK_SUBMIT_ARGS"))
    }
    env |= {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "APPLY_KAFKA__BOOTSTRAP_SERVERS": services.kafka_bootstrap_servers,
        "APPLY_LAKE__ROOT": str(tmp_path / "lake"),
        "APPLY_LAKE__CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "APPLY_SPARK__APP_NAME": "submitted-apply",
    }
    jars = subprocess.run(
        [sys.executable, "-m", "apply", "jars"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert "delta-spark" in jars
    done = subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local[1]",
            "--jars",
            jars,
            "--conf",
            "spark.ui.enabled=false",
            str(Path(entry_point.__file__)),
            # --from-lake: plain `errored` reads the control topic without Spark.
            "errored",
            "--from-lake",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # spark-submit merges the Python driver's stderr into its stdout.
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "Spark master local[1], application submitted-apply" in output
    assert "records parked since batch" not in output, "no table is errored in an empty lake"
