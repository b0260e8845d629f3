"""How both services write their logs: plain text for people, or one JSON object per
line for log pipelines, with the table, LSN and batch id as fields. Never row values or
secrets, in either format."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LogSettings(BaseModel):
    """Log format and cadence (``<PREFIX>_LOG__*``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["text", "json"] = Field(
        "text", description="text, or json: one object per line with structured fields"
    )
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")
    progress_interval_s: float = Field(
        30.0, gt=0, description="how often a progress line (rates, LSNs, lag) is logged"
    )
