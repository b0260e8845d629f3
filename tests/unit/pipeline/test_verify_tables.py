"""Which tables verify compares (pipeline.verify.rounds.choose_tables), and which of
their rows (a publication's row filter, pipeline.verify.source)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import pytest
from psycopg import sql

from capture.errors import ConfigError
from capture.source.setup import TableRef
from pipeline.verify.canonical import SOURCE_ALIAS, CanonColumn
from pipeline.verify.rounds import choose_tables
from pipeline.verify.source import TableShape, row_count
from schemas import column_type as ct

ORDERS, ITEMS, NOTES = TableRef("public", "orders"), TableRef("public", "items"), TableRef("s", "n")


def test_default_is_every_published_table_with_a_delta_table() -> None:
    present = {ORDERS: True, ITEMS: False, NOTES: True}
    assert choose_tables([ORDERS, ITEMS, NOTES], None, present, "pub") == [ORDERS, NOTES]


def test_requested_tables_need_not_have_a_delta_table() -> None:
    chosen = choose_tables([ORDERS, ITEMS], ["public.items", "public.items"], {}, "pub")
    assert chosen == [ITEMS]


def test_a_table_outside_the_publication_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="not in publication pub"):
        choose_tables([ORDERS], ["public.nope"], {}, "pub")


def test_an_unqualified_table_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"--table orders: .*schema-qualified"):
        choose_tables([ORDERS], ["orders"], {}, "pub")


class _Recorder:
    """A connection that records the queries verify sends and answers each with one row."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def execute(self, query: sql.Composed, params: Sequence[Any]) -> _Recorder:
        self.queries.append(query.as_string(None))
        return self

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [(3,)]


def test_a_row_filtered_table_is_compared_on_the_rows_its_filter_lets_through() -> None:
    columns = (CanonColumn("id", ct.LONG), CanonColumn("tenant", ct.LONG))
    shape = TableShape(ORDERS, columns, ("id",), False, (), "(tenant = 7)")
    conn = _Recorder()
    row_count(cast("Any", conn), shape, 10)
    row_count(cast("Any", conn), replace(shape, row_filter=None), 10)
    filtered_count, filtered_keys, count, keys = conn.queries
    assert filtered_count == (
        f'SELECT count(*) FROM "public"."orders" AS "{SOURCE_ALIAS}" WHERE ((tenant = 7))'
    )
    assert " WHERE ((tenant = 7))) r ORDER BY k" in filtered_keys
    assert "WHERE" not in count
    assert "WHERE" not in keys
