"""The coverage-guided fuzzers (``tests/fuzz``) run for a bounded search with a fixed
seed: the pgoutput decoder from the recorded vectors, the compiled row encoder against
the Python path from nothing but its dictionary of text forms."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from capture.rows import native as native_rows
from tests.plugins.fuzzing import run_fuzzer

ROOT = Path(__file__).resolve().parents[3]
VECTORS = Path(__file__).parent / "vectors"
RUNS = 100_000


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
    run_fuzzer("fuzz_decoder", corpus, RUNS)


def test_the_row_encoder_fuzzer_finds_nothing(tmp_path: Path) -> None:
    if not native_rows.AVAILABLE:
        if os.environ.get("CI") == "true":
            pytest.fail("capture_native is not built: run `make native`")
        pytest.skip("capture_native is not built: run `make native`")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    dictionary = ROOT / "tests" / "fuzz" / "row_encoder.dict"
    run_fuzzer("fuzz_row_encoder", corpus, RUNS, f"-dict={dictionary}")
