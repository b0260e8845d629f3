"""A bounds-checked cursor over one replication message.

The PostgreSQL replication protocols are big-endian ("network order") and frame every
message, so a decoder always knows where a message ends. :class:`Reader` walks such a
frame from the front.

Invariants:

- Every read checks the frame's length first. Malformed input raises
  :class:`MalformedMessageError` carrying the byte offset where the read started, what was
  wanted and what was found; ``IndexError``, ``struct.error`` and
  ``UnicodeDecodeError`` never escape.
- A failed read does not move the cursor.
- Nothing is copied except the value a read returns; :meth:`Reader.view` and
  :meth:`Reader.rest` return slices that share the frame's memory.
- Strings are NUL-terminated UTF-8. The walsender converts them to the connection's
  ``client_encoding``, which psycopg sets to UTF8.

Formats: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
and https://www.postgresql.org/docs/current/protocol-replication.html.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from capture.errors import ProtocolError

_I16 = struct.Struct("!h")
_U16 = struct.Struct("!H")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_I64 = struct.Struct("!q")
_U64 = struct.Struct("!Q")

_NUL = re.compile(b"\x00")


class MalformedMessageError(ProtocolError):
    """A replication message is malformed: short, unknown, invalid or overlong.

    ``offset`` is the byte position in the message where decoding failed, ``wanted``
    says what the decoder expected there and ``got`` what it found.
    """

    def __init__(self, offset: int, wanted: str, got: str) -> None:
        super().__init__(
            f"malformed replication message at byte {offset}: wanted {wanted}, got {got}"
        )
        self.offset = offset
        self.wanted = wanted
        self.got = got


class Reader:
    """Sequential big-endian reads over one message frame."""

    __slots__ = ("_buf", "_end", "_pos")

    def __init__(self, buf: bytes | memoryview) -> None:
        view = memoryview(buf)
        if type(buf) is not bytes and (view.format != "B" or view.ndim != 1):
            view = view.cast("B")
        self._buf = view
        self._pos = 0
        self._end = len(view)

    @property
    def offset(self) -> int:
        """Position of the next byte to read."""
        return self._pos

    def remaining(self) -> int:
        """Number of bytes not read yet."""
        return self._end - self._pos

    def u8(self) -> int:
        pos = self._pos
        if pos >= self._end:
            raise self._short(1)
        self._pos = pos + 1
        return self._buf[pos]

    def i16(self) -> int:
        pos = self._pos
        if pos + 2 > self._end:
            raise self._short(2)
        self._pos = pos + 2
        value: int = _I16.unpack_from(self._buf, pos)[0]
        return value

    def u16(self) -> int:
        pos = self._pos
        if pos + 2 > self._end:
            raise self._short(2)
        self._pos = pos + 2
        value: int = _U16.unpack_from(self._buf, pos)[0]
        return value

    def i32(self) -> int:
        pos = self._pos
        if pos + 4 > self._end:
            raise self._short(4)
        self._pos = pos + 4
        value: int = _I32.unpack_from(self._buf, pos)[0]
        return value

    def u32(self) -> int:
        pos = self._pos
        if pos + 4 > self._end:
            raise self._short(4)
        self._pos = pos + 4
        value: int = _U32.unpack_from(self._buf, pos)[0]
        return value

    def i64(self) -> int:
        pos = self._pos
        if pos + 8 > self._end:
            raise self._short(8)
        self._pos = pos + 8
        value: int = _I64.unpack_from(self._buf, pos)[0]
        return value

    def u64(self) -> int:
        pos = self._pos
        if pos + 8 > self._end:
            raise self._short(8)
        self._pos = pos + 8
        value: int = _U64.unpack_from(self._buf, pos)[0]
        return value

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        """Read several fixed-size fields at once, with one bounds check.

        Messages with a fixed layout use this rather than one call per field.
        """
        pos = self._pos
        size = layout.size
        if pos + size > self._end:
            raise self._short(size)
        self._pos = pos + size
        return layout.unpack_from(self._buf, pos)

    def u32_array(self, count: int) -> tuple[int, ...]:
        """Read ``count`` unsigned 32-bit integers, checking the whole length first.

        The up-front check matters because ``count`` comes off the wire: a corrupt count
        must fail before anything is allocated for it.
        """
        pos = self._pos
        size = 4 * count
        if count < 0 or pos + size > self._end:
            raise self._short(size)
        self._pos = pos + size
        return struct.unpack_from(f"!{count}I", self._buf, pos)

    def bytes_(self, n: int) -> bytes:
        """Read ``n`` bytes as an owned ``bytes`` object (detached from the frame)."""
        pos = self._pos
        if n < 0 or pos + n > self._end:
            raise self._short(n)
        self._pos = pos + n
        return self._buf[pos : pos + n].tobytes()

    def counted_bytes(self) -> bytes:
        """Read an Int32 length followed by that many bytes, as an owned ``bytes``."""
        pos = self._pos
        end = self._end
        if pos + 4 > end:
            raise self._short(4)
        start = pos + 4
        n: int = _U32.unpack_from(self._buf, pos)[0]
        stop = start + n
        if stop > end:
            raise MalformedMessageError(start, f"{n} bytes", f"{end - start} bytes left in message")
        self._pos = stop
        return self._buf[start:stop].tobytes()

    def view(self, n: int) -> memoryview:
        """Read ``n`` bytes as a slice sharing the frame's memory."""
        pos = self._pos
        if n < 0 or pos + n > self._end:
            raise self._short(n)
        self._pos = pos + n
        return self._buf[pos : pos + n]

    def rest(self) -> memoryview:
        """Read everything that is left, as a slice sharing the frame's memory."""
        pos = self._pos
        self._pos = self._end
        return self._buf[pos:]

    def cstring(self) -> str:
        """Read a NUL-terminated UTF-8 string; the NUL is consumed, not returned."""
        pos = self._pos
        match = _NUL.search(self._buf, pos)
        if match is None:
            raise MalformedMessageError(pos, "NUL-terminated string", "end of message before NUL")
        nul = match.start()
        try:
            text = str(self._buf[pos:nul], "utf-8")
        except UnicodeDecodeError as exc:
            bad = self._buf[pos + exc.start]
            raise MalformedMessageError(
                pos + exc.start, "UTF-8 text", f"invalid byte 0x{bad:02x}"
            ) from exc
        self._pos = nul + 1
        return text

    def finish(self) -> None:
        """Assert the frame is fully consumed; trailing bytes mean we misread it."""
        left = self._end - self._pos
        if left:
            raise MalformedMessageError(self._pos, "end of message", f"{left} trailing bytes")

    def _short(self, wanted: int) -> MalformedMessageError:
        return MalformedMessageError(
            self._pos, f"{wanted} bytes", f"{self._end - self._pos} bytes left in message"
        )
