"""Signing in and out, the server-side session behind the cookie, the cookie's attributes,
trusted proxies, CSRF, and the headers every response carries."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from ipaddress import ip_network
from typing import Any

import msgspec
import pytest

from engine.api.auth import SESSION_CACHE_TTL_S, TOKEN_CACHE_TTL_S
from engine.api.console.session import LOGIN_COOKIE, SESSION_COOKIE, csrf_token
from engine.api.console.web import ConsoleSettings
from engine.config import (
    CONSOLE_SESSION_IDLE_S_DEFAULT,
    CONSOLE_SESSION_LIFETIME_S_DEFAULT,
    NodeConfig,
)
from engine.errors import LedgerUnavailable, NotFound
from engine.ledger.base import Ledger
from engine.ledger.params import TokensRevoke
from engine.node import Node
from engine.testing import FaultyLedger, ManualClock
from tests.api.support import START, memory_ledger, prepare_ledger, serve
from tests.console.support import Console, assert_secured, csrf_of, sign_in


@asynccontextmanager
async def console_with(
    settings: ConsoleSettings, wrap: Callable[[Ledger], Any] = lambda ledger: ledger, **serving: Any
) -> AsyncIterator[Console]:
    """The console on a fresh memory ledger (``wrap``ped), served with ``settings``."""
    clock = ManualClock(START)
    ledger = wrap(memory_ledger(clock))
    await prepare_ledger(ledger)
    async with serve(ledger, clock, "memory", console=settings, **serving) as api:
        console = Console(api)
        try:
            yield console
        finally:
            await console.close()


def session_cookie(response: Any) -> str:
    """The ``Set-Cookie`` header that sets the session cookie."""
    return next(c for c in response.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE))


PAGES = (
    "/ui/overview",
    "/ui/forecast",
    "/ui/schedules",
    "/ui/schedules/nightly",
    "/ui/executions",
    "/ui/executions/nightly:2026-03-02T00:05:00Z",
    "/ui/dead-letters",
    "/ui/cluster",
)


@pytest.mark.parametrize("path", PAGES)
async def test_pages_send_a_visitor_without_a_session_to_sign_in(
    memory_console: Console, path: str
) -> None:
    response = await memory_console.browser().client.get(path)
    assert response.status_code == 303
    wanted = "/ui/login" if path == "/ui/overview" else "/ui/login?next=%2Fui%2F"
    assert response.headers["location"].startswith(wanted)
    assert_secured(response)


async def test_signing_in_opens_a_session_whose_cookie_holds_a_random_id_not_the_token(
    memory_console: Console,
) -> None:
    browser = memory_console.browser()
    form = await browser.client.get("/ui/login", params={"next": "/ui/schedules?enabled=false"})
    assert_secured(form)
    assert f"{LOGIN_COOKIE}=" in form.headers["set-cookie"]
    token = memory_console.api.tokens["admin"][1]
    response = await browser.client.post(
        "/ui/login",
        data={"csrf": csrf_of(form), "token": token, "next": "/ui/schedules?enabled=false"},
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/schedules?enabled=false"
    cookie = session_cookie(response)
    for attribute in ("HttpOnly", "Path=/ui", "SameSite=strict", "Secure"):
        assert attribute in cookie
    assert token not in " ".join(response.headers.get_list("set-cookie"))
    session_id = browser.client.cookies[SESSION_COOKIE]
    assert session_id.startswith("cs_")
    assert len(session_id) >= 40
    page = await browser.client.get("/ui/schedules?enabled=false")
    assert page.status_code == 200
    assert csrf_of(page) == csrf_token(session_id)
    # The ledger holds the session under the hash of its id, as the admin token's.
    session = await memory_console.api.ledger.sessions_touch(
        hashlib.sha256(session_id.encode()).digest()
    )
    assert (session.token_id, session.scope) == (memory_console.api.admin_id, "admin")
    assert session.idle_timeout_s == CONSOLE_SESSION_IDLE_S_DEFAULT
    lifetime = session.expires_at - session.created_at
    assert lifetime.total_seconds() == CONSOLE_SESSION_LIFETIME_S_DEFAULT
    stored = msgspec.json.encode(session).decode()
    assert session_id not in stored
    assert token not in stored
    another = await memory_console.signed_in()
    assert another.client.cookies[SESSION_COOKIE] != session_id  # one session per sign-in


async def test_cookies_are_secure_even_on_a_plain_http_request(memory_console: Console) -> None:
    """Behind a TLS-terminating proxy the node sees plain http: its cookies are Secure all the
    same, so a browser never sends them over an unencrypted connection. A browser really on
    plain http then cannot sign in, and the page says why and what to do."""
    browser = memory_console.browser("http://console.test")
    form = await browser.client.get("/ui/login")
    assert "Secure" in form.headers["set-cookie"]
    assert "--console-insecure-cookie" in form.text
    assert "--trusted-proxies" in form.text
    response = await sign_in(browser, memory_console.api.tokens["admin"][1])
    assert response.status_code == 403  # the Secure sign-in cookie did not come back
    assert "--console-insecure-cookie" in response.text
    assert SESSION_COOKIE not in browser.client.cookies
    over_https = await memory_console.browser().client.get("/ui/login")
    assert "--console-insecure-cookie" not in over_https.text


async def test_a_node_told_to_serve_plain_http_sends_cookies_without_secure_over_http_only() -> (
    None
):
    async with console_with(ConsoleSettings(insecure_cookie=True)) as console:
        token = console.api.tokens["admin"][1]
        plain = console.browser("http://console.test")
        response = await sign_in(plain, token)
        assert "Secure" not in session_cookie(response)
        assert (await plain.client.get("/ui/overview")).status_code == 200
        assert "--console-insecure-cookie" not in (await plain.client.get("/ui/login")).text
        response = await sign_in(console.browser("https://console.test"), token)
        assert "Secure" in session_cookie(response)


@pytest.mark.parametrize(
    ("peer", "forwarded", "secure"),
    [
        ("10.0.0.5", "https", True),  # a trusted proxy says the browser used https
        ("10.0.0.5", "http", False),
        ("10.0.0.5", "http, https", True),  # the nearest proxy's word counts
        ("10.0.0.5", "gopher", False),
        ("192.0.2.7", "https", False),  # anyone else's header is ignored
        ("not-an-address", "https", False),
    ],
)
async def test_only_a_trusted_proxy_says_the_request_came_over_https(
    peer: str, forwarded: str, secure: bool
) -> None:
    settings = ConsoleSettings(insecure_cookie=True, trusted_proxies=(ip_network("10.0.0.0/24"),))
    async with console_with(settings) as console:
        browser = console.browser("http://console.test", address=peer)
        form = await browser.client.get("/ui/login", headers={"x-forwarded-proto": forwarded})
        assert form.status_code == 200
        assert ("Secure" in form.headers["set-cookie"]) is secure


async def test_a_bad_token_is_refused_without_echoing_it(memory_console: Console) -> None:
    browser = memory_console.browser()
    response = await sign_in(browser, "crl_000000000000_forged<script>")
    assert response.status_code == 401
    assert "not valid" in response.text
    assert "forged" not in response.text
    assert SESSION_COOKIE not in browser.client.cookies
    assert_secured(response)


async def test_a_sign_in_without_its_form_token_is_refused(memory_console: Console) -> None:
    browser = memory_console.browser()
    token = memory_console.api.tokens["admin"][1]
    response = await browser.client.post("/ui/login", data={"csrf": "x", "token": token})
    assert response.status_code == 403
    assert SESSION_COOKIE not in browser.client.cookies


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "/v1/cluster"])
async def test_sign_in_never_returns_outside_the_console(
    memory_console: Console, target: str
) -> None:
    response = await sign_in(
        memory_console.browser(), memory_console.api.tokens["admin"][1], target
    )
    assert response.headers["location"] == "/ui/overview"


async def test_a_revoked_token_ends_its_sessions(memory_console: Console) -> None:
    browser = await memory_console.signed_in("tenant:acme")
    token_id = memory_console.api.tenant_token_id("acme")
    await memory_console.api.ledger.tokens_revoke(TokensRevoke(token_id, "test"))
    memory_console.api.clock.advance(max(TOKEN_CACHE_TTL_S, SESSION_CACHE_TTL_S) + 0.1)
    response = await browser.client.get("/ui/schedules")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/ui/login")
    assert SESSION_COOKIE not in browser.client.cookies  # cleared


async def test_signing_out_ends_the_session_so_a_copied_cookie_is_useless(
    memory_console: Console,
) -> None:
    browser = await memory_console.signed_in()
    stolen = browser.client.cookies[SESSION_COOKIE]
    thief = memory_console.browser()
    thief.client.cookies.set(SESSION_COOKIE, stolen, domain="console.test", path="/ui")
    assert (await thief.client.get("/ui/overview")).status_code == 200  # before sign-out
    response = await browser.post("/ui/logout", {})
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login?notice=logged-out"
    assert SESSION_COOKIE not in browser.client.cookies
    assert (await browser.client.get("/ui/overview")).status_code == 303
    assert "You are signed out" in (await browser.client.get("/ui/login?notice=logged-out")).text
    response = await thief.client.get("/ui/overview")  # at once, not after a cache's life
    assert response.status_code == 303
    assert response.headers["location"].startswith("/ui/login")
    with pytest.raises(NotFound):
        await memory_console.api.ledger.sessions_touch(hashlib.sha256(stolen.encode()).digest())


async def test_signing_in_again_ends_the_session_it_replaces(memory_console: Console) -> None:
    browser = await memory_console.signed_in()
    first = browser.client.cookies[SESSION_COOKIE]
    await sign_in(browser, memory_console.api.tokens["tenant:acme"][1])
    assert browser.client.cookies[SESSION_COOKIE] != first
    with pytest.raises(NotFound):
        await memory_console.api.ledger.sessions_touch(hashlib.sha256(first.encode()).digest())


async def test_a_session_left_unused_ends_and_one_in_use_lasts_until_its_lifetime() -> None:
    settings = ConsoleSettings(session_idle_s=600.0, session_lifetime_s=3600.0)
    async with console_with(settings) as console:
        clock = console.api.clock
        idle = await console.signed_in()
        busy = await console.signed_in()
        for _ in range(5):  # 50 minutes, a page every 10 minutes less a second
            clock.advance(599.0)
            assert (await busy.client.get("/ui/overview")).status_code == 200
        response = await idle.client.get("/ui/overview")
        assert response.status_code == 303
        assert response.headers["location"].startswith("/ui/login")
        clock.advance(599.0)
        assert (await busy.client.get("/ui/overview")).status_code == 200  # 59m54s in
        clock.advance(10.0)  # 60m04s: past its lifetime (and the cache's), however busy
        assert (await busy.client.get("/ui/overview")).status_code == 303
        assert SESSION_COOKIE not in busy.client.cookies


async def test_session_lookups_are_cached_and_forged_cookies_pay_before_the_database() -> None:
    counting: list[FaultyLedger] = []

    def wrap(inner: Ledger) -> Ledger:
        counting.append(FaultyLedger(inner))  # counting the session lookups that reach it
        return counting[0].as_ledger()

    async with console_with(ConsoleSettings(), wrap, anonymous_burst=5) as console:
        [ledger] = counting
        browser = await console.signed_in()
        ledger.calls.clear()
        for _ in range(10):
            assert (await browser.client.get("/ui/overview")).status_code == 200
        assert ledger.calls["sessions_touch"] == 0  # the sign-in's own lookup is still fresh
        console.api.clock.advance(SESSION_CACHE_TTL_S + 0.1)
        assert (await browser.client.get("/ui/overview")).status_code == 200
        assert ledger.calls["sessions_touch"] == 1
        forger = console.browser(address="198.51.100.9")
        statuses = []
        for n in range(20):
            forger.client.cookies.set(SESSION_COOKIE, f"cs_forged{n:040d}", domain="console.test")
            statuses.append((await forger.client.get("/ui/overview")).status_code)
        assert statuses[:5] == [303] * 5
        assert set(statuses[5:]) == {429}
        assert ledger.calls["sessions_touch"] == 1 + 5  # no more lookups than the address's burst
        assert (await browser.client.get("/ui/overview")).status_code == 200  # unaffected


async def test_a_form_without_the_sessions_csrf_token_changes_nothing(
    memory_console: Console,
) -> None:
    await memory_console.api.create_schedule("nightly")
    browser = await memory_console.signed_in()
    other = await memory_console.signed_in("tenant:acme")
    for form in ({}, {"csrf": ""}, {"csrf": "0" * 64}, {"csrf": other.csrf}):
        response = await browser.post("/ui/schedules/nightly/pause", form, csrf=False)
        assert response.status_code == 403, form
        assert "did not come from this console" in response.text
        assert_secured(response)
    assert (await memory_console.api.ledger.schedules_get("nightly")).enabled


async def test_a_post_that_is_not_a_form_is_refused(memory_console: Console) -> None:
    await memory_console.api.create_schedule("nightly")
    browser = await memory_console.signed_in()
    response = await browser.client.post("/ui/schedules/nightly/pause", json={"csrf": browser.csrf})
    assert response.status_code == 400
    assert (await memory_console.api.ledger.schedules_get("nightly")).enabled


@pytest.mark.parametrize("path", [*PAGES, "/ui/login", "/ui/static/console.css", "/ui/nowhere"])
async def test_every_console_response_carries_the_security_headers(
    memory_console: Console, path: str
) -> None:
    browser = await memory_console.signed_in()
    response = await browser.client.get(path)
    if path == "/ui/nowhere":
        assert response.status_code == 404
        return  # not a console route: the API's problem document
    assert_secured(response)
    csp = response.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp
    assert "'unsafe-inline'" not in csp
    if path.startswith("/ui/static"):
        return
    assert response.headers["cache-control"] == "no-store"
    assert "text/html" in response.headers["content-type"]
    assert " style=" not in response.text  # the CSP allows no inline style
    assert "<script>" not in response.text  # nor inline script


async def test_static_assets_are_served_with_validators(memory_console: Console) -> None:
    client = memory_console.browser().client
    response = await client.get("/ui/static/console.js")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/javascript")
    again = await client.get(
        "/ui/static/console.js", headers={"if-none-match": response.headers["etag"]}
    )
    assert again.status_code == 304
    assert (await client.get("/ui/static/../app.py")).status_code == 404


async def test_with_the_database_down_sessions_answer_503_pages_and_sign_out_ends_nothing() -> None:
    switch: list[FaultyLedger] = []

    def wrap(inner: Ledger) -> Ledger:
        switch.append(FaultyLedger(inner))
        return switch[0].as_ledger()

    async with console_with(ConsoleSettings(), wrap) as console:
        [ledger] = switch
        browser = await console.signed_in()
        console.api.clock.advance(SESSION_CACHE_TTL_S + 0.1)
        ledger.down = True
        page = await browser.client.get("/ui/overview")
        assert page.status_code == 503
        assert_secured(page)
        response = await browser.post("/ui/logout", {})
        assert response.status_code == 503  # not signed out: the session was not revoked
        assert SESSION_COOKIE in browser.client.cookies
        refused = await sign_in(console.browser(), console.api.tokens["tenant:acme"][1])
        assert refused.status_code == 503
        ledger.down = False
        assert (await browser.client.get("/ui/overview")).status_code == 200
        assert (await browser.post("/ui/logout", {})).status_code == 303


def revoke_failing(inner: Ledger) -> Ledger:
    """``inner``, with ``sessions_revoke`` failing as if the database had just gone away."""
    faulty = FaultyLedger(inner)
    faulty.fail_next("sessions_revoke", LedgerUnavailable("the database went away"), times=None)
    return faulty.as_ledger()


async def test_a_sign_in_that_cannot_end_the_session_it_replaces_still_signs_in() -> None:
    async with console_with(ConsoleSettings(), revoke_failing) as console:
        browser = await console.signed_in()
        first = browser.client.cookies[SESSION_COOKIE]
        response = await sign_in(browser, console.api.tokens["tenant:acme"][1])
        assert response.status_code == 303
        assert browser.client.cookies[SESSION_COOKIE] != first
        assert (await browser.client.get("/ui/schedules")).status_code == 200


def test_a_node_serves_the_console_with_its_configured_session_settings() -> None:
    clock = ManualClock(START)
    config = NodeConfig(
        node_id="n1",
        http="127.0.0.1:0",
        console_insecure_cookie=True,
        console_session_idle_s=600,
        console_session_lifetime_s=7200,
        trusted_proxies="10.0.0.5,fd00::/8",
    )
    node = Node(config, memory_ledger(clock), clock, random.Random(1))
    assert node.api is not None
    assert node.api.context.console == ConsoleSettings(
        insecure_cookie=True,
        session_idle_s=600,
        session_lifetime_s=7200,
        trusted_proxies=(ip_network("10.0.0.5"), ip_network("fd00::/8")),
    )
