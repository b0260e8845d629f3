"""The coverage-guided fuzzers (``tests/fuzz``) run for a bounded search with a fixed
seed: the pgoutput decoder from the recorded vectors, the compiled row encoder against
the Python path from nothing but its dictionary of text forms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capture.rows import native as native_rows

ROOT = Path(__file__).resolve().parents[3]
VECTORS = Path(__file__).parent / "vectors"
RUNS = 100_000


def _fuzz(harness: str, corpus: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            f"tests.fuzz.{harness}",
            f"-runs={RUNS}",
            "-seed=1",
            *flags,
            str(corpus),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _verdict(result: subprocess.CompletedProcess[str]) -> str:
    """libFuzzer's report from the failure on (the property that broke, its input), or
    its end."""
    output = result.stdout + result.stderr
    found = output.find("=== Uncaught Python exception")
    return output[found : found + 4000] if found >= 0 else output[-4000:]


def test_the_decoder_fuzzer_finds_nothing(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seeds = 0
    for name in ("pgoutput_v2.json", "pgoutput_v3.json"):
        for scenario in json.loads((VECTORS / name).read_text())["scenarios"]:
            for vector in scenario["messages"]:
                flag = bytes([1 if vector["in_stream"] else 0])
                (corpus / f"vector-{seeds}").write_bytes(flag + bytes.fromhex(vector["hex"]))
                seeds += 1
    result = _fuzz("fuzz_decoder", corpus)
    assert result.returncode == 0, _verdict(result)
    assert f"Done {RUNS} runs" in result.stderr, _verdict(result)


def test_the_row_encoder_fuzzer_finds_nothing(tmp_path: Path) -> None:
    if not native_rows.AVAILABLE:
        if os.environ.get("CI") == "true":
            pytest.fail("capture_native is not built: run `make native`")
        pytest.skip("capture_native is not built: run `make native`")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    dictionary = ROOT / "tests" / "fuzz" / "row_encoder.dict"
    result = _fuzz("fuzz_row_encoder", corpus, f"-dict={dictionary}")
    assert result.returncode == 0, _verdict(result)
    assert f"Done {RUNS} runs" in result.stderr, _verdict(result)
