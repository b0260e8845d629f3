"""A change of a streamed transaction encoded when it arrives: what its spool holds instead
of the pgoutput message, so that the commit has only its own fields left to write.

A record's key and the value's images depend on the row alone, and on the table version
that encodes it; the value's fields before the images do not (docs/wire-contract.md,
"What the commit fills in"): ``commit_lsn``, ``xid`` and ``commit_ts`` come with Stream
Commit, ``ordinal`` counts the records the transaction keeps (a rolled-back
subtransaction's take none), and ``change_lsn`` is the message's own. They are Avro
longs, zig-zag varints of varying length, so they cannot be patched into finished
bytes at fixed offsets: the spool keeps the key fields and the images, and the commit
writes the value's head, the key's header and the headers around them, as the
unstreamed path does for the same row (``ChangeStream.handle_frame``, and the compiled
stream's ``take_frames``), byte for byte.

Invariants:

- Only a row message the compiled encoder takes whole is encoded (an Insert, an Update
  with only its new tuple, a Delete; not a Delete where tombstones follow): exactly the
  messages the unstreamed path encodes with that encoder, so the bytes are the same.
  Anything else is spooled as its pgoutput message and decoded at the commit, as before.
- The change names the encoder that wrote it (``id`` of the ``TextRowEncoder``, alive as
  long as its transaction's spool is: :mod:`capture.stream.in_progress` holds the
  codecs). At the commit its bytes are used as they are only with the table version the
  change stream has then for the oid; that is the encoder's own codec, which the change
  stream adopts at the transaction's Relation, or one of an equal relation and schema.
- The head is read bounds-checked: a short or foreign entry is a :class:`ProtocolError`.

Layout: tag :data:`ENCODED_CHANGE`, Int32 relation oid, Int8 pgoutput tag (``I``, ``U``,
``D``), Int64 encoder identity, Int32 key fields' length, the key fields, the images to
the end.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from capture.errors import ProtocolError
from schemas.avro_binary import long_
from schemas.lsn import Lsn

if TYPE_CHECKING:
    from capture.rows.native import RowEncoder

try:
    from capture_native import ENCODED_CHANGE
except ImportError:
    # Not built: no compiled encoder, so nothing is encoded at arrival and no spool
    # holds such a change.
    ENCODED_CHANGE = -1

__all__ = ["ENCODED_CHANGE", "EncodedChange", "decode", "encode"]

_HEAD = struct.Struct(">BIBQI")


@dataclass(frozen=True, slots=True)
class EncodedChange:
    """One change as its spool holds it."""

    oid: int
    tag: int
    """The pgoutput tag of the row message (``I``, ``U``, ``D``)."""
    encoder: int
    """The identity (``id``) of the compiled encoder that wrote it."""
    key_fields: bytes
    """The key record's fields, without its header."""
    images: bytes
    """The value's fields after ``ordinal``."""


def encode(encoder: RowEncoder, message: bytes, change_lsn: Lsn) -> bytes | None:
    """The spooled form of the pgoutput row ``message`` (protocol version 1) made at
    ``change_lsn``, encoded by ``encoder``; None when the encoder leaves it to the
    Python path (the message is then spooled as it is)."""
    record = encoder.encode_change(message, b"", b"", change_lsn, b"", 0)
    if record is None:
        return None
    # The value is change_lsn, ordinal 0 (one byte), then the images.
    images = record.value[len(long_(change_lsn)) + 1 :]
    key = record.key
    return (
        _HEAD.pack(ENCODED_CHANGE, int.from_bytes(message[1:5]), message[0], id(encoder), len(key))
        + key
        + images
    )


def decode(data: bytes) -> EncodedChange:
    """The change in ``data``, a spooled entry with tag :data:`ENCODED_CHANGE`."""
    if len(data) < _HEAD.size:
        raise ProtocolError(
            f"a spooled encoded change is {len(data)} bytes, shorter than its "
            f"{_HEAD.size}-byte head: the spool is damaged; restart capture"
        )
    tag, oid, op_tag, encoder, key_length = _HEAD.unpack_from(data)
    end = _HEAD.size + key_length
    if tag != ENCODED_CHANGE or end > len(data):
        raise ProtocolError(
            f"a spooled encoded change has tag {tag} and a {key_length}-byte key in "
            f"{len(data)} bytes: the spool is damaged; restart capture"
        )
    return EncodedChange(oid, op_tag, encoder, data[_HEAD.size : end], data[end:])
