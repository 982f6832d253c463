"""What the webhook client's HTTP/1.1 and HTTP/2 halves share: the answer, the failures a
delivery can meet (each says whether the request may have been processed), and limits.

:mod:`engine.handlers.http_client` re-exports all of it; import from there.
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = [
    "RECEIVE_BYTES",
    "RESPONSE_HEAD_BYTES_MAX",
    "ConnectFailed",
    "ExchangeFailed",
    "ResolveFailed",
    "StreamRefused",
    "WebhookResponse",
    "describe",
]

RESPONSE_HEAD_BYTES_MAX: Final = 64 * 1024
"""Longest status line plus headers accepted."""
RECEIVE_BYTES: Final = 64 * 1024


class WebhookResponse(msgspec.Struct, frozen=True, kw_only=True):
    """An answer: status, headers (names lower-case; the last of repeated ones) and the
    first ``body_max_bytes`` of the body."""

    status: int
    headers: dict[str, str]
    body: bytes


class ResolveFailed(Exception):
    """The host name did not resolve (``getaddrinfo`` failed or named no address)."""


class ConnectFailed(Exception):
    """No connection (TCP or TLS) could be made to this address; nothing was sent."""


class ExchangeFailed(Exception):
    """The connection failed after it was made: the request may have been processed."""


class StreamRefused(Exception):
    """The request was provably not processed: its HTTP/2 stream id is above the last one of
    the receiver's GOAWAY, or the receiver reset it with ``REFUSED_STREAM`` before
    answering, or sending it failed on a reused HTTP/1.1 connection. Safe to send again, on
    another connection."""


def describe(error: BaseException) -> str:
    """The error and its root cause (trio wraps the socket or TLS error that explains it)."""
    root: BaseException = error
    for _ in range(8):
        inner = root.__cause__ or root.__context__
        if inner is None:
            break
        root = inner
    text = type(error).__name__
    if root is not error:
        text += f": {type(root).__name__}"
    detail = str(root) or str(error)
    return f"{text}: {detail}" if detail else text
