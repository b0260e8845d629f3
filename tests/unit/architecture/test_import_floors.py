"""Imports only point down (docs/architecture.md, floors of the code).

Every module of the project's packages is parsed, and each import of another project
package must name a lower floor; the two services never import each other. Inside
capture the same holds between its parts (:data:`CAPTURE_FLOORS`): the snapshot never
imports the stream, the Kafka side never imports the rows it carries. An import inside a
function counts as much as one at the top: it is an arrow all the same.
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


CAPTURE_FLOORS = {
    # What every part may use: errors, settings, the records both the stream and the
    # snapshot produce, the in-flight book (which knows records only as counts).
    "errors": 0,
    "settings": 0,
    "records": 0,
    "in_flight": 0,
    "metrics": 1,  # shows the in-flight book
    "pgoutput": 2,  # the pure decoder
    "publish": 3,  # Kafka: topics, producers, the control topic, record framing
    "rows": 4,  # types and codecs; a codec names its framer (publish)
    "source": 5,  # the source database's setup; reads the session settings (rows)
    "snapshot": 6,  # copies tables with rows and source; never the stream
    "stream": 7,  # the replication loop, which starts snapshots
    "service": 8,
    "admin": 8,
    "__main__": 9,  # builds the service, runs admin commands
}
"""capture's parts (a sub-package or a top-level module), each above the ones it uses."""


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


def _capture_part(module: str) -> str | None:
    """The part of capture ``module`` names (``capture.stream.loop`` -> ``stream``), or
    None for a module outside capture or capture's package itself."""
    parts = module.split(".")
    return parts[1] if parts[0] == "capture" and len(parts) > 1 else None


def _imported_capture_parts(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(p for alias in node.names if (p := _capture_part(alias.name)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "capture":  # from capture import stream
                found.update(alias.name for alias in node.names)
            elif part := _capture_part(node.module):
                found.add(part)
    return found


def _capture_modules() -> dict[Path, str]:
    """Every module of capture but its package ``__init__``, by the part it is in."""
    root = ROOT / "capture"
    return {
        path: path.relative_to(root).parts[0].removesuffix(".py")
        for path in sorted(root.rglob("*.py"))
        if path != root / "__init__.py"
    }


def test_inside_capture_every_import_points_to_a_lower_part() -> None:
    arrows_up: list[str] = []
    for path, part in _capture_modules().items():
        for imported in _imported_capture_parts(path) - {part}:
            if CAPTURE_FLOORS[imported] >= CAPTURE_FLOORS[part]:
                arrows_up.append(f"{path.relative_to(ROOT)} imports capture.{imported}")
    assert not arrows_up, "imports inside capture that do not point down:\n" + "\n".join(arrows_up)


def test_the_capture_floors_name_every_part() -> None:
    parts = set(_capture_modules().values())
    assert parts == CAPTURE_FLOORS.keys(), (
        "a new part of capture needs its floor in CAPTURE_FLOORS and in docs/architecture.md"
    )


def test_the_snapshot_never_imports_the_stream() -> None:
    assert CAPTURE_FLOORS["snapshot"] < CAPTURE_FLOORS["stream"]
    for path, part in _capture_modules().items():
        if part == "snapshot":
            assert "stream" not in _imported_capture_parts(path), path


BATCH_STAGES = {
    "context": 0,  # what every stage is given
    "read": 1,  # the contract checks, the table's applied state
    "plan": 2,  # columns, measure: needs the read's state
    "write": 3,  # the commits: needs the plan
    "park": 3,  # the dead-letter commit: beside the write, never after it
    "table": 4,  # one table through the stages in order
    "micro_batch": 5,  # every table's part, then the parked ones
}
"""apply's micro-batch (``apply/batch/``), stage by stage: a batch flows one way, so a
stage imports only the stages before it (docs/architecture.md, apply's stages)."""


def _imported_batch_stages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found.update(name.split(".")[2] for name in names if name.startswith("apply.batch."))
    return found


def test_a_batch_flows_one_way_through_its_stages() -> None:
    root = ROOT / "apply" / "batch"
    stages = {p.stem for p in root.glob("*.py")} - {"__init__"}
    assert stages == BATCH_STAGES.keys(), "a new stage needs its place in BATCH_STAGES"
    arrows_back: list[str] = []
    for stage in sorted(stages):
        for imported in _imported_batch_stages(root / f"{stage}.py") - {stage}:
            if BATCH_STAGES[imported] >= BATCH_STAGES[stage]:
                arrows_back.append(f"apply/batch/{stage}.py imports apply.batch.{imported}")
    assert not arrows_back, "a stage that imports a later one:\n" + "\n".join(arrows_back)
