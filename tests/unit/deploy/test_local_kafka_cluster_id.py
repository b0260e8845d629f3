"""Cluster ids for the local Kafka: valid for Kafka, never read as a command-line option."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from deploy.local.kafka import cluster_id, new_cluster_id
from tests.plugins.kafka_cluster_ids import DASH_FIRST


def test_an_id_is_16_bytes_in_unpadded_url_safe_base64() -> None:
    raw = bytes(range(16))
    encoded = cluster_id(raw)
    assert len(encoded) == 22
    assert base64.urlsafe_b64decode(encoded + "==") == raw


def test_a_dash_first_id_is_drawn_again() -> None:
    assert cluster_id(DASH_FIRST).startswith("-")
    draws: Iterator[bytes] = iter([DASH_FIRST, DASH_FIRST, bytes(range(16))])
    assert new_cluster_id(lambda _n: next(draws)) == cluster_id(bytes(range(16)))


def test_random_ids_never_begin_with_a_dash() -> None:
    # 2,000 draws see a dash-first candidate with probability 1 - (63/64)**2000.
    ids = {new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert not any(i.startswith("-") for i in ids)


def test_a_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        cluster_id(bytes(15))
