"""Errors of the local launcher; each names the missing piece and how to get it."""

from __future__ import annotations


class LauncherError(Exception):
    """A local service could not be started, reached or stopped."""


class MissingPrerequisite(LauncherError):  # noqa: N818 - reads as a sentence at the raise site
    """A binary, a JDK or the resolved jars are not on this machine."""


class ServiceNotReady(LauncherError):  # noqa: N818
    """A service started but did not become ready in time; its log file says why."""
