"""Who may call what: bearer tokens, scopes, revocation, rate limits, and /metrics access."""

from __future__ import annotations

import random
import re
import string

import pytest

from engine.api.app import endpoints
from engine.api.auth import (
    ADMIN_SCOPE,
    TOKEN_CACHE_TTL_S,
    TOKEN_LENGTH_MAX,
    TOKEN_MISSES_CACHED,
    Authenticator,
    new_token,
)
from engine.api.endpoint import Access, Endpoint
from engine.api.problems import Problem
from engine.ledger.params import TokensCreate, TokensRevoke
from engine.model import ApiToken
from engine.testing import FaultyLedger, ManualClock
from tests.api.support import (
    START,
    Api,
    assert_problem,
    bearer,
    fake_metrics,
    memory_ledger,
    prepare_ledger,
    serve,
)

_PARAM = re.compile(r"{([a-z_]+)}")


def concrete(path: str) -> str:
    """``path`` with every parameter filled in by a made-up id."""
    return _PARAM.sub("x-1", path)


def label(endpoint: Endpoint) -> str:
    return f"{endpoint.method} {endpoint.path}"


GUARDED = [e for e in endpoints() if e.access is not Access.OPEN]
ADMIN_ONLY = [e for e in endpoints() if e.access is Access.ADMIN]


@pytest.mark.parametrize("endpoint", GUARDED, ids=label)
async def test_every_guarded_endpoint_answers_401_without_a_token(endpoint: Endpoint) -> None:
    clock = ManualClock(START)
    ledger = memory_ledger(clock)
    await prepare_ledger(ledger)
    async with serve(ledger, clock, "memory", metrics_protected=True, metrics=fake_metrics) as api:
        response = await api.client.request(endpoint.method, concrete(endpoint.path), json={})
        body = assert_problem(response, 401, "unauthorized")
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert body["instance"] == concrete(endpoint.path)


def test_every_route_but_the_probes_and_the_document_is_guarded() -> None:
    open_paths = {e.path for e in endpoints() if e.access is Access.OPEN}
    assert open_paths == {"/healthz", "/readyz", "/openapi.json"}


@pytest.mark.parametrize(
    "authorization",
    [
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token crl_abc",
        "crl_abc",
        "Bearer abc",
        "Bearer crl_" + "a" * TOKEN_LENGTH_MAX,
    ],
    ids=[
        "empty",
        "bearer-alone",
        "bearer-blank",
        "basic",
        "wrong-scheme",
        "no-scheme",
        "no-prefix",
        "too-long",
    ],
)
async def test_malformed_authorization_header_gets_401(memory_api: Api, authorization: str) -> None:
    response = await memory_api.client.get(
        "/v1/schedules", headers={"Authorization": authorization}
    )
    assert_problem(response, 401, "unauthorized")


async def test_forged_token_with_the_right_shape_gets_401(memory_api: Api) -> None:
    real_id = memory_api.admin_id
    forged = f"crl_{real_id}_{'A' * 32}"
    response = await memory_api.client.get("/v1/schedules", headers=bearer(forged))
    body = assert_problem(response, 401, "unauthorized")
    assert body["detail"] == "the token is not valid"


async def test_scheme_is_case_insensitive(memory_api: Api) -> None:
    token = memory_api.tokens["admin"][1]
    response = await memory_api.client.get(
        "/v1/schedules", headers={"Authorization": f"bearer {token}"}
    )
    assert response.status_code == 200, response.text


async def test_revoked_token_keeps_working_until_the_cache_expires_then_gets_401(
    api: Api,
) -> None:
    token_id, token = await api.new_token("tenant:acme")
    assert (await api.client.get("/v1/schedules", headers=bearer(token))).status_code == 200
    await api.ledger.tokens_revoke(TokensRevoke(token_id, "test"))
    # Cached for TOKEN_CACHE_TTL_S: a revocation takes effect within that, not at once.
    assert (await api.client.get("/v1/schedules", headers=bearer(token))).status_code == 200
    api.clock.advance(TOKEN_CACHE_TTL_S + 0.1)
    response = await api.client.get("/v1/schedules", headers=bearer(token))
    body = assert_problem(response, 401, "unauthorized")
    assert body["detail"] == "the token was revoked"


