"""A service's settings as a Markdown table: what ``--help`` prints and what
``docs/configuration.md`` is made of (``python -m deploy.settings_reference``).

Each default shown is the value the service runs with when nothing is set, read from the
settings built without any source, not from the field's declaration. The two differ
where a service gives a shared group defaults of its own: both services hold a
``MetricsSettings``, whose class says port 9108, but apply's ``metrics`` field builds
``MetricsSettings(port=9109)``. tests/unit/deploy/test_settings_defaults.py compares
every default shown with settings built from an empty environment.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic_settings import BaseSettings

_HIDDEN = ("password",)
"""Defaults of fields whose name holds one of these are never shown."""


def setting_rows(values: BaseModel, prefix: str) -> Iterator[tuple[str, str, str]]:
    """Variable, shown default and meaning of every setting below ``values``."""
    for name, field in type(values).model_fields.items():
        variable = f"{prefix}{name.upper()}"
        value = getattr(values, name)
        if isinstance(value, BaseModel):
            yield from setting_rows(value, f"{variable}__")
            continue
        secret = any(hidden in name for hidden in _HIDDEN)
        shown = "" if value is None or secret else f"`{value}`"
        meaning = field.description or ""
        if get_origin(field.annotation) is Literal:
            choices = ", ".join(f"`{choice}`" for choice in get_args(field.annotation))
            meaning = f"{meaning} (one of {choices})".lstrip()
        yield variable, shown, meaning


def defaults(settings: type[BaseSettings]) -> BaseSettings:
    """The settings of a service started with nothing set, whatever the environment of
    whoever asks: model_construct reads no source (no environment, no .env file) and
    calls every default factory."""
    return settings.model_construct()


def settings_table(settings: type[BaseSettings], title: str) -> str:
    """One service's settings as a Markdown table, with the defaults it runs with."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    rows = setting_rows(defaults(settings), prefix)
    lines = [f"## {title}", "", "| variable | default | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{var}` | {shown} | {doc} |" for var, shown, doc in rows]
    return "\n".join(lines) + "\n"
