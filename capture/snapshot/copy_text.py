"""Rows of ``COPY ... TO STDOUT`` in text format, as pgoutput-shaped tuples: pure.

The snapshot reads tables with COPY because it streams rows without a cursor round trip
per batch, and its text format prints every value with the type's output function --
the same text pgoutput sends, under the same session settings
(:data:`capture.rows.typemap.SESSION_SETTINGS`). Turning a COPY line into a
:class:`~capture.pgoutput.TupleData` therefore lets the snapshot reuse the stream's
parsers unchanged, so a row reads the same whichever path it took.

The format (https://www.postgresql.org/docs/current/sql-copy.html, "Text Format"): one
row per line ending in ``\\n``; columns separated by a tab; ``\\N`` is NULL; a backslash
escapes ``\\b \\f \\n \\r \\t \\v \\\\``, and on input also octal (``\\NNN``) and hex
(``\\xNN``) bytes, which the server never writes but a conforming reader accepts. Raw
newlines and tabs never occur inside a value, so splitting first and unescaping after
is exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from capture.errors import ProtocolError
from capture.pgoutput import ColumnKind, TupleData

_NULL = b"\\N"
_ESCAPE = re.compile(rb"\\(x[0-9A-Fa-f]{1,2}|[0-7]{1,3}|.)", re.DOTALL)
_SIMPLE = {
    b"b": b"\b",
    b"f": b"\f",
    b"n": b"\n",
    b"r": b"\r",
    b"t": b"\t",
    b"v": b"\v",
}


def _unescape_one(match: re.Match[bytes]) -> bytes:
    token = match.group(1)
    simple = _SIMPLE.get(token)
    if simple is not None:
        return simple
    if token[:1] == b"x" and len(token) > 1:
        return bytes([int(token[1:], 16)])
    if token[:1].isdigit() and token[:1] not in (b"8", b"9"):
        return bytes([int(token, 8) & 0xFF])
    return token  # any other escaped character stands for itself


def unescape(field: bytes) -> bytes:
    """One column's bytes with COPY's backslash escapes resolved."""
    if b"\\" not in field:
        return field
    return _ESCAPE.sub(_unescape_one, field)


class CopyRows:
    """Splits COPY data chunks into rows, whatever the chunk boundaries.

    PostgreSQL sends one row per CopyData message, but the protocol does not promise
    it, so a partial line is kept until the rest arrives.
    """

    __slots__ = ("_columns", "_kinds", "_pending")

    def __init__(self, columns: int) -> None:
        if columns < 1:
            raise ValueError("a COPY row has at least one column")
        self._columns = columns
        self._pending = b""
        self._kinds = (ColumnKind.TEXT,) * columns

    def feed(self, chunk: bytes) -> Iterator[TupleData]:
        """The complete rows that ``chunk`` finishes, in order."""
        data = self._pending + chunk if self._pending else chunk
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            yield self.row(data[start:end])
            start = end + 1
        self._pending = data[start:]

    def finish(self) -> None:
        """The COPY ended: a partial line left over means the stream was cut."""
        if self._pending:
            raise ProtocolError(
                f"COPY data ended inside a row ({len(self._pending)} bytes without a newline)"
            )

    def row(self, line: bytes) -> TupleData:
        """One complete line (without its newline) as a tuple."""
        fields = line.split(b"\t")
        if len(fields) != self._columns:
            raise ProtocolError(
                f"a COPY row has {len(fields)} columns where {self._columns} were selected"
            )
        if b"\\" not in line:
            return TupleData(self._kinds, tuple(fields))
        values = tuple(None if f == _NULL else unescape(f) for f in fields)
        kinds = tuple(ColumnKind.NULL if v is None else ColumnKind.TEXT for v in values)
        return TupleData(kinds, values)
