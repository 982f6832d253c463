"""Task-type secrets are write-only: what the API shows of them, and what it takes back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.redaction import (
    FINGERPRINT_PREFIX,
    fingerprint,
    holds_fingerprints,
    redact,
    restore,
)
from engine.errors import InvalidField

SECRET = "whsec_c2VjcmV0LWtleS1tYXRlcmlhbC1vZi0zMi1ieXRlcyE="
HOOK = {
    "url": "https://example.com/h",
    "secret": SECRET,
    "headers": {"Authorization": "Bearer sk_live_1", "X-Team": "billing"},
}
SHELL = {"argv": ["/usr/bin/backup"], "env": {"MODE": "full", "PGPASSWORD": "hunter2"}}


def test_webhook_secrets_and_credential_headers_are_shown_as_fingerprints() -> None:
    shown = redact("webhook", HOOK)
    assert shown == {
        "url": "https://example.com/h",
        "secret": fingerprint(SECRET),
        "headers": {"Authorization": fingerprint("Bearer sk_live_1"), "X-Team": "billing"},
    }
    assert shown["secret"].startswith(FINGERPRINT_PREFIX)
    assert len(shown["secret"]) == len(FINGERPRINT_PREFIX) + 8
    assert HOOK["secret"] == SECRET  # the stored settings are left alone


def test_every_shell_environment_value_is_a_secret() -> None:
    assert redact("shell", SHELL)["env"] == {
        "MODE": fingerprint("full"),
        "PGPASSWORD": fingerprint("hunter2"),
    }
    assert redact("noop", {"delay_s": 1}) == {"delay_s": 1}


def test_fingerprints_sent_back_stand_for_the_secrets_they_were_read_from() -> None:
    shown = redact("webhook", HOOK)
    edited = {**shown, "url": "https://example.com/v2"}
    assert holds_fingerprints("webhook", edited)
    assert restore("webhook", edited, HOOK) == {**HOOK, "url": "https://example.com/v2"}
    assert not holds_fingerprints("webhook", HOOK)
    # A rotation by hand: the current secret's fingerprint as the one being rotated out.
    rotated = {**shown, "secret": "whsec_new", "previous_secret": shown["secret"]}
    assert restore("webhook", rotated, HOOK)["previous_secret"] == SECRET


@pytest.mark.parametrize("stored", [None, {**HOOK, "secret": "whsec_other"}])
def test_a_fingerprint_of_no_stored_secret_is_refused(stored: dict[str, object] | None) -> None:
    with pytest.raises(InvalidField, match=r"secret is a fingerprint .* of no secret stored"):
        restore("webhook", redact("webhook", HOOK), stored)


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=20), max_size=5))
def test_redacting_shell_settings_then_restoring_them_gives_them_back(env: dict[str, str]) -> None:
    settings = {"argv": ["x"], "env": env}
    shown = redact("shell", settings)
    assert all(value.startswith(FINGERPRINT_PREFIX) for value in shown["env"].values())
    assert restore("shell", shown, settings) == settings
