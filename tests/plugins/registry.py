"""A real Schema Registry for the tests that need one: Apicurio Registry 3.x with its
Confluent-compatible API (:mod:`deploy.local.registry`).

``CDC_SCHEMA_REGISTRY_URL`` names an external one (e.g. the registry of a ``make up``
stack); otherwise the first test that asks starts one for the session, beside the test
test session (under the worker's temporary directory, so two xdist workers never share a
registry's files), and stops it at the end. Tests that use it name their subjects after
their own topics (:func:`~tests.plugins.services.unique_name`), so they never interfere;
:mod:`tests.plugins.parallel` keeps them on one worker so one registry serves them all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from deploy.local.process import free_port
from deploy.local.registry import LocalRegistry


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("CDC_SCHEMA_REGISTRY_URL")
    if external:
        yield external
        return
    registry = LocalRegistry(tmp_path_factory.mktemp("registry"), free_port(), free_port())
    registry.start()
    try:
        yield registry.url
    finally:
        registry.stop()
