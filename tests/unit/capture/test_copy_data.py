"""CopyData framing: XLogData and keepalives in, standby status updates out."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from capture.errors import ProtocolError
from capture.pgoutput import Begin, MalformedMessageError, decode
from capture.stream.copy_data import (
    PRIMARY_KEEPALIVE,
    STANDBY_STATUS_UPDATE,
    XLOG_DATA,
    PrimaryKeepalive,
    XLogData,
    encode_status_update,
    encode_xlog_data,
    parse_copy_data,
    pg_now_micros,
)
from schemas.lsn import MAX_LSN, Lsn, parse_lsn

VECTORS = Path(__file__).parent / "vectors"

XLOG_FRAME = (
    b"w"
    + struct.pack("!QQq", 0x16_B374_D848, 0x16_B374_D900, 123_456_789)
    + b"E"  # a StreamStop, the shortest pgoutput message
)
KEEPALIVE_FRAME = b"k" + struct.pack("!Qq", 0x16_B374_D848, -5) + b"\x01"


def test_tags_are_the_protocol_bytes():
    assert (XLOG_DATA, PRIMARY_KEEPALIVE, STANDBY_STATUS_UPDATE) == (0x77, 0x6B, 0x72)


def test_xlog_data_fields_and_payload():
    message = parse_copy_data(XLOG_FRAME)
    assert message == XLogData(
        wal_start=parse_lsn("16/B374D848"),
        wal_end=parse_lsn("16/B374D900"),
        send_time=123_456_789,
        payload=memoryview(b"E"),
    )


def test_xlog_data_payload_is_a_view_of_the_frame():
    frame = bytearray(XLOG_FRAME)
    message = parse_copy_data(memoryview(frame))
    assert isinstance(message, XLogData)
    assert message.payload.obj is frame
    frame[-1:] = b"Z"
    assert bytes(message.payload) == b"Z"


def test_xlog_data_may_carry_an_empty_payload():
    message = parse_copy_data(XLOG_FRAME[:-1])
    assert isinstance(message, XLogData)
    assert len(message.payload) == 0


def test_an_encoded_xlog_data_frame_reads_back_as_the_server_would_send_it():
    begin = b"B" + struct.pack("!QqI", 0x5000, 777, 42)
    frame = encode_xlog_data(Lsn(0x16_B374_D848), begin)
    assert frame[0] == XLOG_DATA
    message = parse_copy_data(frame)
    assert message == XLogData(
        wal_start=Lsn(0x16_B374_D848),
        wal_end=Lsn(0x16_B374_D848),
        send_time=0,
        payload=memoryview(begin),
    )
    assert decode(message.payload) == Begin(Lsn(0x5000), 777, 42)


def test_keepalive_fields():
    assert parse_copy_data(KEEPALIVE_FRAME) == PrimaryKeepalive(
        wal_end=parse_lsn("16/B374D848"), send_time=-5, reply_requested=True
    )
    quiet = parse_copy_data(KEEPALIVE_FRAME[:-1] + b"\x00")
    assert isinstance(quiet, PrimaryKeepalive)
    assert quiet.reply_requested is False


@pytest.mark.parametrize("frame", [XLOG_FRAME, KEEPALIVE_FRAME], ids=["xlog_data", "keepalive"])
def test_every_truncated_header_raises_decode_error(frame):
    header = 25 if frame[:1] == b"w" else len(frame)
    for length in range(header):
        with pytest.raises(MalformedMessageError):
            parse_copy_data(frame[:length])


def test_empty_frame_raises_decode_error():
    with pytest.raises(MalformedMessageError) as info:
        parse_copy_data(b"")
    assert (info.value.offset, info.value.got) == (0, "empty message")
    assert isinstance(info.value, ProtocolError)


@pytest.mark.parametrize("tag", [b"r", b"B", b"\x00"])
def test_unknown_tag_raises_decode_error(tag):
    with pytest.raises(MalformedMessageError) as info:
        parse_copy_data(tag + KEEPALIVE_FRAME[1:])
    assert info.value.offset == 0
    assert info.value.got == f"0x{tag[0]:02x}"


def test_keepalive_with_trailing_bytes_raises_decode_error():
    with pytest.raises(MalformedMessageError) as info:
        parse_copy_data(KEEPALIVE_FRAME + b"\x00")
    assert (info.value.offset, info.value.got) == (18, "1 trailing bytes")


def test_keepalive_with_unknown_reply_flag_raises_decode_error():
    with pytest.raises(MalformedMessageError) as info:
        parse_copy_data(KEEPALIVE_FRAME[:-1] + b"\x02")
    assert info.value.offset == 17


@pytest.mark.parametrize("version", [2, 3])
def test_recorded_frames(version):
    doc = json.loads((VECTORS / f"pgoutput_v{version}.json").read_text())
    samples = doc["copy_data_samples"]
    first = doc["scenarios"][0]["messages"][0]

    xlog = parse_copy_data(bytes.fromhex(samples["xlog_data"]))
    assert isinstance(xlog, XLogData)
    assert xlog.wal_start == parse_lsn(first["wal_start"])
    assert xlog.wal_end == parse_lsn(first["wal_end"])
    assert bytes(xlog.payload) == bytes.fromhex(first["hex"])

    keepalive = parse_copy_data(bytes.fromhex(samples["primary_keepalive"]))
    assert isinstance(keepalive, PrimaryKeepalive)
    # The first keepalive goes out when streaming starts, just before the first change.
    assert abs(keepalive.send_time - xlog.send_time) < 60_000_000
    assert keepalive.wal_end <= xlog.wal_end


def test_recorded_xlog_data_payload_decodes_without_copying_the_frame():
    doc = json.loads((VECTORS / "pgoutput_v2.json").read_text())
    xlog = parse_copy_data(bytes.fromhex(doc["copy_data_samples"]["xlog_data"]))
    assert isinstance(xlog, XLogData)
    begin = decode(xlog.payload)
    assert isinstance(begin, Begin)
    assert begin.xid == doc["scenarios"][0]["facts"]["xid"]


def test_status_update_is_byte_exact():
    encoded = encode_status_update(
        written=parse_lsn("16/B374D848"),
        flushed=parse_lsn("16/B374D800"),
        applied=parse_lsn("0/1000000"),
        now_micros=0x0102_0304_0506_0708,
        reply_requested=True,
    )
    assert encoded == bytes.fromhex(
        "72"  # 'r'
        "00000016b374d848"  # written
        "00000016b374d800"  # flushed
        "0000000001000000"  # applied
        "0102030405060708"  # client clock
        "01"  # reply requested
    )


def test_status_update_defaults_to_no_reply_and_allows_pre_2000_clocks():
    encoded = encode_status_update(Lsn(0), Lsn(0), Lsn(0), now_micros=-1)
    assert encoded == b"r" + b"\x00" * 24 + b"\xff" * 8 + b"\x00"


@pytest.mark.parametrize("bad", [-1, MAX_LSN + 1])
def test_status_update_rejects_lsns_outside_64_bits(bad):
    with pytest.raises(ValueError, match="flushed LSN"):
        encode_status_update(Lsn(0), Lsn(bad), Lsn(0), now_micros=0)


def test_pg_now_micros_counts_from_2000():
    expected = time.time() * 1_000_000 - 946_684_800_000_000
    assert pg_now_micros() == pytest.approx(expected, abs=5_000_000)
