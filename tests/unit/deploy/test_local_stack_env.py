"""The env file ``make up`` writes is what both services' settings read."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from apply.settings import ApplySettings
from capture.settings import CaptureSettings
from deploy.local import stack
from deploy.local.stack import StackState, write_env


def _state(tmp_path: Path) -> StackState:
    return StackState(
        postgres_root=str(tmp_path / "pg"),
        postgres_port=15432,
        kafka_root=str(tmp_path / "kafka"),
        kafka_port=19092,
        kafka_controller_port=19093,
    )


def test_env_file_lines(tmp_path: Path) -> None:
    env_file = tmp_path / "stack.env"
    write_env(_state(tmp_path), env_file)
    pairs = dict(
        line.split("=", 1)
        for line in env_file.read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pairs == {
        "CDC_POSTGRES_DSN": "postgresql://postgres@127.0.0.1:15432/postgres",
        "CDC_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:19092",
        "CAPTURE_POSTGRES__DSN": "postgresql://postgres@127.0.0.1:15432/postgres",
        "CAPTURE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:19092",
        "APPLY_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:19092",
    }


def _only(env_file: Path, prefix: str, tmp_path: Path) -> Path:
    """The lines a service reads once the file is sourced into the environment: those with
    its prefix (settings ignore other variables in the environment)."""
    subset = tmp_path / f"{prefix.lower()}env"
    subset.write_text(
        "".join(
            f"{line}\n" for line in env_file.read_text().splitlines() if line.startswith(prefix)
        )
    )
    return subset


def test_service_settings_read_the_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The environment wins over an env file: a shell that sourced a stack's file must
    # not decide what this file is read as.
    for name in list(os.environ):
        if name.startswith(("CAPTURE_", "APPLY_")):
            monkeypatch.delenv(name)
    env_file = tmp_path / "stack.env"
    write_env(_state(tmp_path), env_file)
    capture = CaptureSettings(_env_file=_only(env_file, "CAPTURE_", tmp_path))
    apply = ApplySettings(_env_file=_only(env_file, "APPLY_", tmp_path))
    assert capture.postgres.dsn == "postgresql://postgres@127.0.0.1:15432/postgres"
    assert capture.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert apply.kafka.bootstrap_servers == "127.0.0.1:19092"


def _stopped_stack(root: Path, tmp_path: Path) -> None:
    """The state of a stack whose services are not running."""
    root.mkdir()
    state = StackState(
        postgres_root=str(tmp_path / "pg"),
        postgres_port=1,
        kafka_root=str(root / "kafka"),
        kafka_port=2,
        kafka_controller_port=3,
    )
    (root / "state.json").write_text(json.dumps(dataclasses.asdict(state)))


def test_wiping_a_stack_of_its_own_keeps_the_developers_env_file(tmp_path: Path) -> None:
    env_file = tmp_path / "stack.env"
    env_file.write_text("CDC_POSTGRES_DSN=x\n")
    root = tmp_path / "own"
    _stopped_stack(root, tmp_path)
    stack.down(root, wipe=True)
    assert not root.exists()
    assert env_file.exists(), "a wipe without env_file leaves every env file alone"
    _stopped_stack(root, tmp_path)
    stack.down(root, wipe=True, env_file=env_file)
    assert not env_file.exists()
