"""docs/configuration.md is exactly what the settings classes say."""

from __future__ import annotations

from pathlib import Path

from deploy.settings_reference import render

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


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
