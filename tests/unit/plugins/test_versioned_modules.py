"""Which modules run on every supported PostgreSQL version (tests/plugins/postgres_versions.py).

A module named there that was renamed or deleted would silently stop running twice, and
one that reaches PostgreSQL around the ``services`` fixture would run twice against the
same server: both are caught here, before any server starts."""

from __future__ import annotations

import re
from pathlib import Path

from deploy.local.postgres import SUPPORTED_VERSIONS
from tests.plugins.postgres_versions import VERSIONED_MODULES, VERSIONS

ROOT = Path(__file__).resolve().parents[3]


def test_the_versions_are_the_ends_of_the_supported_range() -> None:
    assert (min(SUPPORTED_VERSIONS), max(SUPPORTED_VERSIONS)) == VERSIONS


def test_every_versioned_module_exists_and_reaches_postgresql_through_services() -> None:
    for module in sorted(VERSIONED_MODULES):
        text = (ROOT / module).read_text()
        assert re.search(r"def test_\w+\(", text), f"{module}: no tests"
        assert re.search(r"\b(services|pg): ", text), f"{module}: uses neither services nor pg"
        assert "CDC_POSTGRES_DSN" not in text, f"{module} reads the shared server's DSN itself"
