"""The source database's credentials, and what a refused connection means.

- The password comes from ``CAPTURE_POSTGRES__PASSWORD`` or from the file named by
  ``CAPTURE_POSTGRES__PASSWORD_FILE`` (a mounted Secret), never both; the service reads
  it once, at its first attempt, and keeps it as a ``SecretStr``.
- A connection PostgreSQL refuses for a reason only a setting can fix (a wrong
  password, no ``pg_hba.conf`` line for this user and encryption, a server certificate
  the client cannot verify) is a :class:`~capture.errors.ConfigError` saying which
  setting to look at, so the service stops instead of retrying forever; anything else
  (refused, reset, timed out) stays transient.

libpq reports connection failures as text only (no SQLSTATE reaches the client before
the session exists), so the classification reads its messages; they are libpq's and
the server's English texts (with ``lc_messages`` set to another language, a refused
login is retried as transient, and its message still says why).
"""

from __future__ import annotations

import psycopg
from pydantic import SecretStr

from capture.errors import ConfigError, PipelineError, TransientError
from capture.settings import PostgresSettings
from runtime.secrets import resolve_password

_PASSWORD = "CAPTURE_POSTGRES__PASSWORD"  # noqa: S105 - a setting's name
_DSN = "CAPTURE_POSTGRES__DSN"

_LOGIN_REFUSED = ("password authentication failed", "no password supplied")
_NOT_ALLOWED = ("no pg_hba.conf entry",)
_CERTIFICATE = (
    "certificate verify failed",
    "does not match host name",
    "root certificate file",
    "certificate revoked",
)


def source_password(postgres: PostgresSettings) -> SecretStr | None:
    """The password of the source database, inline or from its file."""
    return resolve_password(postgres.password, postgres.password_file, setting=_PASSWORD)


def connection_error(exc: psycopg.OperationalError) -> PipelineError:
    """What a failed connection to the source database means (raise it ``from exc``)."""
    message = str(exc)
    if any(text in message for text in _LOGIN_REFUSED):
        return ConfigError(
            f"PostgreSQL refused the login: {message}; check the user in {_DSN} and the "
            f"password in {_PASSWORD} or {_PASSWORD}_FILE"
        )
    if any(text in message for text in _NOT_ALLOWED):
        return ConfigError(
            f"PostgreSQL does not accept this user from here: {message}; if the server "
            f"requires TLS, add sslmode=verify-full and sslrootcert=<CA file> to {_DSN}, "
            "otherwise ask for a pg_hba.conf line for this user (and for replication)"
        )
    if any(text in message for text in _CERTIFICATE):
        return ConfigError(
            f"PostgreSQL's server certificate could not be verified: {message}; set "
            f"sslrootcert in {_DSN} to the CA that signed it, and connect to a host name "
            "the certificate names"
        )
    return TransientError(f"cannot connect to PostgreSQL: {message}")
