"""The handler contract: results, contexts, options, the registry, and the noop handler."""

from __future__ import annotations

from datetime import datetime

import pytest
import trio

from engine.errors import ConfigError, InvalidField
from engine.handlers import (
    HANDLER_KINDS,
    HandlerOptions,
    HandlerResult,
    OutcomeKind,
    build_handler,
)
from engine.handlers.base import ERROR_MESSAGE_CHARS_MAX, run_with_timeout
from tests.handlers.conftest import make_context

OPTIONS = HandlerOptions(enable_python=True)


def test_failure_messages_are_cut_to_the_bound() -> None:
    result = HandlerResult.unknown("exception:ValueError", "x" * 5000)
    assert result.error_message is not None
    assert len(result.error_message) == ERROR_MESSAGE_CHARS_MAX
    assert result.error_message.endswith("…")


def test_a_success_carries_no_error_and_a_failure_always_does() -> None:
    assert HandlerResult.succeeded().error_code is None
    with pytest.raises(ValueError, match="error_code"):
        HandlerResult(kind=OutcomeKind.TRANSIENT)
    with pytest.raises(ValueError, match="error_code"):
        HandlerResult(kind=OutcomeKind.SUCCEEDED, error_code="http_200")
    with pytest.raises(ValueError, match="retry_after_s"):
        HandlerResult.transient("http_429", "slow down", retry_after_s=-1)


def test_context_needs_an_aware_planned_at_and_counts_attempts_from_one() -> None:
    with pytest.raises(ValueError, match="aware"):
        make_context(planned_at=datetime(2026, 3, 8, 7, 0))
    with pytest.raises(ValueError, match="from 1"):
        make_context(attempt=0)


def test_options_refuse_a_malformed_allow_list() -> None:
    with pytest.raises(ConfigError, match="not-a-cidr"):
        HandlerOptions(webhook_allow_cidrs=("not-a-cidr",))
    assert HandlerOptions(webhook_allow_cidrs=("127.0.0.1/8", "::1/128")).enable_shell is False


def test_registry_refuses_an_unknown_kind_and_lists_the_known_ones() -> None:
    with pytest.raises(InvalidField, match="unknown handler kind 'ftp'") as raised:
        build_handler("ftp", {}, options=OPTIONS)
    for kind in HANDLER_KINDS:
        assert kind in str(raised.value)


@pytest.mark.parametrize(
    ("kind", "settings", "fragment"),
    [
        ("noop", {"dealy_s": 1}, "dealy_s"),
        ("noop", {"delay_s": "soon"}, "delay_s"),
        ("noop", {"timeout_s": 0}, "timeout_s"),
        ("webhook", {}, "url"),
        ("python", {"callable": "x:y", "timeout_s": -1}, "timeout_s"),
    ],
)
def test_registry_refuses_bad_settings_naming_the_field(
    kind: str, settings: dict[str, object], fragment: str
) -> None:
    with pytest.raises(InvalidField, match=fragment):
        build_handler(kind, settings, options=OPTIONS)


async def test_run_with_timeout_turns_only_its_own_deadline_into_a_timeout() -> None:
    async def forever() -> HandlerResult:
        await trio.sleep_forever()
        raise AssertionError

    result = await run_with_timeout(0.01, forever)
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "timeout")
    with trio.move_on_after(0.01) as outer:
        await run_with_timeout(10.0, forever)
        raise AssertionError("cancellation from outside must propagate")
    assert outer.cancelled_caught


async def test_noop_succeeds_after_its_delay(autojump_clock: trio.abc.Clock) -> None:
    handler = build_handler("noop", {"delay_s": 10}, options=OPTIONS)
    started = trio.current_time()
    assert await handler.run(make_context()) == HandlerResult.succeeded()
    assert trio.current_time() - started == pytest.approx(10)


async def test_noop_with_a_delay_beyond_its_timeout_times_out(
    autojump_clock: trio.abc.Clock,
) -> None:
    handler = build_handler("noop", {"delay_s": 10, "timeout_s": 2}, options=OPTIONS)
    result = await handler.run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "timeout")
