"""Imports only point down (docs/architecture.md, floors of the code).

Every module of the project's packages is parsed, and each import of another project
package must name a lower floor; the two services never import each other. Inside
capture the same holds between its parts (:data:`CAPTURE_FLOORS`): the snapshot never
imports the stream, the Kafka side never imports the rows it carries. Inside apply too
(:data:`APPLY_FLOORS`): the lake never imports a batch's stages, and a batch flows one
way through them (:data:`BATCH_STAGES`). An import inside a function counts as much as
one at the top: it is an arrow all the same.
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


def _part(service: str, module: str) -> str | None:
    """The part of ``service`` that ``module`` names (``capture.stream.loop`` ->
    ``stream``), or None for a module outside the service or its package itself."""
    parts = module.split(".")
    return parts[1] if parts[0] == service and len(parts) > 1 else None


def _imported_parts(service: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(p for alias in node.names if (p := _part(service, alias.name)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == service:  # from capture import stream
                found.update(alias.name for alias in node.names)
            elif part := _part(service, node.module):
                found.add(part)
    return found


def _modules(service: str) -> dict[Path, str]:
    """Every module of ``service`` but its package ``__init__``, by the part it is in."""
    root = ROOT / service
    return {
        path: path.relative_to(root).parts[0].removesuffix(".py")
        for path in sorted(root.rglob("*.py"))
        if path != root / "__init__.py"
    }


def _imported_capture_parts(path: Path) -> set[str]:
    return _imported_parts("capture", path)


def _capture_modules() -> dict[Path, str]:
    return _modules("capture")


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


APPLY_FLOORS = {
    "errors": 0,
    "settings": 0,
    "lanes": 1,  # which tables each streaming query reads
    "engine": 1,  # the Spark session and its jars, the Kafka clients' properties
    "lake": 2,  # the Delta tables, the applied state in their commits, both writers
    "control": 3,  # the control topic: progress made from the applied state (lake)
    "metrics": 4,  # counted from a batch's result (control)
    "batch": 4,  # a micro-batch's stages, writing to the lake
    "reapply": 5,  # parked records through a batch's stages
    "app": 6,  # the job: queries, publish, the commands' wiring
    "__main__": 7,  # python -m apply
}
"""apply's parts (a sub-package or a top-level module), each above the ones it uses."""


def test_inside_apply_every_import_points_to_a_lower_part() -> None:
    arrows_up: list[str] = []
    for path, part in _modules("apply").items():
        for imported in _imported_parts("apply", path) - {part}:
            if APPLY_FLOORS[imported] >= APPLY_FLOORS[part]:
                arrows_up.append(f"{path.relative_to(ROOT)} imports apply.{imported}")
    assert not arrows_up, "imports inside apply that do not point down:\n" + "\n".join(arrows_up)


def test_the_apply_floors_name_every_part() -> None:
    parts = set(_modules("apply").values())
    assert parts == APPLY_FLOORS.keys(), (
        "a new part of apply needs its floor in APPLY_FLOORS and in docs/architecture.md"
    )


BATCH_STAGES = {
    # What only the stages use, below every stage.
    "held_batch": 0,  # a small batch's records read in the driver
    "superseded": 0,  # records a TRUNCATE superseded, kept out of the plan
    "table_pool": 0,  # the tables of a batch side by side
    "context": 1,  # what every stage is given
    "read": 2,  # the contract checks, the table's applied state
    "plan": 3,  # columns, measure: needs the read's state
    "write": 4,  # the commits: needs the plan
    "park": 4,  # the dead-letter commit: beside the write, never after it
    "table": 5,  # one table through the stages in order
    "micro_batch": 6,  # every table's part, then the parked ones
}
"""apply's micro-batch (``apply/batch/``), stage by stage: a batch flows one way, so a
stage imports only the stages before it, and the modules only the stages use import no
stage (docs/architecture.md, apply's stages)."""


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
    assert stages == BATCH_STAGES.keys(), "a new module of a batch needs its place in BATCH_STAGES"
    arrows_back: list[str] = []
    for stage in sorted(stages):
        for imported in _imported_batch_stages(root / f"{stage}.py") - {stage}:
            if BATCH_STAGES[imported] >= BATCH_STAGES[stage]:
                arrows_back.append(f"apply/batch/{stage}.py imports apply.batch.{imported}")
    assert not arrows_back, "a stage that imports a later one:\n" + "\n".join(arrows_back)