async def test_forget_makes_a_revocation_take_effect_at_once(memory_api: Api) -> None:
    token_id, token = await memory_api.new_token("admin")
    assert (await memory_api.client.get("/v1/cluster", headers=bearer(token))).status_code == 200
    await memory_api.ledger.tokens_revoke(TokensRevoke(token_id, "test"))
    memory_api.context.auth.forget()
    assert_problem(await memory_api.client.get("/v1/cluster", headers=bearer(token)), 401)


@pytest.mark.parametrize("endpoint", ADMIN_ONLY, ids=label)
async def test_tenant_token_gets_403_on_admin_routes(memory_api: Api, endpoint: Endpoint) -> None:
    response = await memory_api.client.request(
        endpoint.method, concrete(endpoint.path), json={}, headers=memory_api.tenant("acme")
    )
    assert_problem(response, 403, "forbidden")


async def test_token_over_its_burst_gets_429_with_retry_after() -> None:
    clock = ManualClock(START)
    ledger = memory_ledger(clock)
    await prepare_ledger(ledger)
    async with serve(ledger, clock, "memory", token_rate_per_s=2.0, token_burst=3) as api:
        for _ in range(3):
            assert (await api.client.get("/v1/schedules", headers=api.admin)).status_code == 200
        response = await api.client.get("/v1/schedules", headers=api.admin)
        problem = assert_problem(response, 429, "rate-limited")
        assert int(response.headers["retry-after"]) >= 1
        assert problem["detail"].startswith("this token's requests are limited to 2/s")
        assert "burst of 3" in problem["detail"]
        # Another token has a bucket of its own.
        other = await api.client.get("/v1/schedules", headers=api.tenant("acme"))
        assert other.status_code == 200
        clock.advance(float(response.headers["retry-after"]))
        assert (await api.client.get("/v1/schedules", headers=api.admin)).status_code == 200


async def test_client_sending_bad_tokens_gets_429_before_reaching_the_ledger() -> None:
    clock = ManualClock(START)
    ledger = memory_ledger(clock)
    await prepare_ledger(ledger)
    async with serve(ledger, clock, "memory", anonymous_rate_per_s=1.0, anonymous_burst=2) as api:
        # Seen valid once (its first lookup took one of the address's two requests), so a
        # flood from the same address (a shared proxy) cannot lock it out.
        assert (await api.client.get("/v1/schedules", headers=api.admin)).status_code == 200
        forged = bearer("crl_000000000000_forged")
        assert_problem(await api.client.get("/v1/schedules", headers=forged), 401)
        response = await api.client.get("/v1/schedules", headers=forged)
        problem = assert_problem(response, 429, "rate-limited")
        assert int(response.headers["retry-after"]) >= 1
        assert problem["detail"].startswith(
            "requests without a valid token are limited per client address to 1/s with a burst of 2"
        )
        assert "token's" not in problem["detail"]
        clock.advance(TOKEN_CACHE_TTL_S)  # the admin token's cached lookup has expired
        for forged_again in ("crl_000000000001_forged", "crl_000000000002_forged"):
            assert_problem(await api.client.get("/v1/schedules", headers=bearer(forged_again)), 401)
        assert_problem(await api.client.get("/v1/schedules", headers=forged), 429)
        # Looked up again although the address's bucket is empty.
        assert (await api.client.get("/v1/schedules", headers=api.admin)).status_code == 200
        # A token this node has never seen valid waits for the address's bucket like any other.
        assert_problem(await api.client.get("/v1/schedules", headers=api.tenant("acme")), 429)
        clock.advance(1.0)
        assert (
            await api.client.get("/v1/schedules", headers=api.tenant("acme"))
        ).status_code == 200


