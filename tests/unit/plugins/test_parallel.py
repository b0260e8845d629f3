"""How tests are grouped across xdist workers (tests/plugins/parallel.py)."""

from __future__ import annotations

from pathlib import Path

from tests.plugins.parallel import SPLIT_MODULES, module_group


def test_a_module_is_its_own_group_unless_it_uses_a_shared_service() -> None:
    module = "tests/integration/test_capture_service.py"
    assert module_group({"pg", "services", "unique_name"}, module) == module


def test_modules_using_one_costly_service_share_a_group() -> None:
    # One worker starts the service once and runs these modules one after another; the
    # standalone cluster above all must never serve two applications at once.
    assert module_group({"spark_cluster", "pg"}, "tests/a.py") == "spark-cluster"
    assert module_group({"spark_cluster"}, "tests/b.py") == "spark-cluster"
    assert module_group({"schema_registry_url"}, "tests/c.py") == "schema-registry"
    assert module_group({"object_store", "spark"}, "tests/d.py") == "object-store"


def test_split_modules_exist() -> None:
    # A renamed module would silently stop being split.
    root = Path(__file__).resolve().parents[3]
    assert SPLIT_MODULES
    for module in SPLIT_MODULES:
        assert (root / module).is_file(), module
