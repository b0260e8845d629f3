"""Every environment variable with a service's prefix names one of its settings.

pydantic-settings reads only the variables that match a field: a name whose first part
matches nothing (``APPLY_LAKE_DELETION_VECTORS``, one underscore short, or
``CAPTURE_STREAMNG``) is never read, and the service would start on its defaults without
a word. So before the settings are read, every variable that starts with the service's
prefix is walked through the settings model (:func:`resolve`), the same walk for a name
misspelt at the top (``CAPTURE_STREAMNG``) as inside a group
(``CAPTURE_POSTGRES__SLOTT``); one that names no setting stops the start with a
:class:`~runtime.errors.ConfigError` naming the closest setting. The deployment files'
variables go through the same :func:`resolve` in tests/unit/deploy/test_deploy_contract.py.

A setting a service no longer has is refused the same way, but with what replaced it:
the settings class lists it in ``retired_settings`` (:class:`ServiceSettings`), so a
deployment that still sets it learns why it is gone rather than a guess at a near name.

The walk follows pydantic-settings' rules: prefix and names are case-insensitive, the
nested delimiter (``__``) separates levels, and below a ``dict`` field one more part
names a single key of the map.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator, Mapping
from types import UnionType
from typing import Any, ClassVar, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from runtime.errors import ConfigError

_SERVICE_LINK = re.compile(r"_SERVICE_(?:HOST|PORT)(?:_|$)")
"""What Kubernetes puts in a pod's environment for each Service of its namespace
(``<NAME>_SERVICE_HOST``, ``<NAME>_SERVICE_PORT``), unless the pod turns service links
off: no setting ends so."""


def _without_none(annotation: Any) -> Any:
    """``X | None`` -> ``X``; anything else unchanged."""
    if get_origin(annotation) in (Union, UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings group a field holds (``X`` or ``X | None``), or None for a value."""
    inner = _without_none(annotation)
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        return inner
    return None


def is_json(annotation: Any) -> bool:
    """pydantic-settings reads lists, dicts and models from the environment as JSON."""
    inner = _without_none(annotation)
    return get_origin(inner) in (list, dict) or model_of(inner) is not None


def env_prefix(settings_cls: type[BaseSettings]) -> str:
    return str(settings_cls.model_config.get("env_prefix") or "")


def _delimiter(settings_cls: type[BaseSettings]) -> str:
    delimiter = settings_cls.model_config.get("env_nested_delimiter")
    if not delimiter:
        raise ValueError(f"{settings_cls.__name__} has no env_nested_delimiter")
    return str(delimiter)


def resolve(settings_cls: type[BaseSettings], env_name: str) -> tuple[tuple[str, ...], Any]:
    """The field path ``env_name`` sets in ``settings_cls`` and that field's annotation:
    ``CAPTURE_POSTGRES__DSN`` -> ``(("postgres", "dsn"), str)``. Raises LookupError
    naming the part that no field matches."""
    prefix = env_prefix(settings_cls)
    if not env_name.upper().startswith(prefix.upper()):
        raise LookupError(f"{env_name} lacks the {prefix} prefix of {settings_cls.__name__}")
    parts = tuple(p.lower() for p in env_name[len(prefix) :].split(_delimiter(settings_cls)))
    model: type[BaseModel] | None = settings_cls
    annotation: Any = None
    for depth, part in enumerate(parts):
        if model is None:
            parent = ".".join(parts[:depth])
            raise LookupError(f"{env_name}: {parent} is a single setting, it has no {part!r}")
        field = model.model_fields.get(part)
        if field is None:
            raise LookupError(
                f"{env_name}: {model.__name__} has no field {part!r}; "
                f"it has {', '.join(sorted(model.model_fields))}"
            )
        annotation = field.annotation
        inner = _without_none(annotation)
        if get_origin(inner) is dict and depth < len(parts) - 1:
            if depth == len(parts) - 2:
                return parts, get_args(inner)[1]
            mapping = ".".join(parts[: depth + 1])
            raise LookupError(f"{env_name}: {mapping} is a map, only one key goes below it")
        model = model_of(annotation)
    return parts, annotation


def setting_names(settings_cls: type[BaseSettings]) -> list[str]:
    """Every variable that sets one setting of ``settings_cls`` (groups walked into)."""
    delimiter = _delimiter(settings_cls)

    def walk(model: type[BaseModel], prefix: str) -> Iterator[str]:
        for name, field in model.model_fields.items():
            variable = f"{prefix}{name.upper()}"
            group = model_of(field.annotation)
            if group is None:
                yield variable
            else:
                yield from walk(group, variable + delimiter)

    return list(walk(settings_cls, env_prefix(settings_cls)))


def retired_variables(settings_cls: type[BaseSettings]) -> dict[str, str]:
    """The variables of the settings ``settings_cls`` no longer has, each with what to
    know instead (:attr:`ServiceSettings.retired_settings`)."""
    retired: Mapping[str, str] = getattr(settings_cls, "retired_settings", {})
    prefix = env_prefix(settings_cls).upper()
    return {prefix + name.upper(): why for name, why in retired.items()}


def unknown_variables(settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> list[str]:
    """One line per variable of ``environ`` with the service's prefix that names no
    setting: for a retired setting, why it is gone; else the closest setting's name."""
    prefix = env_prefix(settings_cls).upper()
    names = setting_names(settings_cls)
    retired = retired_variables(settings_cls)
    problems = []
    for variable in sorted(environ):
        if not variable.upper().startswith(prefix):
            continue
        if variable.upper() in retired:
            problems.append(f"{variable} is retired: {retired[variable.upper()]}")
            continue
        try:
            resolve(settings_cls, variable)
        except LookupError as exc:
            if _SERVICE_LINK.search(variable.upper()):
                service = prefix.lower().replace("_", "-")
                problems.append(
                    f"{variable} looks like a Kubernetes service link of a Service named "
                    f"{service}...: set enableServiceLinks: false on the pod"
                )
                continue
            closest = difflib.get_close_matches(variable.upper(), names, n=1, cutoff=0.6)
            problems.append(
                f"{variable} names no setting: did you mean {closest[0]}?"
                if closest
                else f"{exc} (docs/configuration.md lists every setting)"
            )
    return problems


def check_environment(settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError` when a variable with the service's prefix names no
    setting: the service would otherwise start without it, silently."""
    problems = unknown_variables(settings_cls, environ)
    if problems:
        raise ConfigError(
            f"environment variables with the {env_prefix(settings_cls)} prefix must name a "
            "setting, or the service would start without them: "
            + "; ".join(problems)
            + ". Correct or unset them"
        )


class EnvironmentCheck(PydanticBaseSettingsSource):
    """A settings source that adds nothing: it runs :func:`check_environment` on the
    process environment when the settings are read from it."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        check_environment(self.settings_cls, os.environ)
        return {}


class ServiceSettings(BaseSettings):
    """A service's settings class: read from the environment after
    :class:`EnvironmentCheck` has found every prefixed variable to name a setting."""

    retired_settings: ClassVar[Mapping[str, str]] = {}
    """Settings the service no longer has, by variable name without the prefix
    (``LAKE__CHANGE_LOG``), each with what to know instead: a variable naming one stops
    the start with that message."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            EnvironmentCheck(settings_cls),
            env_settings,
            dotenv_settings,
            file_secret_settings,
        )