def forged_token(rng: random.Random) -> str:
    """A token of the real shape (``crl_<12 hex>_<32 url-safe>``) that no one issued."""
    secret = "".join(rng.choices(string.ascii_letters + string.digits + "-_", k=32))
    return f"Bearer crl_{rng.getrandbits(48):012x}_{secret}"


async def test_a_flood_of_forged_tokens_from_one_address_costs_at_most_its_burst_in_lookups() -> (
    None
):
    clock = ManualClock(START)
    ledger = FaultyLedger(memory_ledger(clock))  # counting the token lookups that reach it
    auth = Authenticator(
        ledger.as_ledger(),
        clock.monotonic,
        token_rate_per_s=50.0,
        token_burst=100,
        anonymous_rate_per_s=5.0,
        anonymous_burst=20,
    )
    rng = random.Random(25)
    statuses: list[int] = []
    for _ in range(2_000):
        try:
            await auth.authenticate(forged_token(rng), "203.0.113.7")
        except Problem as problem:
            statuses.append(problem.status)
    assert statuses[:20] == [401] * 20
    assert set(statuses[20:]) == {429}
    assert ledger.calls["tokens_get_by_hash"] == 20
    # Time refills the bucket at its rate, and no faster.
    clock.advance(2.0)
    for _ in range(50):
        with pytest.raises(Problem):
            await auth.authenticate(forged_token(rng), "203.0.113.7")
    assert ledger.calls["tokens_get_by_hash"] == 30


async def test_misses_never_push_a_valid_token_out_of_the_cache() -> None:
    clock = ManualClock(START)
    inner = memory_ledger(clock)
    ledger = FaultyLedger(inner)  # counting the token lookups that reach it
    token_id, token, token_hash = new_token()
    await inner.tokens_create(
        TokensCreate(ApiToken(token_id=token_id, scope=ADMIN_SCOPE), token_hash, "test")
    )
    auth = Authenticator(
        ledger.as_ledger(),
        clock.monotonic,
        token_rate_per_s=1e6,
        token_burst=10**6,
        anonymous_rate_per_s=1.0,
        anonymous_burst=1,
    )
    assert (await auth.authenticate(f"Bearer {token}", "198.51.100.1")).is_admin
    rng = random.Random(7)
    for client in range(TOKEN_MISSES_CACHED + 2_000):  # each from its own address
        with pytest.raises(Problem):
            await auth.authenticate(forged_token(rng), f"10.{client >> 16}.{client >> 8 & 255}.1")
    lookups = ledger.calls["tokens_get_by_hash"]
    assert (await auth.authenticate(f"Bearer {token}", "198.51.100.1")).is_admin
    assert ledger.calls["tokens_get_by_hash"] == lookups  # answered from the cache


async def test_metrics_are_404_when_the_process_serves_none(memory_api: Api) -> None:
    assert_problem(await memory_api.client.get("/metrics"), 404, "not-found")


async def test_metrics_are_open_text_when_a_renderer_is_given() -> None:
    clock = ManualClock(START)
    ledger = memory_ledger(clock)
    async with serve(ledger, clock, "memory", metrics=fake_metrics) as api:
        response = await api.client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        assert b"carillon_up 1" in response.content


async def test_protected_metrics_need_an_admin_token() -> None:
    clock = ManualClock(START)
    ledger = memory_ledger(clock)
    async with serve(ledger, clock, "memory", metrics=fake_metrics, metrics_protected=True) as api:
        assert_problem(await api.client.get("/metrics"), 401)
        assert_problem(await api.client.get("/metrics", headers=api.tenant("acme")), 403)
        response = await api.client.get("/metrics", headers=api.admin)
        assert response.status_code == 200
        assert b"carillon_up 1" in response.content
