"""Wire format: round trips, and every malformed shape rejected with the right code."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from token_scheduler import wire
from token_scheduler.errors import ErrorCode
from token_scheduler.wire import MsgType, WireError


def test_header_is_16_bytes_little_endian() -> None:
    frame = wire.encode_request(0x01020304, pid=7, predicted_burst_us=9)
    assert frame[:4] == b"VCTS"
    assert frame[4] == wire.VERSION and frame[5] == MsgType.REQUEST
    assert frame[8:12] == bytes([4, 3, 2, 1])  # seq, little-endian
    assert struct.unpack_from("<I", frame, 12)[0] == 16 == len(frame) - 16


@pytest.mark.parametrize(
    ("desc", "frame", "msg_type", "fields"),
    [
        ("request", wire.encode_request(1, 42, 500), MsgType.REQUEST, (42, 0, 500)),
        ("release", wire.encode_release(2, 7, 1234, more=True), MsgType.RELEASE, (7, 1234)),
        ("renew", wire.encode_renew(3, 8, 99), MsgType.RENEW, (8, 99)),
        ("ping", wire.encode_ping(4, 2**64 - 1), MsgType.PING, (2**64 - 1,)),
        ("report", wire.encode_report(5, 12, 3_000_000), MsgType.REPORT, (12, 0, 3_000_000)),
    ],
)
def test_client_round_trip(desc: str, frame: bytes, msg_type: MsgType, fields: tuple) -> None:
    msg = wire.decode_client(frame)
    assert (msg.type, msg.fields) == (msg_type, fields), desc


def test_release_more_flag() -> None:
    assert wire.decode_client(wire.encode_release(1, 1, 1, True)).flags & wire.FLAG_MORE
    assert not wire.decode_client(wire.encode_release(1, 1, 1, False)).flags & wire.FLAG_MORE


def test_grant_no_renew_flag() -> None:
    assert wire.decode_server(wire.encode_grant(1, 1, 1, 1, no_renew=True)).flags & wire.FLAG_NO_RENEW
    assert not wire.decode_server(wire.encode_grant(1, 1, 1, 1)).flags & wire.FLAG_NO_RENEW


def test_server_round_trip() -> None:
    grant = wire.decode_server(wire.encode_grant(5, 2**40, 20_000, 10_000))
    assert grant.fields == (2**40, 20_000, 10_000) and grant.seq == 5
    err = wire.decode_server(wire.encode_error(6, ErrorCode.STALE_LEASE, "gone", ref=3))
    assert err.fields == (ErrorCode.STALE_LEASE, 3) and err.text == "gone"
    pong = wire.decode_server(wire.encode_pong(7, 11, 0xABCD, wire.ClientState.HOLDING, 99))
    assert pong.fields == (11, 0xABCD, 2, 99)
    revoke = wire.decode_server(wire.encode_revoke(0, 2**40 + 3, 1000))
    assert (revoke.type, revoke.fields) == (MsgType.REVOKE, (2**40 + 3, 1000, 0))
    budget = wire.decode_server(wire.encode_budget(8, 10_000, 1000))
    assert (budget.type, budget.fields, budget.seq) == (MsgType.BUDGET, (10_000, 1000), 8)


@pytest.mark.parametrize("frame", [wire.encode_revoke(1, 1, 1), wire.encode_budget(1, 1, 1)])
def test_server_frames_sent_by_a_client_are_refused(frame: bytes) -> None:
    with pytest.raises(WireError) as err:
        wire.decode_client(frame)
    assert err.value.code == ErrorCode.UNKNOWN_TYPE


def test_report_of_the_wrong_size_is_malformed() -> None:
    frame = wire.encode_report(1, 1, 1)
    short = frame[:12] + struct.pack("<I", 8) + frame[16:24]
    with pytest.raises(WireError) as err:
        wire.decode_client(short)
    assert err.value.code == ErrorCode.MALFORMED


def test_error_text_is_bounded() -> None:
    frame = wire.encode_error(0, ErrorCode.INTERNAL, "x" * 10_000)
    assert len(frame) == wire.MAX_FRAME


def _bad_version() -> bytes:
    frame = bytearray(wire.encode_ping(9, 0))
    frame[4] = 2
    return bytes(frame)


@pytest.mark.parametrize(
    ("desc", "frame", "code"),
    [
        ("empty", b"", ErrorCode.MALFORMED),
        ("short header", b"VCTS\x01", ErrorCode.MALFORMED),
        ("bad magic", b"XXXX" + wire.encode_ping(1, 0)[4:], ErrorCode.MALFORMED),
        ("wrong version", _bad_version(), ErrorCode.BAD_VERSION),
        ("body_len lies", wire.encode_ping(1, 0) + b"\0", ErrorCode.MALFORMED),
        ("truncated body", wire.encode_request(1, 1, 1)[:-1], ErrorCode.MALFORMED),
        ("server type from client", wire.encode_grant(1, 1, 1, 1), ErrorCode.UNKNOWN_TYPE),
        ("unknown type", wire.HEADER.pack(b"VCTS", 1, 99, 0, 1, 0), ErrorCode.UNKNOWN_TYPE),
        (
            "valid header, wrong size for type",
            wire.HEADER.pack(b"VCTS", 1, MsgType.PING, 0, 1, 4) + b"\0" * 4,
            ErrorCode.MALFORMED,
        ),
    ],
)
def test_malformed_client_frames(desc: str, frame: bytes, code: ErrorCode) -> None:
    with pytest.raises(WireError) as info:
        wire.decode_client(frame)
    assert info.value.code == code, desc


def test_bad_version_reports_our_version_and_seq() -> None:
    with pytest.raises(WireError) as info:
        wire.decode_client(_bad_version())
    assert (info.value.ref, info.value.seq) == (wire.VERSION, 9)


@given(st.binary(max_size=64))
def test_decode_never_raises_anything_else(frame: bytes) -> None:
    for decode in (wire.decode_client, wire.decode_server):
        with contextlib.suppress(WireError):
            decode(frame)


@given(st.sampled_from(list(MsgType)), st.integers(0, 0xFFFF), st.binary(max_size=40))
def test_decode_structured_garbage(msg_type: MsgType, flags: int, body: bytes) -> None:
    frame = wire.HEADER.pack(b"VCTS", 1, msg_type, flags, 1, len(body)) + body
    try:
        msg = wire.decode_client(frame)
    except WireError:
        return
    assert msg.type in (MsgType.REQUEST, MsgType.RELEASE, MsgType.RENEW, MsgType.PING, MsgType.REPORT)
