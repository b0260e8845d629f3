"""Log sequence numbers: byte positions in the PostgreSQL write-ahead log.

An LSN is an unsigned 64-bit integer. PostgreSQL writes it as two hexadecimal halves
separated by a slash, ``hi/lo``, where each half is the upper or lower 32 bits, printed
in upper case without zero padding (``0/16B3748``, ``16/B374D848``); see the ``pg_lsn``
type, https://www.postgresql.org/docs/current/datatype-pg-lsn.html.

Invariants:

- :func:`format_lsn` produces exactly the text PostgreSQL's ``pg_lsn`` output produces,
  so LSNs in logs and SQL compare as strings with what ``psql`` shows.
- :func:`parse_lsn` accepts what ``pg_lsn`` input accepts (1 to 8 hex digits per half,
  either case) and nothing else: no whitespace, signs, ``0x`` prefixes or underscores.
- ``parse_lsn(format_lsn(x)) == x`` for every ``0 <= x < 2**64``.
- :data:`INVALID_LSN` (``0/0``) means "no position"; PostgreSQL never assigns it to a
  WAL record.
"""

from __future__ import annotations

import re
from typing import NewType

Lsn = NewType("Lsn", int)

INVALID_LSN = Lsn(0)

MAX_LSN = Lsn(0xFFFF_FFFF_FFFF_FFFF)

_LSN_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def parse_lsn(text: str) -> Lsn:
    """Parse the ``hi/lo`` text form, e.g. ``16/B374D848``, into an :data:`Lsn`."""
    match = _LSN_TEXT.fullmatch(text)
    if match is None:
        raise ValueError(
            f"invalid LSN {text!r}: expected two hexadecimal numbers of 1 to 8 digits "
            "separated by '/', as PostgreSQL prints them (e.g. '16/B374D848')"
        )
    return Lsn((int(match[1], 16) << 32) | int(match[2], 16))


def format_lsn(lsn: int) -> str:
    """Format an LSN the way PostgreSQL's ``pg_lsn`` output does, e.g. ``0/16B3748``."""
    if not 0 <= lsn <= MAX_LSN:
        raise ValueError(f"LSN {lsn} is outside the unsigned 64-bit range 0..{MAX_LSN}")
    return f"{lsn >> 32:X}/{lsn & 0xFFFF_FFFF:X}"
