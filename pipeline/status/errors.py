"""Errors of the status command."""

from __future__ import annotations


class StatusError(Exception):
    """A service could not be read (unreachable, timed out); reading again may work."""


class StatusConfigError(StatusError):
    """The settings of capture and apply disagree, so the status would mix two pipelines."""
