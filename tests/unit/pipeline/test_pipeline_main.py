"""``python -m pipeline``: the dispatcher's own behaviour (the commands have their tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CAPTURE_", "APPLY_"))}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_invalid_settings_exit_2_naming_the_setting() -> None:
    result = _run("status", APPLY_TABLE_PARALLELISM="0")
    assert result.returncode == 2
    assert "invalid settings" in result.stderr
    assert "table_parallelism" in result.stderr


def test_an_unknown_command_is_refused() -> None:
    result = _run("verfy")
    assert result.returncode == 2
    assert "invalid choice: 'verfy'" in result.stderr


def test_each_command_has_its_help() -> None:
    for command, words in (("status", "--json"), ("verify", "--rounds")):
        result = _run(command, "--help")
        assert result.returncode == 0, result.stderr
        assert words in result.stdout
