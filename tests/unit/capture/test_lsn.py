"""LSN text form: exactly what PostgreSQL's pg_lsn type reads and writes."""

from __future__ import annotations

import pytest

from schemas.lsn import INVALID_LSN, MAX_LSN, format_lsn, parse_lsn


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0/0", 0),
        ("0/16B3748", 0x16B3748),
        ("16/B374D848", 0x16_B374_D848),
        ("1/0", 1 << 32),
        ("0/FFFFFFFF", 0xFFFF_FFFF),
        ("FFFFFFFF/FFFFFFFF", 0xFFFF_FFFF_FFFF_FFFF),
    ],
)
def test_parse_and_format_agree_with_postgresql(text, value):
    assert parse_lsn(text) == value
    assert format_lsn(value) == text


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16/b374d848", 0x16_B374_D848),
        ("00000016/0B374D84", 0x16_0B37_4D84),
        ("0/00000000", 0),
    ],
)
def test_parse_accepts_lower_case_and_zero_padding_like_pg_lsn_input(text, value):
    assert parse_lsn(text) == value


@pytest.mark.parametrize(
    "value", [0, 1, 0xFFFF_FFFF, 1 << 32, (1 << 32) + 1, 0x16_B374_D848, MAX_LSN]
)
def test_round_trip(value):
    assert parse_lsn(format_lsn(value)) == value


def test_format_does_not_pad():
    assert format_lsn(0x1_0000_000A) == "1/A"


def test_invalid_lsn_is_zero():
    assert INVALID_LSN == 0
    assert isinstance(INVALID_LSN, int)
    assert format_lsn(INVALID_LSN) == "0/0"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "/",
        "0/",
        "/0",
        "0",
        "16B374D848",
        "1/2/3",
        "123456789/0",
        "0/123456789",
        "0x1/0",
        " 0/1",
        "0/1 ",
        "0/1\n",
        "+1/0",
        "-1/0",
        "1_0/0",
        "g/0",
        "\uff10/0",  # FULLWIDTH DIGIT ZERO: int() would accept it
        "0 / 1",
    ],
)
def test_parse_rejects_anything_pg_lsn_rejects(text):
    with pytest.raises(ValueError, match="invalid LSN") as info:
        parse_lsn(text)
    assert "16/B374D848" in str(info.value)


@pytest.mark.parametrize("value", [-1, MAX_LSN + 1])
def test_format_rejects_values_outside_64_bits(value):
    with pytest.raises(ValueError, match="outside the unsigned 64-bit range"):
        format_lsn(value)
