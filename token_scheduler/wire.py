"""Binary frames of the tenant protocol (layout in PROTOCOL.md).

Every frame is a 16-byte little-endian header followed by a fixed-size body
(ERROR alone carries a bounded text tail). Decoding checks everything before
trusting anything, so a malformed frame becomes a WireError, never a crash.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from .errors import ErrorCode

MAGIC = b"VCTS"
VERSION = 1
HEADER = struct.Struct("<4sBBHII")  # magic, version, type, flags, seq, body_len
HEADER_SIZE = HEADER.size  # 16
MAX_ERROR_TEXT = 200
MAX_FRAME = HEADER_SIZE + 16 + MAX_ERROR_TEXT

FLAG_MORE = 0x0001  # RELEASE: the client has more work and re-requests at once
FLAG_NO_RENEW = 0x0002  # GRANT: a RENEW of this lease would be denied; the client need not ask


class MsgType(IntEnum):
    REQUEST = 1
    GRANT = 2
    RELEASE = 3
    RENEW = 4
    ERROR = 5
    PING = 6
    PONG = 7
    REVOKE = 8
    BUDGET = 9
    REPORT = 10


class ClientState(IntEnum):
    """State of a client as the scheduler sees it (PONG.state)."""

    IDLE = 0
    WAITING = 1
    HOLDING = 2


REQUEST_BODY = struct.Struct("<IIQ")  # pid, reserved, predicted_burst_us
GRANT_BODY = struct.Struct("<QII")  # lease_id, quantum_us, grace_us
RELEASE_BODY = struct.Struct("<QQ")  # lease_id, held_ns
RENEW_BODY = struct.Struct("<QQ")  # lease_id, held_ns
ERROR_BODY = struct.Struct("<HHIQ")  # code, text_len, reserved, ref  (+ text)
PING_BODY = struct.Struct("<Q")  # nonce
PONG_BODY = struct.Struct("<QIBxxxQ")  # nonce, epoch, state, 3 pad, lease_id
REVOKE_BODY = struct.Struct("<QII")  # lease_id, budget_us, reserved
BUDGET_BODY = struct.Struct("<II")  # budget_us, idle_us
REPORT_BODY = struct.Struct("<IIQ")  # budget_hits, reserved, budget_wait_ns

# Client-to-server types and their exact bodies. Keyed by the plain int so that
# decoding (on every handoff) looks the member up instead of constructing it.
_CLIENT_BODIES: dict[int, tuple[MsgType, struct.Struct]] = {
    int(t): (t, body)
    for t, body in ((MsgType.REQUEST, REQUEST_BODY), (MsgType.RELEASE, RELEASE_BODY),
                    (MsgType.RENEW, RENEW_BODY), (MsgType.PING, PING_BODY),
                    (MsgType.REPORT, REPORT_BODY))
}
# Server-to-client types of fixed size (ERROR has a text tail and is decoded apart).
_SERVER_BODIES: dict[int, tuple[MsgType, struct.Struct]] = {
    int(t): (t, body)
    for t, body in ((MsgType.GRANT, GRANT_BODY), (MsgType.PONG, PONG_BODY),
                    (MsgType.REVOKE, REVOKE_BODY), (MsgType.BUDGET, BUDGET_BODY))
}


class WireError(Exception):
    """A frame that cannot be accepted; `seq` is echoed in the ERROR reply."""

    def __init__(self, code: ErrorCode, message: str, seq: int = 0, ref: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.seq = seq
        self.ref = ref


@dataclass(frozen=True, slots=True)
class Message:
    """A decoded frame; `fields` is the body tuple in PROTOCOL.md order."""

    type: MsgType
    flags: int
    seq: int
    fields: tuple[int, ...]
    text: str = ""


def _header(msg_type: MsgType, flags: int, seq: int, body_len: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, msg_type, flags, seq & 0xFFFFFFFF, body_len)


def _decode_header(frame: bytes) -> tuple[int, int, int, int]:
    if len(frame) < HEADER_SIZE:
        raise WireError(ErrorCode.MALFORMED, f"frame of {len(frame)} bytes is shorter than header")
    magic, version, msg_type, flags, seq, body_len = HEADER.unpack_from(frame)
    if magic != MAGIC:
        raise WireError(ErrorCode.MALFORMED, "bad magic")
    if version != VERSION:
        raise WireError(
            ErrorCode.BAD_VERSION, f"version {version} not supported", seq=seq, ref=VERSION
        )
    if body_len != len(frame) - HEADER_SIZE:
        raise WireError(
            ErrorCode.MALFORMED,
            f"body_len {body_len} but {len(frame) - HEADER_SIZE} body bytes",
            seq=seq,
        )
    return msg_type, flags, seq, body_len


def decode_client(frame: bytes) -> Message:
    """Decode a client-to-server frame (REQUEST, RELEASE, RENEW, PING, REPORT)."""
    msg_type, flags, seq, body_len = _decode_header(frame)
    known = _CLIENT_BODIES.get(msg_type)
    if known is None:
        raise WireError(ErrorCode.UNKNOWN_TYPE, f"type {msg_type} not accepted", seq=seq)
    member, body = known
    if body_len != body.size:
        raise WireError(
            ErrorCode.MALFORMED,
            f"{member.name} body must be {body.size} bytes, got {body_len}",
            seq=seq,
        )
    return Message(member, flags, seq, body.unpack_from(frame, HEADER_SIZE))


def decode_server(frame: bytes) -> Message:
    """Decode a server-to-client frame (GRANT, ERROR, PONG, REVOKE, BUDGET); used by clients."""
    msg_type, flags, seq, body_len = _decode_header(frame)
    known = _SERVER_BODIES.get(msg_type)
    if known is not None and body_len == known[1].size:
        return Message(known[0], flags, seq, known[1].unpack_from(frame, HEADER_SIZE))
    if msg_type == MsgType.ERROR and body_len >= ERROR_BODY.size:
        code, text_len, _reserved, ref = ERROR_BODY.unpack_from(frame, HEADER_SIZE)
        if body_len == ERROR_BODY.size + text_len:
            start = HEADER_SIZE + ERROR_BODY.size
            text = frame[start : start + text_len].decode("utf-8", "replace")
            return Message(MsgType.ERROR, flags, seq, (code, ref), text)
    raise WireError(ErrorCode.MALFORMED, f"bad server frame type {msg_type} len {body_len}", seq)


# --- encoders -------------------------------------------------------------


def encode_request(seq: int, pid: int, predicted_burst_us: int) -> bytes:
    return _header(MsgType.REQUEST, 0, seq, REQUEST_BODY.size) + REQUEST_BODY.pack(
        pid & 0xFFFFFFFF, 0, predicted_burst_us
    )


def encode_grant(seq: int, lease_id: int, quantum_us: int, grace_us: int, no_renew: bool = False) -> bytes:
    return _header(MsgType.GRANT, FLAG_NO_RENEW if no_renew else 0, seq, GRANT_BODY.size) + GRANT_BODY.pack(
        lease_id, min(quantum_us, 0xFFFFFFFF), min(grace_us, 0xFFFFFFFF)
    )


def encode_release(seq: int, lease_id: int, held_ns: int, more: bool) -> bytes:
    flags = FLAG_MORE if more else 0
    return _header(MsgType.RELEASE, flags, seq, RELEASE_BODY.size) + RELEASE_BODY.pack(
        lease_id, held_ns
    )


def encode_renew(seq: int, lease_id: int, held_ns: int) -> bytes:
    return _header(MsgType.RENEW, 0, seq, RENEW_BODY.size) + RENEW_BODY.pack(lease_id, held_ns)


def encode_error(seq: int, code: ErrorCode, text: str, ref: int = 0) -> bytes:
    raw = text.encode("utf-8")[:MAX_ERROR_TEXT]
    body = ERROR_BODY.pack(code, len(raw), 0, ref & 0xFFFFFFFFFFFFFFFF) + raw
    return _header(MsgType.ERROR, 0, seq, len(body)) + body


def encode_ping(seq: int, nonce: int) -> bytes:
    return _header(MsgType.PING, 0, seq, PING_BODY.size) + PING_BODY.pack(nonce)


def encode_revoke(seq: int, lease_id: int, budget_us: int) -> bytes:
    return _header(MsgType.REVOKE, 0, seq, REVOKE_BODY.size) + REVOKE_BODY.pack(
        lease_id, min(budget_us, 0xFFFFFFFF), 0
    )


def encode_budget(seq: int, budget_us: int, idle_us: int) -> bytes:
    return _header(MsgType.BUDGET, 0, seq, BUDGET_BODY.size) + BUDGET_BODY.pack(
        min(budget_us, 0xFFFFFFFF), min(idle_us, 0xFFFFFFFF)
    )


def encode_report(seq: int, budget_hits: int, budget_wait_ns: int) -> bytes:
    return _header(MsgType.REPORT, 0, seq, REPORT_BODY.size) + REPORT_BODY.pack(
        budget_hits & 0xFFFFFFFF, 0, budget_wait_ns & 0xFFFFFFFFFFFFFFFF
    )


def encode_pong(seq: int, nonce: int, epoch: int, state: ClientState, lease_id: int) -> bytes:
    return _header(MsgType.PONG, 0, seq, PONG_BODY.size) + PONG_BODY.pack(
        nonce, epoch, state, lease_id
    )
