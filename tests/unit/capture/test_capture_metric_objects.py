"""capture's metric objects: the lock-free counts, the operation of a record, the
gauges read at scrape time."""

from __future__ import annotations

from capture.in_flight import ProgressBook
from capture.metrics import CaptureMetrics, operation_label
from schemas.control import TableState
from schemas.headers import position_headers, record_headers
from schemas.lsn import Lsn
from schemas.operation import Operation
from schemas.single_object import Fingerprint


def test_operation_label_from_headers() -> None:
    headers = record_headers(Operation.UPDATE, Lsn(16), Lsn(8), Fingerprint(42))
    assert operation_label(headers, b"v") == "UPDATE"
    assert operation_label(position_headers(Lsn(16), Lsn(8)), None) == "tombstone"


def test_counts_and_positions_are_read_at_scrape_time() -> None:
    metrics = CaptureMetrics()
    r = metrics.registry
    headers = record_headers(Operation.INSERT, Lsn(16), Lsn(8), Fingerprint(42))
    for _ in range(2):
        metrics.record_produced("public.t", headers, b"value", 10)
    metrics.records_produced("public.t", headers, 1, 10)  # a batch sharing the headers
    read = record_headers(Operation.READ, Lsn(16), Lsn(16), Fingerprint(42))
    metrics.records_produced("public.t", read, 500, 7000)
    metrics.decoded.add(("public.t", Operation.INSERT))  # as the change stream counts
    metrics.decoded.add(("public.t", Operation.DELETE))
    labels = {"table": "public.t", "operation": "INSERT"}
    assert r.get_sample_value("cdc_capture_records_produced_total", labels) == 3
    assert r.get_sample_value("cdc_capture_changes_decoded_total", labels) == 1
    reads = {"table": "public.t", "operation": "READ"}
    assert r.get_sample_value("cdc_capture_records_produced_total", reads) == 500
    assert r.get_sample_value("cdc_capture_produced_bytes_total", {"table": "public.t"}) == 7030
    book = ProgressBook(Lsn(0))
    book.begin(Lsn(100))
    book.produced(70)
    metrics.book = book
    metrics.position.received_lsn = 200
    metrics.position.confirmed_lsn = 50
    assert r.get_sample_value("cdc_capture_in_flight_records") == 1
    assert r.get_sample_value("cdc_capture_in_flight_bytes") == 70
    assert r.get_sample_value("cdc_capture_received_lsn_bytes") == 200
    assert r.get_sample_value("cdc_capture_confirmed_lsn_bytes") == 50
    assert metrics.decoded.total() == 2


def test_table_state_is_one_series_per_state() -> None:
    metrics = CaptureMetrics()
    metrics.table_states({"public.a": TableState.STREAMING, "public.b": TableState.ERRORED})
    r = metrics.registry
    assert (
        r.get_sample_value("cdc_capture_table_state", {"table": "public.a", "state": "streaming"})
        == 1
    )
    assert (
        r.get_sample_value("cdc_capture_table_state", {"table": "public.a", "state": "errored"})
        == 0
    )
    assert (
        r.get_sample_value("cdc_capture_table_state", {"table": "public.b", "state": "errored"})
        == 1
    )


def test_a_table_newly_errored_counts_as_one_table_error() -> None:
    metrics = CaptureMetrics()
    r = metrics.registry
    metrics.table_states({"public.a": TableState.STREAMING, "public.b": TableState.ERRORED})
    metrics.table_states({"public.a": TableState.STREAMING, "public.b": TableState.ERRORED})
    assert r.get_sample_value("cdc_capture_errors_total", {"kind": "TableError"}) == 1
    metrics.table_states({"public.a": TableState.ERRORED, "public.b": TableState.ERRORED})
    assert r.get_sample_value("cdc_capture_errors_total", {"kind": "TableError"}) == 2
