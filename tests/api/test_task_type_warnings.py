"""The warnings in the answer to a task-type write: a ``nats`` stream's duplicate window
looked up against real NATS JetStream servers when the task type is written.

Each test runs a private ``nats-server -js`` (``tests/handlers/nats_server.py``) or none at
all (a closed port, a listener that never speaks); the API is the memory ledger's, served
with a broker bridge of its own as the API server opens one. Real clock: the lookup's bound
is real time.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from engine.handlers import HandlerOptions
from engine.handlers.brokers import BrokerBridge, open_broker_bridge
from engine.handlers.registry import retry_horizon_of
from engine.model import HandlerKind, TaskType
from engine.testing import ManualClock
from tests.api.support import START, Api, assert_problem, memory_ledger, prepare_ledger, serve
from tests.handlers.nats_server import NatsServer, add_stream, nats_server
from tests.handlers.redis_server import free_port

__all__ = ["nats_server"]  # the fixture, imported for this module's tests

LOOPBACK = HandlerOptions(broker_allow_cidrs=("127.0.0.0/8",))
HORIZON_S = retry_horizon_of(TaskType(name="ticks", kind=HandlerKind.NATS))
"""The default retry policy's worst horizon: 518 s, minutes of retries."""
LOOKUP_TIMEOUT_S = 0.5


@pytest.fixture
async def brokers() -> AsyncIterator[BrokerBridge]:
    async with open_broker_bridge() as opened:
        yield opened


@pytest.fixture
async def api(brokers: BrokerBridge) -> AsyncIterator[Api]:
    """The API with a broker bridge, allowed to look at brokers on loopback."""
    clock = ManualClock(START)
    ledger = memory_ledger(clock)
    await prepare_ledger(ledger)
    async with serve(
        ledger,
        clock,
        "memory",
        brokers=brokers,
        handler_options=LOOPBACK,
        broker_lookup_timeout_s=LOOKUP_TIMEOUT_S,
    ) as served:
        yield served


def nats(url: str, **settings: Any) -> dict[str, Any]:
    return {"kind": "nats", "settings": {"url": url, "subject": "ticks.report", **settings}}


async def put(api: Api, body: dict[str, Any], name: str = "ticks") -> tuple[list[Any], float]:
    """``PUT`` the task type; the warnings of its 200 answer, and how long it took."""
    started = time.monotonic()
    response = await api.client.put(f"/v1/task-types/{name}", json=body, headers=api.admin)
    took = time.monotonic() - started
    assert response.status_code == 200, response.text
    warnings: list[Any] = response.json()["warnings"]
    return warnings, took


async def test_a_window_shorter_than_the_retry_horizon_is_warned_about_in_the_answer(
    api: Api, nats_server: NatsServer
) -> None:
    await trio.to_thread.run_sync(
        lambda: add_stream(nats_server.url, "TICKS", ["ticks.>"], duplicate_window=10)
    )

    warnings, _ = await put(api, nats(nats_server.url, stream="TICKS"))

    [warning] = warnings
    assert warning["code"] == "nats_duplicate_window_short"
    assert warning["message"].startswith(
        "task type 'ticks' publishes to NATS stream 'TICKS', whose duplicate window (10 s) is "
        f"shorter than the task type's worst retry horizon ({HORIZON_S:.0f} s)"
    )
    assert (
        f"Raise the stream's duplicate_window to at least {HORIZON_S:.0f} s" in (warning["message"])
    )
    assert (await api.ledger.task_types_get("ticks")).version == 1  # stored all the same


async def test_a_stream_found_by_its_subject_is_looked_up_too(
    api: Api, nats_server: NatsServer
) -> None:
    await trio.to_thread.run_sync(
        lambda: add_stream(nats_server.url, "TICKS", ["ticks.>"], duplicate_window=10)
    )

    [warning], _ = await put(api, nats(nats_server.url))  # no stream named: the subject's

    assert warning["code"] == "nats_duplicate_window_short"
    assert "NATS stream 'TICKS'" in warning["message"]


async def test_a_window_covering_the_retry_horizon_answers_no_warning(
    api: Api, nats_server: NatsServer
) -> None:
    await trio.to_thread.run_sync(
        lambda: add_stream(nats_server.url, "TICKS", ["ticks.>"], duplicate_window=3600)
    )

    assert (await put(api, nats(nats_server.url, stream="TICKS")))[0] == []
    assert (await put(api, nats(nats_server.url)))[0] == []
    # The same stream, and a policy whose retries outlast the hour: warned about.
    longer = {**nats(nats_server.url), "max_attempts": 40, "backoff_max_s": 300}
    [warning], _ = await put(api, longer)
    assert warning["code"] == "nats_duplicate_window_short"


async def test_an_unreachable_server_saves_the_task_type_with_an_unchecked_warning(
    api: Api, brokers: BrokerBridge
) -> None:
    closed = f"nats://127.0.0.1:{free_port()}"

    [warning], took = await put(api, nats(closed, stream="TICKS"))

    assert warning["code"] == "nats_stream_unchecked"
    assert warning["message"].startswith(
        "task type 'ticks' publishes to NATS stream 'TICKS', whose duplicate window could not "
        "be read ("
    )
    assert f"({closed} subject 'ticks.report': NoServersError" in warning["message"]
    assert f"at least {HORIZON_S:.0f} s" in warning["message"]
    assert took < LOOKUP_TIMEOUT_S
    assert (await api.ledger.task_types_get("ticks")).settings["url"] == closed
    assert brokers.statistics().clients == 0  # the lookup pools nothing


