"""A service's settings as a Markdown table: what ``--help`` prints and what
``docs/configuration.md`` is made of (``python -m deploy.settings_reference``)."""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel
from pydantic_settings import BaseSettings

_HIDDEN = ("password",)
"""Defaults of fields whose name holds one of these are never shown."""


def _rows(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, str]]:
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _rows(annotation, f"{prefix}{name.upper()}__")
            continue
        default = field.get_default(call_default_factory=True)
        shown = "" if default is None else f"`{default}`"
        if any(hidden in name for hidden in _HIDDEN):
            shown = ""
        yield f"{prefix}{name.upper()}", shown, field.description or ""


def settings_table(settings: type[BaseSettings], title: str) -> str:
    """One service's settings as a Markdown table."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    lines = [f"## {title}", "", "| variable | default | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{var}` | {default} | {doc} |" for var, default, doc in _rows(settings, prefix)]
    return "\n".join(lines) + "\n"
