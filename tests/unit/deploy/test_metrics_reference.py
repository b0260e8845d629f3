"""docs/operations.md lists exactly the metrics the services expose."""

from __future__ import annotations

from pathlib import Path

from apply.metrics import ApplyMetrics
from capture.metrics import CaptureMetrics
from deploy.metrics_reference import BEGIN, END, render
from runtime.telemetry import Health

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def test_operations_doc_holds_the_current_reference() -> None:
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == render(), (
        "the metrics reference in docs/operations.md is stale: replace it with the output of "
        "`.venv/bin/python -m deploy.metrics_reference`"
    )


def test_every_exposed_metric_is_in_the_reference() -> None:
    for metrics in (CaptureMetrics(health=Health(1.0)), ApplyMetrics(health=Health(1.0))):
        documented = {d.name for d in metrics.reference}
        histograms = {d.name for d in metrics.reference if d.kind == "histogram"}
        exposed = {
            name
            for name in metrics.names()
            if not name.endswith("_created") and not any(name.startswith(h) for h in histograms)
        }
        assert exposed <= documented
        assert all(metrics.prefix in name for name in documented)
