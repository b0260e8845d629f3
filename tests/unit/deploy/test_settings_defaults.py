"""Every default docs/configuration.md shows is the one the service runs with.

The reference once read each field's class default, so ``APPLY_METRICS__PORT`` showed
the 9108 of ``MetricsSettings`` while apply, whose ``metrics`` field builds
``MetricsSettings(port=9109)``, listens on 9109. Here each service's settings are built
the way the service builds them (the real class, validation included) from an empty
environment, and every value is compared with the default the reference shows for its
variable. test_settings_reference.py keeps the file itself equal to the rendering.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_settings import BaseSettings

from deploy.settings_reference import render
from tests.plugins.settings import ApplyFromArguments, CaptureFromArguments

ROW = re.compile(r"^\| `(?P<variable>[A-Z0-9_]+)` \| (?P<default>.*?) \| ", re.MULTILINE)


def _values(settings: BaseModel, prefix: str) -> Iterator[tuple[str, Any]]:
    """Each environment variable below ``settings`` with the value it holds."""
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        variable = f"{prefix}{name.upper()}"
        if isinstance(value, BaseModel):
            yield from _values(value, f"{variable}__")
        else:
            yield variable, value


def _shown_defaults(prefix: str) -> dict[str, str]:
    rows = [(m["variable"], m["default"]) for m in ROW.finditer(render())]
    shown = {variable: default for variable, default in rows if variable.startswith(prefix)}
    assert len(shown) == sum(variable.startswith(prefix) for variable, _ in rows), (
        "a variable is listed twice"
    )
    return shown


@pytest.mark.parametrize(
    ("built", "prefix"),
    [(CaptureFromArguments, "CAPTURE_"), (ApplyFromArguments, "APPLY_")],
)
def test_reference_shows_the_defaults_each_service_runs_with(
    built: type[BaseSettings], prefix: str
) -> None:
    running = dict(_values(built(), prefix))
    shown = _shown_defaults(prefix)
    assert set(shown) == set(running)
    # Secrets never show a default, and an unset (None) setting shows none either.
    expected = {
        variable: "" if value is None or "PASSWORD" in variable else f"`{value}`"
        for variable, value in running.items()
    }
    wrong = {
        variable: f"shown {shown[variable]!r}, runs with {expected[variable]!r}"
        for variable in running
        if shown[variable] != expected[variable]
    }
    assert not wrong, wrong


def test_reference_ignores_the_environment_it_is_rendered_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The one test here that touches the environment: a developer who rendered the file
    # with .local/stack.env or an override loaded must still write the services' defaults.
    clean = render()
    monkeypatch.setenv("APPLY_METRICS__PORT", "1")
    monkeypatch.setenv("CAPTURE_KAFKA__TOPIC_PREFIX", "leaked")
    assert render() == clean
