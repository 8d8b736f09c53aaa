"""Error codes shared by the policy, the wire format and the daemon."""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Codes carried in ERROR frames (see PROTOCOL.md, "Error codes")."""

    MALFORMED = 1  # bad magic, short frame, body length wrong for the type, extra frames
    BAD_VERSION = 2  # header version is not ours; ref = the version we speak
    UNKNOWN_TYPE = 3  # message type not known, or a server-to-client type
    BAD_STATE = 4  # out of order, e.g. REQUEST while holding the token; ref = held lease
    STALE_LEASE = 5  # lease id unknown, not this client's, or from before a restart
    LEASE_EXPIRED = 6  # RENEW of a lease the scheduler already reclaimed; finish and RELEASE
    RENEW_DENIED = 7  # someone else is waiting (or at limit): finish and RELEASE
    TOO_MANY_CLIENTS = 8  # the tenant has too many processes waiting at once
    TENANT_REMOVED = 9  # the tenant was removed by the admin
    INTERNAL = 10  # unexpected error in the daemon; the request was dropped


class PolicyError(Exception):
    """A client asked for something the policy refuses; becomes an ERROR frame."""

    def __init__(self, code: ErrorCode, message: str, ref: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.ref = ref
