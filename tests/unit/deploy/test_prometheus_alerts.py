"""The example alert rules name only metrics the services define, and every recorded
series they use is recorded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from apply.metrics import ApplyMetrics
from capture.metrics import CaptureMetrics
from runtime.telemetry import Health

ALERTS = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "alerts.yaml"
_METRIC = re.compile(r"\bcdc_[a-z_]+\b")
_RECORDED = re.compile(r"\bcdc:[a-z_]+\b")


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    assert document["kind"] == "PrometheusRule"
    return [rule for group in document["spec"]["groups"] for rule in group["rules"]]


def test_every_metric_in_the_rules_exists() -> None:
    defined = CaptureMetrics(health=Health(1.0)).names() | ApplyMetrics(health=Health(1.0)).names()
    used = {name for rule in _rules() for name in _METRIC.findall(rule["expr"])}
    assert used, "no metric found in the rules"
    assert used - defined == set()


def test_recorded_series_are_recorded_and_alerts_are_named() -> None:
    rules = _rules()
    recorded = {rule["record"] for rule in rules if "record" in rule}
    used = {name for rule in rules for name in _RECORDED.findall(rule["expr"])}
    assert used <= recorded
    alerts = [rule for rule in rules if "alert" in rule]
    assert {
        "CdcSlotRetainedWalHigh",
        "CdcSlotWalUnreserved",
        "CdcSlotLost",
        "CdcApplyLagHigh",
        "CdcApplyErroredTables",
        "CdcNotReady",
    } <= {rule["alert"] for rule in alerts}
    assert all(rule["annotations"]["summary"] for rule in alerts)
