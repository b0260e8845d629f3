"""The compiled producer's pure parts: how properties are written, what a report says
about an offset librdkafka did not give, and which library it drives."""

from __future__ import annotations

import pytest

from capture.publish import native_producer
from capture.publish.native_producer import _property


def test_properties_are_written_as_librdkafka_reads_them() -> None:
    assert [_property(v) for v in (True, False, 5, 0.5, "lz4")] == [
        "true",
        "false",
        "5",
        "0.5",
        "lz4",
    ]


def test_a_report_without_an_offset_says_none() -> None:
    compiled = pytest.importorskip("capture_native")
    assert compiled.Delivered("t", 0, -1001).offset() is None
    delivered = compiled.Delivered("t", 3, 7)
    assert (delivered.topic(), delivered.partition(), delivered.offset()) == ("t", 3, 7)


def test_the_library_is_the_one_confluent_kafka_loaded() -> None:
    path = native_producer.library()
    try:
        import capture_native  # noqa: F401, PLC0415
    except ImportError:
        assert path is None
        return
    assert path is not None
    assert "librdkafka" in path.rsplit("/", 1)[-1]
