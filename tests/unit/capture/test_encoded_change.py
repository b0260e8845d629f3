"""A streamed row encoded at arrival, as its spool holds it: what the commit needs reads
back, and a damaged entry is refused, never read past its end."""

from __future__ import annotations

import struct

import pytest

from capture.errors import ProtocolError
from capture.stream import encoded_change
from schemas.avro_binary import long_
from schemas.lsn import Lsn

native = pytest.importorskip("capture_native")

OID = 16384


def insert(key: int) -> bytes:
    values = [str(key).encode(), f"row {key}".encode()]
    row = struct.pack("!H", 2) + b"".join(b"t" + struct.pack("!I", len(v)) + v for v in values)
    return b"I" + struct.pack("!I", OID) + b"N" + row


@pytest.fixture
def encoder() -> object:
    return native.TextRowEncoder(["long", "string"], [0], [False])


def test_an_encoded_row_holds_the_record_but_what_the_commit_decides(encoder):
    change_lsn = Lsn(0x16_B374_D000)
    spooled = encoded_change.encode(encoder, insert(42), change_lsn)
    assert spooled is not None
    change = encoded_change.decode(spooled)
    assert (change.oid, change.tag, change.encoder) == (OID, ord("I"), id(encoder))
    # The whole record with the commit's fields written around the spooled bytes is the
    # record the encoder writes in one go.
    whole = encoder.encode_change(insert(42), b"K", b"S", change_lsn, b"M", 3)
    assert whole.key == b"K" + change.key_fields
    assert whole.value == b"S" + long_(change_lsn) + b"M" + long_(3) + change.images


def test_a_row_the_encoder_leaves_to_python_is_not_encoded(encoder):
    unchanged_toast = b"I" + struct.pack("!I", OID) + b"N" + struct.pack("!H", 2) + b"u" * 2
    assert encoded_change.encode(encoder, unchanged_toast, Lsn(0x100)) is None


@pytest.mark.parametrize("cut", [0, 1, 17, 18])
def test_a_damaged_entry_is_refused(encoder, cut):
    spooled = encoded_change.encode(encoder, insert(42), Lsn(0x100))
    assert spooled is not None
    # Cut into the head, or before the key fields end (one byte here, at 18).
    with pytest.raises(ProtocolError, match="damaged"):
        encoded_change.decode(spooled[:cut])


def test_an_entry_of_another_tag_is_refused(encoder):
    spooled = encoded_change.encode(encoder, insert(42), Lsn(0x100))
    assert spooled is not None
    with pytest.raises(ProtocolError, match="damaged"):
        encoded_change.decode(b"I" + spooled[1:])
