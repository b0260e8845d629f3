"""The compiled row encoder (``native/``, the ``capture_native`` extension), where built.

Rows whose every column arrives as text -- nearly every pgoutput tuple, and every COPY
row without an escape -- are the bulk of capture's work. For a table whose every column
has a :attr:`~capture.rows.typemap.ColumnMapping.text_kind`, :func:`row_encoder` gives the
encoder that turns such a row's texts straight into the Avro bytes of its row image and
key (``native/src/lib.rs`` says how it is held to the Python path byte for byte).

Invariants:

- The Python path is the reference and the fallback. A table with any other column, a
  row with a null or unchanged-TOAST column, and a text the encoder does not take (it
  returns None) all go through ``TableCodec.row`` and :mod:`schemas.avro_binary`, which
  give the same bytes or the error the user sees.
- Without the extension (not built: no Rust toolchain where capture was installed)
  every row takes the Python path: slower, never different. :data:`AVAILABLE` says
  which applies; capture logs it at start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from capture.rows.typemap import TextKind

if TYPE_CHECKING:
    from capture_native import ChangeRecord, CopyRecords, EncodedRow


class RowEncoder(Protocol):
    """What ``capture_native.TextRowEncoder`` offers."""

    def encode(self, values: tuple[bytes | None, ...], /) -> EncodedRow | None:
        """The row fields and key fields, without headers, or None: take the Python
        path."""
        ...

    def encode_change(  # noqa: PLR0917 -- the compiled method takes positions only
        self,
        message: bytes,
        key_header: bytes,
        value_start: bytes,
        change_lsn: int,
        value_middle: bytes,
        ordinal: int,
        /,
    ) -> ChangeRecord | None:
        """The whole record of a pgoutput Insert, of an Update with only its new tuple,
        or of a Delete: key, value and change LSN text, the value ``value_start``,
        ``change_lsn``, ``value_middle``, ``ordinal``, then the images; None: decode
        the message in Python."""
        ...

    def encode_copy(
        self, data: bytes, key_header: bytes, value_head: bytes, first_ordinal: int, /
    ) -> CopyRecords:
        """A snapshot's records from COPY text: keys, values and the rest; a key of None
        leaves that line (the value) to the Python path (``native/src/lib.rs``)."""
        ...

    def __len__(self) -> int: ...


NewRowEncoder = Callable[[list[str], list[int], list[bool]], RowEncoder]
"""``TextRowEncoder(kinds, key_columns, key_nullable)``."""

try:
    from capture_native import TextRowEncoder as _Compiled

    _ENCODER: NewRowEncoder | None = _Compiled
except ImportError:  # not built here: every row takes the Python path
    _ENCODER = None

AVAILABLE = _ENCODER is not None
"""Whether rows can take the compiled path in this process."""


def row_encoder(
    kinds: Sequence[TextKind | None],
    key_columns: Sequence[int],
    key_nullable: Sequence[bool],
) -> RowEncoder | None:
    """The compiled encoder of a table version whose columns read as ``kinds`` (one per
    column, in order), keyed by ``key_columns`` (indexes, in key order, each nullable in
    the key schema or not); None when the extension is not there or a column has no
    kind."""
    if _ENCODER is None or any(kind is None for kind in kinds):
        return None
    return _ENCODER([str(kind) for kind in kinds], list(key_columns), list(key_nullable))
