"""The broker advertises the port clients must use: its own, or a proxy's in front."""

from __future__ import annotations

import json
from pathlib import Path

from deploy.local.kafka import LocalKafka
from deploy.local.stack import StackState


def _properties(kafka: LocalKafka) -> dict[str, str]:
    kafka._write_config()  # the file the broker reads is the contract
    lines = kafka.config_file.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_the_broker_advertises_its_own_port_by_default(tmp_path: Path) -> None:
    props = _properties(LocalKafka(tmp_path, port=19092, controller_port=19093))
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"


def test_the_broker_advertises_a_proxy_port_and_still_listens_on_its_own(
    tmp_path: Path,
) -> None:
    props = _properties(
        LocalKafka(tmp_path, port=19092, controller_port=19093, advertised_port=29092)
    )
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29092"
    assert props["listeners"].startswith("PLAINTEXT://127.0.0.1:19092,")


def test_a_stack_state_written_before_the_option_still_loads(tmp_path: Path) -> None:
    old = {
        "postgres_root": str(tmp_path / "pg"),
        "postgres_port": 15432,
        "kafka_root": str(tmp_path / "kafka"),
        "kafka_port": 19092,
        "kafka_controller_port": 19093,
    }
    state = StackState(**json.loads(json.dumps(old)))
    assert state.kafka.advertised_port is None
