"""Change topic -> source table -> Delta location, and the streaming query's identity."""

from __future__ import annotations

import pytest

from apply.errors import ConfigError
from apply.lake.spark_merge import (
    TXN_APP_ID_CONF,
    TXN_VERSION_CONF,
    USER_METADATA_CONF,
    commit_settings,
    transaction_app_id,
)
from apply.lake.tables import TableId, table_of_topic, table_path
from schemas.naming import table_topic


@pytest.mark.parametrize(
    ("schema", "table"),
    [
        ("public", "orders"),
        ("sales data", "order-items"),
        ("Straße", "1st.quarter"),
        ("a_b", "-61"),
    ],
)
@pytest.mark.parametrize("prefix", ["cdc", "prod.eu-1"])
def test_topic_names_its_table(prefix: str, schema: str, table: str) -> None:
    assert table_of_topic(table_topic(prefix, schema, table)) == TableId(schema, table)


@pytest.mark.parametrize(
    "topic",
    [
        "cdc._schemas",  # the schema topic: one segment after the prefix
        "orders",
        "cdc.public.order-xyitems",  # '-' only starts a two-digit escape
        "cdc.public.-61",  # an escaped character that is never escaped
        "cdc.public.-ff",  # not UTF-8
        "cdc.public.",
    ],
)
def test_other_topics_are_a_configuration_error(topic: str) -> None:
    with pytest.raises(ConfigError, match="change topic"):
        table_of_topic(topic)


def test_table_path_uses_the_topic_segments() -> None:
    assert table_path("/lake/", TableId("public", "orders")) == "/lake/public/orders"
    assert (
        table_path("s3a://bucket/lake", TableId("sales data", "order-items"))
        == "s3a://bucket/lake/sales-20data/order-2ditems"
    )
    assert str(TableId("sales data", "order-items")) == "sales data.order-items"


def test_transaction_app_id_follows_the_checkpoint_location() -> None:
    first = transaction_app_id("/checkpoints/apply")
    assert first == transaction_app_id("/checkpoints/apply/")
    assert first != transaction_app_id("/checkpoints/apply-2")
    assert first.startswith("pgdelta-apply-")


class FakeConf:
    """The three calls of SparkSession.conf that commit_settings uses."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        del self.values[key]


class FakeSession:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = FakeConf(values)


def test_commit_settings_hold_only_inside_and_restore_what_was_there() -> None:
    session = FakeSession({USER_METADATA_CONF: "operator note", "other": "x"})
    inside: dict[str, str] = {}

    def failing_merge() -> None:
        with commit_settings(session, "app", 7, '{"m":1}'):  # type: ignore[arg-type]
            inside.update(session.conf.values)
            raise RuntimeError("merge failed")

    with pytest.raises(RuntimeError, match="merge failed"):
        failing_merge()
    assert inside == {
        TXN_APP_ID_CONF: "app",
        TXN_VERSION_CONF: "7",
        USER_METADATA_CONF: '{"m":1}',
        "other": "x",
    }
    assert session.conf.values == {USER_METADATA_CONF: "operator note", "other": "x"}
