"""How tests are grouped across xdist workers (tests/plugins/parallel.py)."""

from __future__ import annotations

from pathlib import Path

from tests.plugins.parallel import SHARED_SERVICE_MODULES, SPLIT_MODULES, group_of, unlisted_modules

ROOT = Path(__file__).resolve().parents[3]


def test_a_test_goes_with_its_module() -> None:
    module = "tests/integration/test_lake_readers.py"
    assert group_of(f"{module}::test_spark_reads_every_value_exactly") == module
    assert group_of(f"{module}::test_duckdb_reads_every_value_exactly") == module
    assert group_of(f"{module}::test_x[a-b]") == module


def test_modules_using_one_costly_service_share_a_group() -> None:
    # One worker starts the service once and runs these modules one after another; the
    # standalone cluster above all must never serve two applications at once.
    assert group_of("tests/integration/test_apply_standalone_cluster.py::test_a") == (
        group_of("tests/unit/deploy/test_local_spark_cluster.py::test_b")
    )
    assert group_of("tests/integration/test_registry_client.py::test_a") == (
        group_of("tests/integration/test_registry_connect.py::test_b")
    )


def test_a_split_module_deals_out_each_test() -> None:
    faults = "tests/e2e/test_pipeline_faults.py"
    assert group_of(f"{faults}::test_a") != group_of(f"{faults}::test_b")


def test_a_module_using_a_shared_service_must_be_listed() -> None:
    fixtures = {
        "tests/integration/test_registry_client.py": {"schema_registry_url", "services"},
        "tests/integration/test_new_registry_use.py": {"schema_registry_url"},
        "tests/integration/test_plain.py": {"services", "spark"},
    }
    assert unlisted_modules(fixtures) == [
        "tests/integration/test_new_registry_use.py (schema-registry)"
    ]


def test_every_module_named_exists() -> None:
    # A renamed module would silently lose its group or its split.
    for module in [*SPLIT_MODULES, *SHARED_SERVICE_MODULES]:
        assert (ROOT / module).is_file(), module