async def test_a_server_that_never_answers_costs_the_write_only_the_lookup_bound(
    api: Api, brokers: BrokerBridge
) -> None:
    with trio.socket.socket() as silent:  # accepts connections (the backlog), says nothing
        await silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]

        [warning], took = await put(api, nats(f"nats://127.0.0.1:{port}"))

    assert warning["code"] == "nats_stream_unchecked"
    assert f"no answer within {LOOKUP_TIMEOUT_S:g} s" in warning["message"]
    assert "the stream of NATS subject 'ticks.report' on nats://127.0.0.1:" in warning["message"]
    assert LOOKUP_TIMEOUT_S <= took < LOOKUP_TIMEOUT_S + 1.0
    assert brokers.statistics().in_use == 0
    assert (await api.ledger.task_types_get("ticks")).kind is HandlerKind.NATS


async def test_a_missing_stream_is_named_in_the_unchecked_warning(
    api: Api, nats_server: NatsServer
) -> None:
    [named], _ = await put(api, nats(nats_server.url, stream="NOPE"))
    [by_subject], _ = await put(api, nats(nats_server.url))

    assert named["code"] == by_subject["code"] == "nats_stream_unchecked"
    assert "(there is no stream 'NOPE')" in named["message"]
    assert "(no stream takes the subject 'ticks.report')" in by_subject["message"]


async def test_an_address_the_node_refuses_is_not_looked_at(
    api: Api, brokers: BrokerBridge, nats_server: NatsServer
) -> None:
    api.context.handler_options = HandlerOptions()  # loopback not allowed: no publish, no look

    [warning], _ = await put(api, nats(nats_server.url, stream="TICKS"))

    assert warning["code"] == "nats_stream_unchecked"
    assert "--broker-allow-cidrs" in warning["message"]
    assert not brokers.statistics().started  # not a connection made


async def test_other_kinds_look_at_nothing(api: Api, brokers: BrokerBridge) -> None:
    bodies = {
        "noop": {"kind": "noop"},
        "hook": {"kind": "webhook", "settings": {"url": "https://example.com/hook"}},
        "stream": {"kind": "redis", "settings": {"url": "redis://127.0.0.1:1", "stream": "t"}},
        "queue": {
            "kind": "rabbitmq",
            "settings": {"url": "amqp://127.0.0.1:1", "exchange": "x", "routing_key": "r"},
        },
    }
    for name, body in bodies.items():
        assert (await put(api, body, name))[0] == []

    assert not brokers.statistics().started  # the bridge never ran anything


async def test_without_a_broker_bridge_the_answer_says_nothing_was_looked_at(
    api: Api, nats_server: NatsServer
) -> None:
    api.context.brokers = None

    [warning], _ = await put(api, nats(nats_server.url, stream="TICKS"))

    assert warning["code"] == "nats_stream_unchecked"
    assert "no broker bridge" in warning["message"]


async def test_refused_settings_are_refused_before_any_lookup(
    api: Api, brokers: BrokerBridge
) -> None:
    bad = nats("nats://127.0.0.1:4222", stream="no spaces")

    response = await api.client.put("/v1/task-types/ticks", json=bad, headers=api.admin)

    assert_problem(response, 422, "invalid-field")
    assert not brokers.statistics().started


# -- carillon apply -------------------------------------------------------------------------


async def test_apply_answers_each_written_nats_task_types_warnings_with_its_change(
    api: Api, nats_server: NatsServer
) -> None:
    await trio.to_thread.run_sync(
        lambda: add_stream(nats_server.url, "TICKS", ["ticks.>"], duplicate_window=10)
    )
    task_types = [
        {"name": name, **nats(nats_server.url), "source": f"ticks.yaml:{line}"}
        for name, line in (("ticks", 2), ("tocks", 7))
    ]
    hook = {"name": "hook", "kind": "webhook", "settings": {"url": "https://example.com/h"}}
    body = {"manifest_set": "ticks", "task_types": [*task_types, hook]}

    planned = await api.client.post("/v1/apply?dry_run=true", json=body, headers=api.admin)
    applied = await api.client.post("/v1/apply", json=body, headers=api.admin)
    again = await api.client.post("/v1/apply", json=body, headers=api.admin)

    for answer in (planned, applied):
        assert answer.status_code == 200, answer.text
        said = {c["name"]: [w["code"] for w in c["warnings"]] for c in answer.json()["changes"]}
        assert said == {
            "ticks": ["nats_duplicate_window_short"],
            "tocks": ["nats_duplicate_window_short"],
            "hook": [],
        }
    [tocks] = [c for c in applied.json()["changes"] if c["name"] == "tocks"]
    assert tocks["warnings"][0]["message"].startswith("task type 'tocks' publishes to NATS")
    assert again.json()["changes"] == []  # nothing written: nothing looked at again


async def test_bad_credentials_are_a_reason_that_never_shows_them(
    api: Api, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    password = "pw-" + secrets.token_hex(8)
    server = NatsServer(tmp_path, user="app", password=password)
    await trio.to_thread.run_sync(server.start)
    try:
        wrong = f"nats://app:wrong-{password}@127.0.0.1:{server.port}"
        response = await api.client.put(
            "/v1/task-types/ticks", json=nats(wrong, stream="TICKS"), headers=api.admin
        )
    finally:
        await trio.to_thread.run_sync(server.kill)

    assert response.status_code == 200, response.text
    [warning] = response.json()["warnings"]
    assert warning["code"] == "nats_stream_unchecked"
    assert "Authorization" in warning["message"]
    assert password not in response.text
    assert password not in caplog.text
