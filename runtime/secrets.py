"""Secrets read from files: a Kubernetes Secret mounted as a directory, or one file.

Invariants:

- A secret's value is the file's content with **one** trailing newline removed (what
  ``echo`` and most editors add; Kubernetes stores exactly what it was given), nothing
  else stripped, so a password that ends in spaces survives.
- A file that cannot be read is a :class:`~runtime.errors.ConfigError` naming the file
  and the setting that points at it, never a traceback and never the content.
- Values are only returned, never logged; callers keep passwords in
  :class:`~pydantic.SecretStr` until the moment a client needs the plain string.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from runtime.errors import ConfigError


def read_secret_file(path: Path, *, setting: str) -> str:
    """The secret in ``path``, minus one trailing newline; ``setting`` names the setting
    that pointed here, for the error message."""
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the secret file {path} given by {setting}: {exc.__class__.__name__}"
            f" ({getattr(exc, 'strerror', None) or exc}); mount the secret there or fix "
            f"{setting}"
        ) from exc
    return content.removesuffix("\n")


def resolve_password(
    password: SecretStr | None, password_file: Path | None, *, setting: str
) -> SecretStr | None:
    """The password given inline or in a file (``setting`` is the env name of the inline
    one, e.g. ``CAPTURE_POSTGRES__PASSWORD``; the file's is ``<setting>_FILE``). Both at
    once is ambiguous and refused rather than one silently winning."""
    if password is not None and password_file is not None:
        raise ConfigError(
            f"both {setting} and {setting}_FILE are set: keep one (the file, for a mounted secret)"
        )
    if password_file is not None:
        return SecretStr(read_secret_file(password_file, setting=f"{setting}_FILE"))
    return password
