"""What the API tests share: an app on a ledger, tokens, and shortcuts to build records.

:class:`Api` holds an app served through ``httpx.ASGITransport`` (no socket), the ledger
behind it, and the :class:`~engine.testing.ManualClock` that drives the authenticator (token
cache, rate limits) -- and, on the memory ledger, the ledger's own clock. On Postgres the
ledger keeps the server's ``now()``, so tests that move the ledger's time run on memory only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.applications import Starlette

from engine.api.app import ApiContext, create_app
from engine.api.auth import Authenticator, new_token
from engine.ledger.base import Ledger
from engine.ledger.params import (
    Completion,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsPlan,
    ExecutionsTrigger,
    Fence,
    LeasesAcquire,
    Outcome,
    PlannedExecution,
    TaskTypesPut,
    TokensCreate,
)
from engine.model import ApiToken, HandlerKind, TaskType
from engine.testing import ManualClock

START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
"""A Monday at midnight UTC: where the memory ledger's clock starts."""
PARTITIONS = 8
TENANTS = ("acme", "globex")
"""Tenants that get a token when the app is built (:meth:`Api.tenant`)."""
TASK_TYPE = "noop"
GENEROUS_BURST = 1_000_000_000
"""Rate-limit burst of the default app: high enough that no test but the 429 ones hits it."""
PROBLEM = "application/problem+json"
TEST_NODE = "api-test-node"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Api:
    """The app under test and the handles a test needs around it."""

    client: httpx.AsyncClient
    ledger: Ledger
    clock: ManualClock
    context: ApiContext
    backend: str
    app: Starlette
    tokens: dict[str, tuple[str, str]] = field(default_factory=dict)
    """scope -> (token id, token)."""
    fences: dict[int, Fence] = field(default_factory=dict)

    @property
    def admin(self) -> dict[str, str]:
        """Headers carrying the admin token."""
        return bearer(self.tokens["admin"][1])

    @property
    def admin_id(self) -> str:
        return self.tokens["admin"][0]

    def tenant(self, tenant_id: str) -> dict[str, str]:
        """Headers carrying the token of ``tenant_id`` (one of :data:`TENANTS`)."""
        return bearer(self.tokens[f"tenant:{tenant_id}"][1])

    def tenant_token_id(self, tenant_id: str) -> str:
        return self.tokens[f"tenant:{tenant_id}"][0]

    async def new_token(self, scope: str) -> tuple[str, str]:
        """A fresh token of ``scope``: ``(token id, token)``."""
        token_id, token, token_hash = new_token()
        await self.ledger.tokens_create(
            TokensCreate(ApiToken(token_id=token_id, scope=scope), token_hash, "test")
        )
        return token_id, token

    async def now(self) -> datetime:
        return await self.ledger.database_now()

    async def create_schedule(
        self, schedule_id: str, tenant_id: str = "acme", **fields: Any
    ) -> dict[str, Any]:
        """A schedule made through the API with the admin token (every 5 minutes)."""
        body = {
            "schedule_id": schedule_id,
            "tenant_id": tenant_id,
            "cron_expr": "*/5 * * * *",
            "task_type": TASK_TYPE,
            **fields,
        }
        response = await self.client.post("/v1/schedules", json=body, headers=self.admin)
        assert response.status_code == 201, response.text
        created: dict[str, Any] = response.json()
        return created

    async def queued(self, schedule_id: str) -> str:
        """A queued execution of the schedule (a trigger through the ledger); its id."""
        execution = await self.ledger.executions_trigger(
            ExecutionsTrigger(schedule_id, "test", None)
        )
        if self.backend == "memory":
            # The next trigger gets an instant of its own, and this one is startable now.
            self.clock.advance(0.001)
        return execution.execution_id

    async def planned(self, schedule_id: str, at: datetime) -> str:
        """The fire of the schedule at ``at``, planned as its planner would (queued); its id."""
        schedule = await self.ledger.schedules_get(schedule_id)
        assert schedule.partition_id is not None
        fence = await self._fence(schedule.partition_id)
        fire = PlannedExecution(schedule_id, schedule.tenant_id, schedule.task_type, at)
        [key] = (await self.ledger.executions_plan(ExecutionsPlan(fence, [fire], []))).inserted
        return key

    async def dead_letter(self, schedule_id: str) -> str:
        """An execution of the schedule that ran and was dead-lettered; its id."""
        execution_id = await self.queued(schedule_id)
        schedule = await self.ledger.schedules_get(schedule_id)
        assert schedule.partition_id is not None
        fence = await self._fence(schedule.partition_id)
        [claimed] = await self.ledger.executions_claim(
            ExecutionsClaim([fence], [execution_id], 600.0, TEST_NODE)
        )
        await self.ledger.executions_complete(
            ExecutionsComplete(
                [fence],
                [
                    Completion(
                        execution_id,
                        claimed.attempt,
                        Outcome.DEAD_LETTER,
                        error_code="boom",
                        error_message="it failed for good",
                    )
                ],
            )
        )
        return execution_id

    async def _fence(self, partition_id: int) -> Fence:
        fence = self.fences.get(partition_id)
        if fence is None:
            [lease] = await self.ledger.leases_acquire(
                LeasesAcquire(owner_id=TEST_NODE, partition_ids=[partition_id], ttl_s=86400.0)
            )
            fence = self.fences[partition_id] = Fence(partition_id, TEST_NODE, lease.fencing_token)
        return fence


