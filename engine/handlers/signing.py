"""Standard Webhooks signatures (https://www.standardwebhooks.com, spec version 1.0.0).

A signed request carries three headers:

* ``webhook-id`` — the message id, the same for every attempt of the execution (the spec
  asks for it to stay unchanged when a failed webhook is resent, so receivers may use it as
  an idempotency key). It is the execution id with ``%`` and ``.`` percent-encoded, because
  the signed content is ``id.timestamp.body`` and the spec requires ids without full stops
  (execution ids may contain them: ``report.daily:2026-03-08T07:00:00.5Z``).
* ``webhook-timestamp`` — integer Unix seconds of this attempt, from the node's injected
  wall clock; receivers reject stale ones, which defeats replays.
* ``webhook-signature`` — ``v1,`` + base64(HMAC-SHA256(key, ``f"{id}.{timestamp}.{body}"``)).

A secret is rotated with an overlap (``previous_secret`` until ``previous_secret_until`` in
the webhook settings): meanwhile every request is signed with both, as the spec provides for
("webhook-signature" holds a space-separated list), so receivers can switch at their pace.

Secrets are written as the spec serialises them: ``whsec_`` + base64 of 24-64 random bytes
(the prefix may be left out, as the reference libraries allow); the key is the decoded bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Final

from engine.errors import InvalidField

SECRET_PREFIX: Final = "whsec_"
SECRET_BYTES_MIN: Final = 24
SECRET_BYTES_MAX: Final = 64


def parse_secret(text: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret; :class:`InvalidField` if malformed.

    The message never echoes the secret.
    """
    encoded = text.strip().removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidField(
            "webhook handler: secret must be 'whsec_' followed by base64, as Standard Webhooks "
            'serialises secrets (make one with: python -c "import base64, os; '
            "print('whsec_' + base64.b64encode(os.urandom(32)).decode())\")"
        ) from None
    if not SECRET_BYTES_MIN <= len(key) <= SECRET_BYTES_MAX:
        raise InvalidField(
            f"webhook handler: the secret decodes to {len(key)} bytes; Standard Webhooks asks "
            f"for {SECRET_BYTES_MIN}-{SECRET_BYTES_MAX} random bytes"
        )
    return key


def message_id(execution_id: str) -> str:
    """The ``webhook-id`` of an execution: its id without full stops, reversibly."""
    return execution_id.replace("%", "%25").replace(".", "%2E")


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for one request."""
    content = b"%s.%d.%s" % (msg_id.encode(), timestamp, body)
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_headers(
    key: bytes, execution_id: str, timestamp: int, body: bytes, *, retiring: bytes | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers for a request with ``body``.

    With a ``retiring`` key (a secret being rotated out, within its overlap period) the
    signature header carries both signatures, space-separated as the spec allows, so a
    receiver that still knows only the old secret, or already only the new one, verifies it.
    """
    msg_id = message_id(execution_id)
    signature = sign(key, msg_id, timestamp, body)
    if retiring is not None:
        signature += " " + sign(retiring, msg_id, timestamp, body)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature,
    }
