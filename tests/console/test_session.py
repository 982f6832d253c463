"""Signing in and out, the session cookie, CSRF, and the headers every response carries."""

from __future__ import annotations

import pytest

from engine.api.auth import TOKEN_CACHE_TTL_S
from engine.api.console.session import LOGIN_COOKIE, SESSION_COOKIE, csrf_token
from engine.ledger.base import TokensRevoke
from tests.console.support import Console, assert_secured, csrf_of, sign_in

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


async def test_signing_in_sets_a_strict_http_only_cookie_and_returns_to_the_page_asked_for(
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
    cookie = next(
        c for c in response.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE)
    )
    assert f"{SESSION_COOKIE}={token};" in cookie
    for attribute in ("HttpOnly", "Path=/ui", "SameSite=strict"):
        assert attribute in cookie
    assert "Secure" not in cookie  # plain http here; see the https test
    page = await browser.client.get("/ui/schedules?enabled=false")
    assert page.status_code == 200
    assert csrf_of(page) == csrf_token(token)


async def test_over_https_the_session_cookie_is_secure(memory_console: Console) -> None:
    browser = memory_console.browser()
    browser.client.base_url = "https://console.test"  # type: ignore[assignment]
    response = await sign_in(browser, memory_console.api.tokens["admin"][1])
    assert response.status_code == 303
    assert "Secure" in response.headers["set-cookie"]


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


async def test_a_revoked_token_ends_the_session(memory_console: Console) -> None:
    browser = await memory_console.signed_in("tenant:acme")
    token_id = memory_console.api.tenant_token_id("acme")
    await memory_console.api.ledger.tokens_revoke(TokensRevoke(token_id, "test"))
    memory_console.api.clock.advance(TOKEN_CACHE_TTL_S + 0.1)
    response = await browser.client.get("/ui/schedules")
    assert response.status_code == 303
    assert response.headers["location"].startswith("/ui/login")
    assert SESSION_COOKIE not in browser.client.cookies  # cleared


async def test_signing_out_clears_the_session(memory_console: Console) -> None:
    browser = await memory_console.signed_in()
    response = await browser.post("/ui/logout", {})
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login?notice=logged-out"
    assert SESSION_COOKIE not in browser.client.cookies
    assert (await browser.client.get("/ui/overview")).status_code == 303
    assert "You are signed out" in (await browser.client.get("/ui/login?notice=logged-out")).text


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
