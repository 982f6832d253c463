"""The chaos run's schedules, what they must fire, and their creation through the HTTP API.

The expectation is computed here independently of the engine: every schedule fires every
``period_s`` seconds at the instants ``t`` (UTC, whole seconds) with ``t % period_s == 0``.
That holds for ``* * * * *`` and ``*/10 * * * * *`` in every zone used, because their offsets
from UTC are whole minutes (New York, London, Kolkata +05:30, Lord Howe +10:30/+11:00) and a
wildcard schedule follows absolute time through DST changes. The engine's ``Timetable`` is
never consulted.

Execution ids are rebuilt here too (``scheduleId:YYYY-MM-DDTHH:MM:SSZ``), so a fire that the
engine planned under another id (another instant, another format) shows up as unexpected.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import httpx

from simulations.chaos.config import ChaosConfig

TASK_TYPE: Final = "chaos-webhook"
SECRET: Final = "whsec_" + base64.b64encode(bytes(range(32))).decode()
"""Signing makes each delivery carry ``webhook-timestamp``: when the node built it."""
BATCH_MAX: Final = 1000
API_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class ScheduleSpec:
    schedule_id: str
    tenant_id: str
    timezone: str
    period_s: int

    def fires(self, start_s: float, end_s: float) -> Iterator[int]:
        """The fire instants (Unix seconds) in ``[start_s, end_s)``."""
        first = math.ceil(start_s / self.period_s) * self.period_s
        yield from range(int(first), math.ceil(end_s), self.period_s)

    def is_fire(self, instant_s: float) -> bool:
        return instant_s == int(instant_s) and int(instant_s) % self.period_s == 0


def make_schedules(config: ChaosConfig) -> list[ScheduleSpec]:
    return [
        ScheduleSpec(
            schedule_id=f"chaos-{i:05d}",
            tenant_id=config.tenants[i % len(config.tenants)],
            timezone=config.zones[i % len(config.zones)],
            period_s=config.period_s,
        )
        for i in range(config.schedules)
    ]


def execution_id(schedule_id: str, instant_s: int) -> str:
    text = datetime.fromtimestamp(instant_s, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{schedule_id}:{text}Z"


def parse_execution_id(key: str) -> tuple[str, float] | None:
    """``(schedule_id, instant_s)`` of an execution id, or ``None`` if it is not one."""
    # The instant holds colons and schedule ids here hold none: split at the first.
    schedule_id, sep, text = key.partition(":")
    if not sep:
        return None
    try:
        instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if instant.tzinfo is None:
        return None
    return schedule_id, instant.timestamp()


def first_fire_after(instant_s: float, period_s: int) -> int:
    return math.ceil(instant_s / period_s) * period_s


class Api:
    """The few admin calls the run makes, with an admin bearer token."""

    def __init__(self, base_url: str, token_file: Path) -> None:
        token = token_file.read_text().strip()
        self._client = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=API_TIMEOUT_S,
        )

    def close(self) -> None:
        self._client.close()

    def _check(self, response: httpx.Response) -> Any:
        if response.status_code >= 300:
            raise RuntimeError(
                f"{response.request.method} {response.request.url.path} answered "
                f"{response.status_code}: {response.text[:500]}"
            )
        return response.json() if response.content else None

    def put_webhook_task_type(self, url: str, config: ChaosConfig) -> None:
        self._check(
            self._client.put(
                f"/v1/task-types/{TASK_TYPE}",
                json={
                    "kind": "webhook",
                    "settings": {"url": url, "secret": SECRET},
                    "timeout_s": config.webhook_timeout_s,
                    "max_attempts": 10,
                    "backoff_base_s": config.backoff_base_s,
                    "backoff_max_s": config.backoff_max_s,
                    "allowed_tenants": ["*"],  # every tenant of the workload
                },
            )
        )

    def create_schedules(self, specs: list[ScheduleSpec], config: ChaosConfig) -> None:
        for start in range(0, len(specs), BATCH_MAX):
            chunk = specs[start : start + BATCH_MAX]
            body = {
                "schedules": [
                    {
                        "schedule_id": spec.schedule_id,
                        "tenant_id": spec.tenant_id,
                        "cron_expr": config.cron_expr,
                        "timezone": spec.timezone,
                        "task_type": TASK_TYPE,
                        "payload": {"chaos": True},
                        # Every missed fire runs: a skipped fire would be a miss here.
                        "catch_up": "all",
                        "catch_up_window_s": 3600,
                    }
                    for spec in chunk
                ]
            }
            self._check(self._client.post("/v1/schedules:batch", json=body))
