"""Raw Kafka cluster ids for the launcher's tests: the one whose text begins with a dash, which
``kafka-storage format`` once took for an option (``deploy/local/kafka.py``)."""

from __future__ import annotations

DASH_FIRST = bytes([0xF8]) + bytes(15)
"""Six leading bits 111110: base64 index 62, which URL-safe base64 writes as ``-``."""
