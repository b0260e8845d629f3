"""The docs say only what the code has: docs/configuration.md is exactly what the settings
classes say, and every setting, metric and ``python -m`` command named anywhere in the
README, docs/ or the alert rules exists (issue #33). Pure file reading and imports."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from apply.__main__ import main as apply_main
from apply.metrics import ApplyMetrics
from apply.settings import ApplySettings
from capture.__main__ import main as capture_main
from capture.metrics import CaptureMetrics
from capture.settings import CaptureSettings
from deploy.local.__main__ import main as local_main
from deploy.settings_reference import render
from pipeline.__main__ import COMMANDS as PIPELINE_COMMANDS
from runtime.settings_env import resolve, retired_variables
from runtime.telemetry import Health

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "configuration.md"
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("**/*.md")),
    ROOT / "deploy" / "prometheus" / "alerts.yaml",
]

SETTING = re.compile(r"\b(?:CAPTURE|APPLY)_[A-Z0-9_]*[A-Z0-9]\b")
NOT_SETTINGS = {
    # configuration.md's examples of misspelt names, which the services refuse at start.
    "CAPTURE_STREAMNG": "a misspelt example",
    "APPLY_LAKE_DELETION_VECTORS": "a misspelt example",
    "CAPTURE_POSTGRES__SLOTT": "a misspelt example",
    "CAPTURE_METRICS_SERVICE_HOST": "an example of a Kubernetes service link",
    # architecture.md names the import-floors test's tables of each service's parts.
    "CAPTURE_FLOORS": "tests/unit/architecture/test_import_floors.py",
    "APPLY_FLOORS": "tests/unit/architecture/test_import_floors.py",
}
# Settings a service no longer has, which the docs may name as retired: each is refused
# at start with its own message (runtime.settings_env).
RETIRED = {**retired_variables(ApplySettings), **retired_variables(CaptureSettings)}
METRIC = re.compile(r"\bcdc_(?:capture|apply)_[a-z0-9_]*[a-z0-9]\b")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
COMMAND = re.compile(r"python -m ([a-z_][a-z0-9_.]*)(?: +([a-z][a-z_-]*))?")


def test_configuration_doc_matches_the_settings_classes() -> None:
    assert DOC.read_text() == render(), (
        "docs/configuration.md is stale: run "
        "`.venv/bin/python -m deploy.settings_reference > docs/configuration.md`"
    )


def test_every_setting_is_documented() -> None:
    rendered = render()
    assert "`CAPTURE_POSTGRES__SLOT`" in rendered
    assert "`APPLY_LAKE__ROOT`" in rendered
    assert "CAPTURE_POSTGRES__PASSWORD` |  |" in rendered, "secrets never show a default"


def test_every_setting_has_a_meaning_and_lists_its_choices() -> None:
    rows = [line for line in render().splitlines() if line.startswith("| `")]
    assert rows
    assert [row for row in rows if row.endswith("|  |")] == [], "a setting without meaning"
    trigger = next(row for row in rows if row.startswith("| `APPLY_TRIGGER__MODE`"))
    assert "`processing_time`" in trigger
    assert "`available_now`" in trigger


def _mentions(pattern: re.Pattern[str], *, code_only: bool = False) -> Iterator[tuple[str, str]]:
    """Each match of ``pattern`` in the docs (in code spans and blocks only, if asked),
    with the file it is in."""
    for path in DOCS:
        text = path.read_text()
        parts = CODE.findall(text) if code_only else [text]
        for part in parts:
            for match in pattern.finditer(part):
                yield match.group(0), str(path.relative_to(ROOT))


def test_every_documented_setting_exists() -> None:
    missing = []
    for name, where in _mentions(SETTING):
        if name in NOT_SETTINGS or name in RETIRED:
            continue
        settings_cls = CaptureSettings if name.startswith("CAPTURE_") else ApplySettings
        try:
            resolve(settings_cls, name)
        except LookupError as exc:
            missing.append(f"{where}: {exc}")
    assert sorted(set(missing)) == []


def test_the_misspelt_examples_are_no_settings() -> None:
    """So the examples keep showing what the services refuse."""
    for name, why in NOT_SETTINGS.items():
        settings_cls = CaptureSettings if name.startswith("CAPTURE_") else ApplySettings
        with pytest.raises(LookupError):
            resolve(settings_cls, name)
        assert why


def test_every_documented_metric_exists() -> None:
    health = Health(1.0)
    defined = CaptureMetrics(health=health).names() | ApplyMetrics(health=health).names()
    found = dict(_mentions(METRIC))
    assert "cdc_apply_batch_duration_seconds" in found, "the scan reads the docs"
    assert {f"{where}: {name}" for name, where in found.items() if name not in defined} == set()


def _subcommands(main: Callable[[list[str]], int]) -> Callable[[str], bool]:
    """Whether ``main``'s command line takes ``word`` as its subcommand: its help exits 0,
    an unknown subcommand 2, before anything runs."""

    def accepts(word: str) -> bool:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
            pytest.raises(SystemExit) as exited,
        ):
            main([word, "--help"])
        return exited.value.code == 0

    return accepts


SUBCOMMANDS: dict[str, Callable[[str], bool]] = {
    "apply": _subcommands(apply_main),
    "capture": _subcommands(capture_main),
    "deploy.local": _subcommands(local_main),
    "pipeline": lambda word: word in PIPELINE_COMMANDS,
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package that does not exist
        return False


def test_every_documented_command_exists() -> None:
    commands = {
        (module, word): where
        for text, where in _mentions(COMMAND, code_only=True)
        for module, word in COMMAND.findall(text)
    }
    assert ("apply", "reapply") in commands, "the scan reads the docs"
    wrong = []
    for (module, word), where in sorted(commands.items()):
        if not _importable(module):
            wrong.append(f"{where}: python -m {module}: no such module")
        elif word and module in SUBCOMMANDS and not SUBCOMMANDS[module](word):
            wrong.append(f"{where}: python -m {module} {word}: no such command")
    assert wrong == []
