"""What the console's HTTP tests share: a signed-in browser-like client, and form posts.

:class:`Console` wraps the API tests' :class:`~tests.api.support.Api` (the app on a ledger,
with an admin token and one token per tenant) and opens one ``httpx`` client per session,
each with its own cookie jar, as separate browsers would have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from engine.api.console.session import SESSION_COOKIE
from engine.api.console.web import CSP
from tests.api.support import Api

CSRF_FIELD: Final = re.compile(r'name="csrf" value="([^"]+)"')
HEADERS: Final = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
}


def csrf_of(page: httpx.Response) -> str:
    found = CSRF_FIELD.search(page.text)
    assert found is not None, page.text
    return found.group(1)


def assert_secured(response: httpx.Response) -> None:
    """The console's security headers are all there."""
    for name, value in HEADERS.items():
        assert response.headers.get(name) == value, (name, response.headers)


@dataclass
class Session:
    """One browser signed in (or not) to the console."""

    client: httpx.AsyncClient
    csrf: str = ""

    async def get(self, path: str, **params: Any) -> httpx.Response:
        response = await self.client.get(path, params=params or None)
        found = CSRF_FIELD.search(response.text)
        if found is not None and SESSION_COOKIE in self.client.cookies:
            self.csrf = found.group(1)
        return response

    async def post(self, path: str, data: dict[str, Any], *, csrf: bool = True) -> httpx.Response:
        """Submit a form as the page would (with this session's CSRF token unless told not)."""
        form = {"csrf": self.csrf, **data} if csrf else data
        return await self.client.post(path, data=form)


@dataclass
class Console:
    api: Api
    sessions: list[Session] = field(default_factory=list)

    def browser(
        self, base_url: str = "https://console.test", address: str = "127.0.0.1"
    ) -> Session:
        """A fresh browser on ``base_url`` (https by default: the console's cookies are
        Secure), connecting from ``address``: no cookies."""
        transport = httpx.ASGITransport(app=self.api.app, client=(address, 50_000))
        client = httpx.AsyncClient(transport=transport, base_url=base_url)
        session = Session(client)
        self.sessions.append(session)
        return session

    async def signed_in(self, scope: str = "admin") -> Session:
        """A browser signed in with the token of ``scope`` (``admin``, ``tenant:acme`` ...)."""
        session = self.browser()
        await sign_in(session, self.api.tokens[scope][1])
        assert SESSION_COOKIE in session.client.cookies
        await session.get("/ui/overview")  # picks up the session's CSRF token
        return session

    async def close(self) -> None:
        for session in self.sessions:
            await session.client.aclose()


async def sign_in(session: Session, token: str, next_path: str = "/ui/overview") -> httpx.Response:
    form = await session.client.get("/ui/login")
    return await session.client.post(
        "/ui/login", data={"csrf": csrf_of(form), "token": token, "next": next_path}
    )
