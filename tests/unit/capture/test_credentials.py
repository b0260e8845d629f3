"""What a refused connection to the source database means: which failures a setting
must fix (config errors naming it) and which may heal by themselves (transient)."""

from __future__ import annotations

import psycopg
import pytest

from capture.errors import ConfigError, TransientError
from capture.source.credentials import connection_error

# libpq's texts, as recorded against a TLS-only PostgreSQL 15 (tests/integration).
_PREFIX = 'connection failed: connection to server at "127.0.0.1", port 41555 failed: '


@pytest.mark.parametrize(
    ("failure", "names"),
    [
        ('FATAL:  password authentication failed for user "capture"', "_PASSWORD_FILE"),
        ("SSL error: certificate verify failed", "sslrootcert in CAPTURE_POSTGRES__DSN"),
        ('root certificate file "/nonexist" does not exist', "sslrootcert"),
        (
            'FATAL:  no pg_hba.conf entry for host "127.0.0.1", user "capture", database '
            '"postgres", no encryption',
            "sslmode=verify-full",
        ),
    ],
)
def test_failures_a_setting_must_fix_are_config_errors(failure: str, names: str) -> None:
    error = connection_error(psycopg.OperationalError(_PREFIX + failure))
    assert isinstance(error, ConfigError)
    assert names in str(error)
    assert failure in str(error)


def test_a_refused_connection_is_transient() -> None:
    error = connection_error(psycopg.OperationalError(_PREFIX + "Connection refused"))
    assert isinstance(error, TransientError)
