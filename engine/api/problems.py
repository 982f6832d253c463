"""Errors as RFC 9457 problem details (``application/problem+json``).

Every error the API answers is a :class:`Problem`: an HTTP status, a stable ``type`` a client
may branch on, a short ``title`` and a ``detail`` a person can act on. :func:`from_error`
maps the engine's own exceptions (:mod:`engine.errors`) to problems, so a route raises
whatever the ledger raised and the client gets a 4xx -- never a 500 with a traceback. An
exception that is not a :class:`~engine.errors.CarillonError` is a bug: the server logs it
with its traceback and answers a bare 500 problem that reveals nothing.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from engine.errors import (
    AlreadyExists,
    CarillonError,
    InUse,
    LedgerUnavailable,
    NotFound,
    QuotaExceeded,
    ValidationError,
    VersionConflict,
)

PROBLEM_CONTENT_TYPE: Final = "application/problem+json"
TYPE_PREFIX: Final = "urn:carillon:problem:"
"""Problem types are URNs: stable identifiers, not pages to fetch."""
RETRY_AFTER_UNAVAILABLE_S: Final = 1


class ProblemBody(msgspec.Struct, frozen=True, omit_defaults=True):
    """The JSON body of an error response."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[str] | None = None
    """Every problem found, when validation found several (batches)."""


class Problem(Exception):
    """An error response: raise it from a route, the app encodes it."""

    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        errors: list[str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.headers = headers or {}
        self.errors = errors

    def body(self, instance: str | None = None) -> ProblemBody:
        return ProblemBody(
            type=TYPE_PREFIX + self.slug,
            title=self.title,
            status=self.status,
            detail=self.detail,
            instance=instance,
            errors=self.errors,
        )


def bad_request(detail: str) -> Problem:
    return Problem(400, "bad-request", "The request is malformed", detail)


def invalid(detail: str, errors: list[str] | None = None) -> Problem:
    return Problem(422, "invalid-field", "A field is invalid", detail, errors=errors)


def not_found(detail: str) -> Problem:
    return Problem(404, "not-found", "Not found", detail)


def unauthorized(detail: str) -> Problem:
    return Problem(
        401,
        "unauthorized",
        "Authentication required",
        detail,
        headers={"WWW-Authenticate": 'Bearer realm="carillon"'},
    )


def forbidden(detail: str) -> Problem:
    return Problem(403, "forbidden", "Not allowed", detail)


def too_large(limit_bytes: int, advice: str = "") -> Problem:
    """413 naming the route's limit (``advice``: how to stay under it)."""
    detail = f"the body exceeds the limit of {limit_bytes} bytes for this route"
    return Problem(
        413,
        "payload-too-large",
        "The request body is too large",
        f"{detail}; {advice}" if advice else detail,
    )


def rate_limited(retry_after_s: int, limit: str = "this token's request rate") -> Problem:
    """429: ``limit`` says whose rate ran out and what it is (a token's, or a client
    address's before any valid token)."""
    return Problem(
        429,
        "rate-limited",
        "Too many requests",
        f"{limit} is exhausted; retry in {retry_after_s} s",
        headers={"Retry-After": str(retry_after_s)},
    )


def unavailable(detail: str) -> Problem:
    return Problem(
        503,
        "unavailable",
        "Service unavailable",
        detail,
        headers={"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)},
    )


INTERNAL: Final = Problem(
    500, "internal", "Internal error", "the server failed; the error is in its log"
)


def from_error(exc: CarillonError) -> Problem:
    """The problem a deliberate engine error answers."""
    detail = str(exc)
    if isinstance(exc, ValidationError):
        return invalid(detail)
    if isinstance(exc, NotFound):
        return not_found(detail)
    if isinstance(exc, VersionConflict):
        return Problem(412, "version-conflict", "The version does not match", detail)
    if isinstance(exc, AlreadyExists):
        return Problem(409, "already-exists", "It exists already", detail)
    if isinstance(exc, InUse):
        return Problem(409, "in-use", "It is still in use", detail)
    if isinstance(exc, QuotaExceeded):
        return Problem(409, "quota-exceeded", "The tenant's quota is exhausted", detail)
    if isinstance(exc, LedgerUnavailable):
        return unavailable("the database is unreachable; retry shortly")
    return Problem(409, "conflict", "The request conflicts with the current state", detail)


def decode_error(exc: msgspec.ValidationError | msgspec.DecodeError) -> Problem:
    """A body that is not JSON (400) or does not fit the schema (422)."""
    if isinstance(exc, msgspec.ValidationError):
        return invalid(f"the body does not fit the schema: {exc}")
    return bad_request(f"the body is not valid JSON: {exc}")


def encode_problem(problem: Problem, instance: str | None = None) -> bytes:
    return msgspec.json.encode(problem.body(instance))


def extra_headers(problem: Problem) -> dict[str, Any]:
    return dict(problem.headers)
