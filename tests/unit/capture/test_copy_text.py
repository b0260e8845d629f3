"""COPY text rows become the tuples pgoutput would send for the same values."""

from __future__ import annotations

import pytest

from capture.errors import ProtocolError
from capture.pgoutput import ColumnKind
from capture.snapshot.copy_text import CopyRows, unescape


def test_rows_split_across_chunks_and_nulls() -> None:
    rows = CopyRows(3)
    first = list(rows.feed(b"1\t\\N\tab"))
    assert first == []
    second = list(rows.feed(b"c\n2\tx\t\\N\n"))
    assert [r.values for r in second] == [(b"1", None, b"abc"), (b"2", b"x", None)]
    assert second[0].kinds == (ColumnKind.TEXT, ColumnKind.NULL, ColumnKind.TEXT)
    rows.finish()


@pytest.mark.parametrize(
    ("escaped", "raw"),
    [
        (b"a\\tb", b"a\tb"),
        (b"line\\nnext\\r", b"line\nnext\r"),
        (b"back\\\\slash", b"back\\slash"),
        (b"\\b\\f\\v", b"\b\f\v"),
        (b"\\101\\x42", b"AB"),
        (b"\\N-not-alone", b"N-not-alone"),
        (b"plain", b"plain"),
    ],
)
def test_unescape(escaped: bytes, raw: bytes) -> None:
    assert unescape(escaped) == raw


def test_a_literal_backslash_n_text_is_not_null() -> None:
    # The text value "\N" is written as \\N by COPY, so only the exact field \N is NULL.
    (row,) = CopyRows(1).feed(b"\\\\N\n")
    assert row.values == (b"\\N",)
    assert row.kinds == (ColumnKind.TEXT,)


def test_wrong_column_count_and_cut_stream_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="2 columns where 3"):
        list(CopyRows(3).feed(b"a\tb\n"))
    rows = CopyRows(1)
    list(rows.feed(b"partial"))
    with pytest.raises(ProtocolError, match="inside a row"):
        rows.finish()
