"""A demo cluster's last hour, replayed into a memory ledger: what the console shows off.

Three tenants and their schedules (one webhook task type holding a secret that no page may
show), three nodes in two regions owning sixteen partitions, and an hour of planning,
claims and completions minute by minute on a :class:`~engine.testing.ManualClock`: a steady
load, a top-of-hour burst, a slow spell twenty minutes ago (late starts, a growing queue),
retries and dead letters. The clock stops at :data:`DEMO_NOW`, a few days before Europe's
clocks go forward, so schedule pages have a DST change to mark.

Used by the browser tests and by ``python -m tests.console.screenshots``.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from engine.api.auth import new_token
from engine.core.timetable import Timetable
from engine.ledger.base import Ledger
from engine.ledger.params import (
    Completion,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsPlan,
    Fence,
    LeasesAcquire,
    NodesHeartbeat,
    Outcome,
    PlannedExecution,
    ScheduleAdvance,
    SchedulesCreate,
    TaskTypesPut,
    TenantsPut,
    TokensCreate,
)
from engine.model import ApiToken, HandlerKind, Schedule, TaskType, Tenant, execution_id
from engine.testing import ManualClock

DEMO_NOW: Final = datetime(2026, 3, 27, 14, 20, 30, tzinfo=UTC)
DEMO_START: Final = DEMO_NOW.replace(second=0) - timedelta(minutes=60)
PARTITIONS: Final = 16
NODES: Final = (("node-eu-1", "eu-west", 0.004), ("node-eu-2", "eu-west", -0.02))
NODES_US: Final = (("node-us-1", "us-east", 1.4),)
WEBHOOK_SECRET: Final = "whsec_demo_never_shown"
SLOW_MINUTES: Final = range(36, 44)
Action = Callable[[], Awaitable[None]]
Event = tuple[datetime, int, Action]
"""Minutes of the hour (from its start) when workers fall behind."""


def _schedules() -> list[Schedule]:
    def make(schedule_id: str, tenant: str, cron: str, task_type: str, **extra: Any) -> Schedule:
        return Schedule(
            schedule_id=schedule_id,
            tenant_id=tenant,
            cron_expr=cron,
            task_type=task_type,
            **extra,
        )

    schedules = [
        make(
            "billing-invoices-eu",
            "acme",
            "30 1 * * *",
            "invoice-webhook",
            timezone="Europe/London",
            payload={"region": "eu", "note": "<b>not bold</b>"},
        ),
        make("billing-reminders", "acme", "*/5 * * * *", "invoice-webhook"),
        make("globex-report-daily", "globex", "0 9 * * 1-5", "report", timezone="America/New_York"),
        make("initech-tps-audit", "initech", "0 2 * * *", "report", timezone="Europe/Berlin"),
    ]
    schedules += [make(f"acme-sync-{i:02d}", "acme", "* * * * *", "noop") for i in range(12)]
    schedules += [make(f"globex-hourly-{i:03d}", "globex", "0 * * * *", "noop") for i in range(160)]
    schedules += [
        make(f"initech-tps-{i:02d}", "initech", "*/15 * * * *", "report") for i in range(30)
    ]
    return schedules


async def _catalog(ledger: Ledger) -> None:
    for task_type in (
        TaskType(name="noop", kind=HandlerKind.NOOP, allowed_tenants=("*",)),
        TaskType(name="report", kind=HandlerKind.NOOP, allowed_tenants=("*",), max_attempts=3),
        TaskType(
            name="invoice-webhook",
            kind=HandlerKind.WEBHOOK,
            allowed_tenants=("*",),
            settings={"url": "https://billing.example/hook", "secret": WEBHOOK_SECRET},
        ),
    ):
        await ledger.task_types_put(TaskTypesPut(task_type))
    await ledger.tenants_put(TenantsPut(Tenant(tenant_id="acme", weight=3, schedules_max=1000)))
    await ledger.tenants_put(TenantsPut(Tenant(tenant_id="globex", weight=1)))


async def mint(ledger: Ledger, scope: str) -> str:
    token_id, token, token_hash = new_token()
    await ledger.tokens_create(
        TokensCreate(ApiToken(token_id=token_id, scope=scope), token_hash, "demo")
    )
    return token


def _delay_s(minute: int, index: int) -> float:
    """How long after its instant an execution starts: fast, but slow for a spell."""
    if minute in SLOW_MINUTES:
        return 20.0 + 12.0 * (minute - SLOW_MINUTES.start) + index % 7
    return 0.15 + (index % 5) * 0.1


def _outcome(schedule_id: str, minute: int, attempt: int) -> tuple[Outcome, str | None, str | None]:
    if schedule_id == "billing-reminders" and minute % 15 == 5 and attempt < 3:
        return Outcome.FAILED, "http_503", "the hook answered 503 Service Unavailable"
    if schedule_id == "billing-reminders" and minute % 15 == 10:
        return Outcome.DEAD_LETTER, "http_410", "the hook answered 410 Gone: <endpoint removed>"
    if schedule_id.startswith("initech-tps-0") and minute in SLOW_MINUTES:
        return Outcome.DEAD_LETTER, "timeout", "the report did not finish within 30 s"
    return Outcome.SUCCEEDED, None, None


async def seed(ledger: Ledger, clock: ManualClock) -> dict[str, str]:
    """Store the demo and replay its hour; returns tokens by scope (``admin``,
    ``tenant:acme``). The clock ends at :data:`DEMO_NOW`."""
    await _catalog(ledger)
    fresh = [
        msgspec.structs.replace(s, next_run_at=_next_fire(s, DEMO_START)) for s in _schedules()
    ]
    stored = await ledger.schedules_create(SchedulesCreate(fresh))
    tokens = {
        "admin": await mint(ledger, "admin"),
        "tenant:acme": await mint(ledger, "tenant:acme"),
    }
    owners = [*NODES, *NODES_US]
    fences: dict[int, Fence] = {}
    for partition in range(PARTITIONS):
        owner = owners[partition * len(owners) // PARTITIONS][0]
        [lease] = await ledger.leases_acquire(LeasesAcquire(owner, [partition], ttl_s=86400))
        fences[partition] = Fence(partition, owner, lease.fencing_token)
    due: dict[datetime, list[Schedule]] = defaultdict(list)
    for schedule in stored:
        timetable = Timetable.compile(schedule.cron_expr, schedule.timezone)
        fire = timetable.next_fire(DEMO_START - timedelta(microseconds=1))
        while fire.planned_at < DEMO_NOW:
            due[fire.planned_at].append(schedule)
            fire = timetable.next_fire(fire.planned_at)
    events: list[Event] = []
    order = itertools.count()

    def later(when: datetime, action: Action) -> None:
        heapq.heappush(events, (when, next(order), action))

    for at, schedules in sorted(due.items()):
        minute = int((at - DEMO_START).total_seconds() // 60)
        events.append(
            (at - timedelta(seconds=4), next(order), _plan(ledger, fences, schedules, at))
        )
        for index, schedule in enumerate(schedules):
            start = at + timedelta(seconds=_delay_s(minute, index))
            if start >= DEMO_NOW:
                continue  # still waiting now: the queue the overview shows
            assert schedule.partition_id is not None  # assigned by the ledger
            claim = _claim(ledger, fences[schedule.partition_id], schedule, at, later)
            events.append((start, next(order), claim))
    heapq.heapify(events)
    while events:
        when, _, action = heapq.heappop(events)
        clock.advance(max((when - clock.now()).total_seconds(), 0.0))
        await action()
    clock.advance((DEMO_NOW - clock.now()).total_seconds())
    for node_id, region, offset in owners:
        lags = {p: 0.0 for p, f in fences.items() if f.owner_id == node_id}
        if node_id == "node-us-1":
            lags = dict.fromkeys(lags, 0.8)
        await ledger.nodes_heartbeat(NodesHeartbeat(node_id, region, 86400, offset, lags))
    return tokens


def _next_fire(schedule: Schedule, after: datetime) -> datetime:
    timetable = Timetable.compile(schedule.cron_expr, schedule.timezone)
    return timetable.next_fire(after).planned_at


def _plan(
    ledger: Ledger, fences: dict[int, Fence], schedules: list[Schedule], at: datetime
) -> Action:
    async def plan() -> None:
        by_partition: dict[int, list[Schedule]] = defaultdict(list)
        for schedule in schedules:
            assert schedule.partition_id is not None
            by_partition[schedule.partition_id].append(schedule)
        for partition, members in sorted(by_partition.items()):
            executions = [
                PlannedExecution(s.schedule_id, s.tenant_id, s.task_type, at) for s in members
            ]
            advances = [
                ScheduleAdvance(s.schedule_id, _next_fire(s, at), s.version) for s in members
            ]
            await ledger.executions_plan(
                ExecutionsPlan(fences[partition], executions, advances, at)
            )

    return plan


def _claim(
    ledger: Ledger,
    fence: Fence,
    schedule: Schedule,
    at: datetime,
    later: Callable[[datetime, Action], None],
) -> Action:
    """Start the fire of ``schedule`` at ``at`` and finish it at once; a failed attempt
    retries twenty seconds later (through ``later``)."""

    async def claim_and_finish() -> None:
        key = execution_id(schedule.schedule_id, at)
        claim = ExecutionsClaim([fence], [key], 600, fence.owner_id)
        [claimed] = await ledger.executions_claim(claim)
        minute = int((at - DEMO_START).total_seconds() // 60)
        outcome, code, message = _outcome(schedule.schedule_id, minute, claimed.attempt)
        retry_at = None
        if outcome is Outcome.FAILED:
            retry_at = claimed.started_at + timedelta(seconds=20) if claimed.started_at else None
        done = Completion(key, claimed.attempt, outcome, retry_at, code, message)
        await ledger.executions_complete(ExecutionsComplete([fence], [done]))
        if retry_at is not None and retry_at < DEMO_NOW:
            later(retry_at + timedelta(seconds=0.4), claim_and_finish)

    return claim_and_finish
