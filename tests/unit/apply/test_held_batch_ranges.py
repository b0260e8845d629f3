"""apply.batch.held_batch: a batch's offset ranges from Spark's offset log (the records read
with them are tests/integration/test_apply_held_batch.py's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apply.batch.held_batch import OffsetRange, batch_ranges, parse_offset_log

METADATA = '{"batchWatermarkMs":0,"batchTimestampMs":1796186547350,"conf":{}}'


def entry(offsets: dict[str, dict[str, int]]) -> str:
    """An offset log entry as Spark writes it: version, metadata, the source's offsets."""
    return f"v1\n{METADATA}\n{json.dumps(offsets)}"


def write_log(checkpoint: Path, entries: dict[int, str]) -> None:
    (checkpoint / "offsets").mkdir(parents=True)
    for batch_id, text in entries.items():
        (checkpoint / "offsets" / str(batch_id)).write_text(text)


def test_a_batch_reads_from_the_previous_batchs_offsets_to_its_own(tmp_path: Path) -> None:
    write_log(
        tmp_path,
        {
            4: entry({"cdc.public.a": {"0": 10, "1": 7}, "cdc.public.b": {"0": 3}}),
            5: entry({"cdc.public.a": {"0": 12, "1": 7}, "cdc.public.b": {"0": 9}}),
        },
    )

    assert batch_ranges(str(tmp_path), 5) == (
        OffsetRange("cdc.public.a", 0, 10, 12),
        OffsetRange("cdc.public.b", 0, 3, 9),
    )
    assert batch_ranges(f"file:{tmp_path}", 5) == batch_ranges(str(tmp_path), 5)


def test_what_the_log_cannot_say_is_left_to_spark(tmp_path: Path) -> None:
    write_log(
        tmp_path,
        {
            0: entry({"cdc.public.a": {"0": 10}}),
            1: entry({"cdc.public.a": {"0": 12}, "cdc.public.new": {"0": 4}}),
            2: entry({"cdc.public.a": {"0": 13}, "cdc.public.new": {"0": 5}}),
        },
    )

    # The first batch, and a partition new in a batch, read from the earliest offset,
    # which the reader asks the broker for (start None).
    assert batch_ranges(str(tmp_path), 0) == (OffsetRange("cdc.public.a", 0, None, 10),)
    assert batch_ranges(str(tmp_path), 1) == (
        OffsetRange("cdc.public.a", 0, 10, 12),
        OffsetRange("cdc.public.new", 0, None, 4),
    )
    assert batch_ranges(str(tmp_path), 3) is None  # no entry yet
    assert batch_ranges(str(tmp_path), 2) is not None
    assert batch_ranges("s3a://bucket/checkpoint", 2) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "v2\n{}\n{}",
        f"v1\n{METADATA}",
        f"v1\n{METADATA}\n" + '{"a": {"0": 1}}\n{"b": {"0": 1}}',  # two sources
        f"v1\n{METADATA}\nnot json",
        f"v1\n{METADATA}\n" + '{"a": 5}',
        f"v1\n{METADATA}\n" + '{"a": {"zero": 1}}',
    ],
)
def test_an_entry_not_of_one_kafka_source_is_not_read(text: str) -> None:
    assert parse_offset_log(text) is None


def test_an_entry_of_one_kafka_source_is_read() -> None:
    assert parse_offset_log(entry({"t": {"0": 5, "2": 9}}) + "\n") == {"t": {0: 5, 2: 9}}
