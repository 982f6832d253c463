"""Which task-type settings are secrets, and how the API shows them: write-only.

A webhook's signing ``secret`` (and a ``previous_secret`` being rotated out), the values of
webhook and rabbitmq headers whose names look like credentials (``Authorization``,
``X-Api-Key`` ...), every value of a shell task type's ``env``, and the credentials of a
message broker's ``url`` (``redis://user:password@host``, ``nats://token@host``,
``amqp://user:password@host``: the whole ``user:password`` part before the ``@``) are
secrets. The API stores them as given and
never returns them: each is shown as a fingerprint, ``***sha256:`` and the first 8 hex
digits of its SHA-256, which says whether it is set and whether it changed, and nothing an
attacker could use (a fingerprint of a 24-byte random secret cannot be reversed; one of a
weak password could be guessed offline, which is why only admins read task types at all).

A client may send a fingerprint back unchanged (read, edit a timeout, write): it stands for
the secret stored under it (:func:`restore`). A broker URL is shown with its credentials
replaced by their fingerprint (``redis://***sha256:1a2b3c4d@host:6379/0``), so the host
stays readable. A fingerprint that matches nothing stored is
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
BROKER_KINDS: Final = frozenset({"redis", "nats", "rabbitmq"})
"""Kinds whose ``url`` may carry credentials."""
_USERINFO: Final = "\0userinfo"
"""The slot key of a URL's credentials (no header or variable can be named so)."""


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
    if kind in ("webhook", "rabbitmq"):
        headers = settings.get("headers")
        if isinstance(headers, Mapping):
            for header, value in headers.items():
                if isinstance(value, str) and sensitive_name(str(header)):
                    yield "headers", str(header)
    if kind == "shell":
        env = settings.get("env")
        if isinstance(env, Mapping):
            for variable, value in env.items():
                if isinstance(value, str):
                    yield "env", str(variable)
    if kind in BROKER_KINDS:
        url = settings.get("url")
        if isinstance(url, str) and _split_userinfo(url) is not None:
            yield "url", _USERINFO


def _split_userinfo(url: str) -> tuple[str, str, str] | None:
    """``(scheme://, userinfo, @rest)`` of a URL with credentials, else ``None``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0]
    authority_end = min(ends, default=len(rest))
    at = rest.rfind("@", 0, authority_end)
    if at <= 0:
        return None
    return scheme + sep, rest[:at], rest[at:]


def _get(settings: Mapping[str, Any], slot: tuple[str, str | None]) -> str:
    name, key = slot
    if key == _USERINFO:
        parts = _split_userinfo(settings[name])
        assert parts is not None  # the slot exists only for a URL with credentials
        return parts[1]
    value: str = settings[name] if key is None else settings[name][key]
    return value


def _set(settings: dict[str, Any], slot: tuple[str, str | None], value: str) -> None:
    name, key = slot
    if key == _USERINFO:
        parts = _split_userinfo(settings[name])
        assert parts is not None
        settings[name] = parts[0] + value + parts[2]
    elif key is None:
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
            where = (
                name
                if key is None
                else f"the credentials of {name}"
                if key == _USERINFO
                else f"{name}[{key!r}]"
            )
            raise InvalidField(
                f"task type settings: {where} is a fingerprint ({value}) of no secret stored "
                "here; send the secret itself (fingerprints stand only for the secrets they "
                "were read from)"
            )
        _set(restored, slot, known[value])
    return restored
