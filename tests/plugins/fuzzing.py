"""Running a coverage-guided fuzzer of ``tests/fuzz`` for a bounded search with a fixed
seed, so CI replays the same search each time; shared by the tests that run one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_fuzzer(harness: str, corpus: Path, runs: int, *flags: str) -> None:
    """Run ``tests.fuzz.<harness>`` for ``runs`` inputs from ``corpus``; fail the test
    with libFuzzer's report (the property that broke, its input) when it finds one."""
    # A crashing input is written beside the corpus (a test's temporary directory), not
    # into the working tree the fuzzer runs in.
    command = [
        sys.executable,
        "-m",
        f"tests.fuzz.{harness}",
        f"-runs={runs}",
        "-seed=1",
        f"-artifact_prefix={corpus.parent}{os.sep}",
    ]
    result = subprocess.run(
        [*command, *flags, str(corpus)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    found = output.find("=== Uncaught Python exception")
    verdict = output[found : found + 4000] if found >= 0 else output[-4000:]
    assert result.returncode == 0, verdict
    assert f"Done {runs} runs" in result.stderr, verdict
