"""Which task-type settings are secrets, and how the API shows them: write-only.

A webhook's signing ``secret`` (and a ``previous_secret`` being rotated out), the values of
webhook headers whose names look like credentials (``Authorization``, ``X-Api-Key`` ...),
and every value of a shell task type's ``env`` are secrets. The API stores them as given and
never returns them: each is shown as a fingerprint, ``***sha256:`` and the first 8 hex
digits of its SHA-256, which says whether it is set and whether it changed, and nothing an
attacker could use (a fingerprint of a 24-byte random secret cannot be reversed; one of a
weak password could be guessed offline, which is why only admins read task types at all).

A client may send a fingerprint back unchanged (read, edit a timeout, write): it stands for
the secret stored under it (:func:`restore`). A fingerprint that matches nothing stored is
refused, so a stale read cannot blank a secret. ``docs/security.md`` says how secrets are
stored and what an operator must protect.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any, Final

from engine.errors import InvalidField

FINGERPRINT_PREFIX: Final = "***sha256:"
_SENSITIVE_WORDS: Final = ("secret", "password", "token", "auth", "key", "cookie", "signature")


def sensitive_name(name: str) -> bool:
    """Whether a header or variable called ``name`` looks like it holds a credential."""
    lowered = name.lower()
    return any(word in lowered for word in _SENSITIVE_WORDS)


def fingerprint(value: str) -> str:
    """How a secret ``value`` is shown: ``***sha256:`` and 8 hex digits of its SHA-256."""
    return FINGERPRINT_PREFIX + hashlib.sha256(value.encode()).hexdigest()[:8]


def _secret_slots(kind: str, settings: Mapping[str, Any]) -> Iterator[tuple[str, str | None]]:
    """``(setting, key)`` of every secret string in ``settings``: a top-level setting
    (``key`` None) or an entry of a mapping setting (``headers``, ``env``)."""
    if kind == "webhook":
        for name in ("secret", "previous_secret"):
            if isinstance(settings.get(name), str):
                yield name, None
        headers = settings.get("headers")
        if isinstance(headers, Mapping):
            for header, value in headers.items():
                if isinstance(value, str) and sensitive_name(str(header)):
                    yield "headers", str(header)
    elif kind == "shell":
        env = settings.get("env")
        if isinstance(env, Mapping):
            for variable, value in env.items():
                if isinstance(value, str):
                    yield "env", str(variable)


def _get(settings: Mapping[str, Any], slot: tuple[str, str | None]) -> str:
    name, key = slot
    value: str = settings[name] if key is None else settings[name][key]
    return value


def _set(settings: dict[str, Any], slot: tuple[str, str | None], value: str) -> None:
    name, key = slot
    if key is None:
        settings[name] = value
    else:
        settings[name] = {**settings[name], key: value}


def redact(kind: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every secret replaced by its fingerprint."""
    shown = dict(settings)
    for slot in list(_secret_slots(kind, settings)):
        _set(shown, slot, fingerprint(_get(settings, slot)))
    return shown


def holds_fingerprints(kind: str, settings: Mapping[str, Any]) -> bool:
    """Whether any secret of ``settings`` is a fingerprint rather than a secret."""
    return any(
        _get(settings, slot).startswith(FINGERPRINT_PREFIX)
        for slot in _secret_slots(kind, settings)
    )


def restore(
    kind: str, incoming: Mapping[str, Any], stored: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``incoming`` with each fingerprint replaced by the secret ``stored`` under the same
    setting (or, for a rotation's ``previous_secret``, under ``secret``); ``InvalidField``
    for a fingerprint that matches no stored secret."""
    restored = dict(incoming)
    known: dict[str, str] = {}
    if stored is not None:
        for slot in _secret_slots(kind, stored):
            secret = _get(stored, slot)
            known[fingerprint(secret)] = secret
    for slot in list(_secret_slots(kind, incoming)):
        value = _get(incoming, slot)
        if not value.startswith(FINGERPRINT_PREFIX):
            continue
        if value not in known:
            name, key = slot
            where = name if key is None else f"{name}[{key!r}]"
            raise InvalidField(
                f"task type settings: {where} is a fingerprint ({value}) of no secret stored "
                "here; send the secret itself (fingerprints stand only for the secrets they "
                "were read from)"
            )
        _set(restored, slot, known[value])
    return restored
