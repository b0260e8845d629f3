"""Both services' settings built from keyword arguments only.

The developer's own ``CAPTURE_*`` and ``APPLY_*`` variables (say from
``.local/stack.env``) and any ``.env`` file must not leak into what a test checks: the
deployment files, or the defaults the settings reference shows."""

from __future__ import annotations

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from apply.settings import ApplySettings
from capture.settings import CaptureSettings


class _ArgumentsOnly:
    """Mixed in before a settings class: its keyword arguments are its only source."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


class CaptureFromArguments(_ArgumentsOnly, CaptureSettings):
    """capture's settings, from keyword arguments only."""


class ApplyFromArguments(_ArgumentsOnly, ApplySettings):
    """apply's settings, from keyword arguments only."""
