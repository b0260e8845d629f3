"""Which tables verify compares (pipeline.verify.rounds.choose_tables)."""

from __future__ import annotations

import pytest

from capture.errors import ConfigError
from capture.source.setup import TableRef
from pipeline.verify.rounds import choose_tables

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
