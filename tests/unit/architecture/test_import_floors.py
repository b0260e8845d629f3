"""Imports only point down (docs/architecture.md, floors of the code).

Every module of the project's packages is parsed, and each import of another project
package must name a lower floor; the two services never import each other. An import
inside a function counts as much as one at the top: it is an arrow all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

FLOORS = {
    "schemas": 0,
    "runtime": 1,
    "capture": 2,
    "apply": 2,
    "pipeline": 3,
    "deploy": 4,
    "bench": 5,  # uses the launcher in deploy/local
}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & FLOORS.keys()


def test_every_import_of_a_project_package_points_down() -> None:
    arrows_up: list[str] = []
    for package, floor in FLOORS.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for imported in _imported_packages(path) - {package}:
                if FLOORS[imported] >= floor:
                    arrows_up.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not arrows_up, "imports that do not point down:\n" + "\n".join(arrows_up)


def test_the_floors_name_every_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()} - {
        "tests"
    }
    assert packages == FLOORS.keys(), "a new package needs its floor in FLOORS and the docs"
