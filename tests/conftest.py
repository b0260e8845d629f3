"""Fixtures live in plugin modules under tests/plugins; this file only lists them."""

pytest_plugins = [
    "tests.plugins.services",
    "tests.plugins.postgres_versions",
    "tests.plugins.spark",
    "tests.plugins.spark_cluster",
    "tests.plugins.pipeline",
    "tests.plugins.secured",
    "tests.plugins.registry",
    "tests.plugins.connect",
    "tests.plugins.objectstore",
    "tests.plugins.parallel",
]