async def prepare_ledger(ledger: Ledger) -> None:
    """Store the task type the tests' schedules name."""
    await ledger.task_types_put(
        TaskTypesPut(TaskType(name=TASK_TYPE, kind=HandlerKind.NOOP, allowed_tenants=("*",)))
    )


@asynccontextmanager
async def serve(
    ledger: Ledger,
    clock: ManualClock,
    backend: str,
    *,
    token_rate_per_s: float = 1.0,
    token_burst: int = GENEROUS_BURST,
    anonymous_rate_per_s: float = 1.0,
    anonymous_burst: int = GENEROUS_BURST,
    **context: Any,
) -> AsyncIterator[Api]:
    """An :class:`Api` on ``ledger`` with an admin token and one token per :data:`TENANTS`."""
    auth = Authenticator(
        ledger,
        clock.monotonic,
        token_rate_per_s=token_rate_per_s,
        token_burst=token_burst,
        anonymous_rate_per_s=anonymous_rate_per_s,
        anonymous_burst=anonymous_burst,
    )
    api_context = ApiContext(ledger, auth, **context)
    app = create_app(api_context)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        api = Api(client, ledger, clock, api_context, backend, app)
        for scope in ("admin", *(f"tenant:{tenant}" for tenant in TENANTS)):
            api.tokens[scope] = await api.new_token(scope)
        yield api


def memory_ledger(clock: ManualClock) -> Ledger:
    from engine.ledger.memory import MemoryLedger

    return MemoryLedger(clock=clock, partition_count=PARTITIONS)


def assert_problem(
    response: httpx.Response, status: int, slug: str | None = None
) -> dict[str, Any]:
    """``response`` is an RFC 9457 problem of ``status`` (and type ``slug``); its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["title"]
    assert body["detail"]
    assert body["type"].startswith("urn:carillon:problem:")
    if slug is not None:
        assert body["type"] == f"urn:carillon:problem:{slug}", body
    return body


async def walk_pages(
    client: httpx.AsyncClient, path: str, headers: dict[str, str], limit: int
) -> list[dict[str, Any]]:
    """Every item of a paginated listing, following ``next_cursor``."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    separator = "&" if "?" in path else "?"
    for _ in range(10_000):
        url = f"{path}{separator}limit={limit}" + ("" if cursor is None else f"&cursor={cursor}")
        response = await client.get(url, headers=headers)
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["items"]) <= limit
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("the listing never ended")


@dataclass
class RawResponse:
    status_code: int
    headers: dict[str, str]
    body: bytes


async def stream_request(
    app: Starlette,
    method: str,
    path: str,
    headers: dict[str, str],
    pieces: list[bytes],
) -> RawResponse:
    """Call ``app`` over raw ASGI with a body sent as ``pieces`` and no Content-Length, as a
    chunked upload arrives (httpx's client would leave its own body generator unfinished
    when the server stops reading early)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("test", 80),
    }
    queue = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    response_headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return RawResponse(start["status"], response_headers, body)


Metrics = Callable[[str | None], tuple[bytes, str]]


def fake_metrics(accept: str | None) -> tuple[bytes, str]:
    return (
        b"# HELP carillon_up Whether the node runs.\ncarillon_up 1\n",
        "text/plain; version=0.0.4",
    )
