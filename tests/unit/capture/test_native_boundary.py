"""The compiled extension's boundary (``native/``) matches its stub: every class, call,
field and stop ``capture_native`` exports is declared and documented in
``native/capture_native.pyi``, and nothing the stub declares is missing, so mypy checks
the Python callers against what the extension really offers."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import pytest

STUB = Path(__file__).parents[3] / "native" / "capture_native.pyi"

_SELF = "capture_native"
"""The extension module inside the package maturin builds, re-exported by it."""


@pytest.fixture(scope="module")
def compiled() -> ModuleType:
    module: ModuleType = pytest.importorskip("capture_native")
    return module


def _stub() -> ast.Module:
    return ast.parse(STUB.read_text(encoding="utf-8"))


def _members(cls: ast.ClassDef) -> dict[str, bool]:
    """The names a stub class declares, each with whether it has a docstring (an
    attribute's is the string right after it)."""
    members: dict[str, bool] = {}
    body = cls.body
    for at, node in enumerate(body):
        if isinstance(node, ast.FunctionDef):
            members[node.name] = ast.get_docstring(node) is not None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            following = body[at + 1] if at + 1 < len(body) else None
            members[node.target.id] = (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            )
    return members


def test_the_stub_declares_what_the_extension_exports(compiled: ModuleType) -> None:
    body = _stub().body
    declared = {node.name for node in body if isinstance(node, ast.ClassDef | ast.FunctionDef)}
    # Module constants, each documented by the string right after it.
    for at, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            following = body[at + 1] if at + 1 < len(body) else None
            assert isinstance(following, ast.Expr), node.target.id
            assert isinstance(following.value, ast.Constant), node.target.id
            declared.add(node.target.id)
    exported = {name for name in dir(compiled) if not name.startswith("_")} - {_SELF}
    assert exported == declared


def test_every_class_and_call_is_documented_and_exists(compiled: ModuleType) -> None:
    for node in _stub().body:
        if isinstance(node, ast.FunctionDef):
            assert ast.get_docstring(node), node.name
            continue
        if not isinstance(node, ast.ClassDef):
            continue
        assert ast.get_docstring(node), node.name
        cls = getattr(compiled, node.name)
        members = _members(node)
        for name, documented in members.items():
            assert documented, f"{node.name}.{name} has no docstring"
            assert hasattr(cls, name), f"{node.name}.{name} is not in the extension"
        public = {name for name in vars(cls) if not name.startswith("_")}
        assert public <= set(members), f"{node.name}: undeclared {public - set(members)}"


def test_results_are_frozen_and_read_by_name(compiled: ModuleType) -> None:
    encoder = compiled.TextRowEncoder(["long", "string"], [0], [False])
    encoded = encoder.encode((b"7", b"x"))
    assert not isinstance(encoded, tuple)
    assert (encoded.row, encoded.key) == (b"\x02\x0e\x02\x02x", b"\x0e")
    with pytest.raises(AttributeError):
        encoded.row = b""
    transaction = compiled.OpenTransaction(0x2000, 777, 5, 6, 1)
    assert (transaction.commit_lsn, transaction.xid, transaction.id) == (0x2000, 777, 1)
    with pytest.raises(AttributeError):
        transaction.ordinal = 0


def test_stops_are_distinct_values(compiled: ModuleType) -> None:
    stop = compiled.Stop
    stops = [stop.EMPTY, stop.FRAME, stop.FULL, stop.LIMIT, stop.ENDED, stop.FAILED]
    assert len(set(stops)) == len(stops)
    assert stop.FRAME == stop.FRAME
    assert stop.FRAME != 1, "a stop is not its number"
