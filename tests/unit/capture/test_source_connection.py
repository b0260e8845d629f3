"""Capture's source connections get dead-peer detection unless the DSN says otherwise."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from capture.source.connection import DEAD_PEER_DEFAULTS, with_dead_peer_detection


def test_a_plain_dsn_gains_every_default() -> None:
    dsn = with_dead_peer_detection("postgresql://cdc@db.example:5432/shop")
    params = conninfo_to_dict(dsn)
    assert params["host"] == "db.example"
    assert params["dbname"] == "shop"
    for key, value in DEAD_PEER_DEFAULTS.items():
        assert params[key] == value


def test_what_the_dsn_sets_is_kept() -> None:
    dsn = with_dead_peer_detection(
        "host=db port=5432 dbname=shop keepalives_idle=60 tcp_user_timeout=0"
    )
    params = conninfo_to_dict(dsn)
    assert params["keepalives_idle"] == "60"
    assert params["tcp_user_timeout"] == "0"
    assert params["keepalives_count"] == DEAD_PEER_DEFAULTS["keepalives_count"]


def test_a_dsn_with_everything_set_is_returned_as_it_is() -> None:
    dsn = "host=db " + " ".join(f"{k}={v}" for k, v in DEAD_PEER_DEFAULTS.items())
    assert with_dead_peer_detection(dsn) == dsn
