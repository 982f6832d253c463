"""The python handler: sync and async callables, classification by exception, import checks."""

from __future__ import annotations

import threading

import pytest
import trio

from engine.errors import InvalidField
from engine.handlers import HandlerOptions, HandlerResult, OutcomeKind, build_handler
from engine.handlers.base import Handler
from tests.handlers import callables
from tests.handlers.conftest import make_context

OPTIONS = HandlerOptions(enable_python=True)


def python(path: str, **settings: object) -> Handler:
    return build_handler(
        "python", {"callable": f"tests.handlers.callables:{path}", **settings}, options=OPTIONS
    )


@pytest.fixture(autouse=True)
def _forget_calls() -> None:
    callables.calls.clear()


async def test_a_sync_callable_runs_in_a_worker_thread_and_succeeds() -> None:
    assert await python("sync_ok").run(make_context()) == HandlerResult.succeeded()
    [(kind, execution_id, thread)] = callables.calls
    assert (kind, execution_id) == ("sync", make_context().execution_id)
    assert thread != threading.get_ident()


async def test_an_async_callable_runs_on_the_trio_loop_and_succeeds() -> None:
    assert await python("async_ok").run(make_context()) == HandlerResult.succeeded()
    assert await python("async_object").run(make_context()) == HandlerResult.succeeded()
    assert [(kind, thread) for kind, _, thread in callables.calls] == [
        ("async", threading.get_ident()),
        ("object", threading.get_ident()),
    ]


async def test_a_plain_function_returning_a_coroutine_is_unknown_not_a_silent_success() -> None:
    result = await python("plain_wrapper_of_coroutine").run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.UNKNOWN, "exception:TypeError")
    assert result.error_message is not None
    assert "synchronous" in result.error_message
    assert callables.calls == []


async def test_transient_error_is_transient_with_its_retry_after() -> None:
    result = await python("raises_transient").run(make_context())
    assert result == HandlerResult.transient(
        "exception:TransientError", "TransientError: upstream busy", retry_after_s=12.5
    )
    subclass = await python("raises_transient_subclass").run(make_context())
    assert (subclass.kind, subclass.error_code) == (
        OutcomeKind.TRANSIENT,
        "exception:QuotaExceeded",
    )


async def test_permanent_error_is_permanent() -> None:
    result = await python("raises_permanent").run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.PERMANENT, "exception:PermanentError")
    assert result.error_message == "PermanentError: customer account closed"


async def test_any_other_exception_is_unknown_and_says_where_it_was_raised() -> None:
    result = await python("raises_value_error").run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.UNKNOWN, "exception:ValueError")
    assert result.error_message is not None
    assert result.error_message.startswith("ValueError: bad payload")
    assert "callables.py" in result.error_message
    assert "raises_value_error" in result.error_message


async def test_an_async_callable_is_cancelled_at_its_timeout() -> None:
    result = await python("sleeps_forever", timeout_s=0.05).run(make_context())
    assert (result.kind, result.error_code) == (OutcomeKind.TRANSIENT, "timeout")


async def test_cancellation_from_outside_propagates() -> None:
    handler = python("sleeps_forever")
    with trio.move_on_after(0.05) as scope:
        await handler.run(make_context())
        raise AssertionError("run must not return once cancelled")
    assert scope.cancelled_caught


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("tests.handlers.no_such_module:run", "cannot import 'tests.handlers.no_such_module'"),
        ("tests.handlers.callables:missing", "has no attribute 'missing'"),
        ("tests.handlers.callables:not_callable", "is not callable"),
        ("tests.handlers.callables", "package.module:function"),
        (":run", "package.module:function"),
    ],
)
def test_unresolvable_callables_are_refused_when_built(path: str, fragment: str) -> None:
    with pytest.raises(InvalidField, match=fragment):
        build_handler("python", {"callable": path}, options=OPTIONS)


def test_python_handlers_are_refused_unless_the_node_enables_them() -> None:
    with pytest.raises(InvalidField, match="--enable-python"):
        build_handler(
            "python", {"callable": "tests.handlers.callables:sync_ok"}, options=HandlerOptions()
        )


def test_the_module_allow_list_admits_its_modules_and_their_submodules_only() -> None:
    allowed = HandlerOptions(enable_python=True, python_modules=("tests.handlers",))
    build_handler("python", {"callable": "tests.handlers.callables:sync_ok"}, options=allowed)
    narrow = HandlerOptions(enable_python=True, python_modules=("tests.handlers.call",))
    with pytest.raises(InvalidField, match="not allowed on this node"):
        # A prefix of the name is not a parent module: ``call`` does not admit ``callables``.
        build_handler("python", {"callable": "tests.handlers.callables:sync_ok"}, options=narrow)
    with pytest.raises(InvalidField, match="not allowed on this node"):
        build_handler("python", {"callable": "os:system"}, options=allowed)


@pytest.mark.parametrize("path", ["sync_exits", "async_exits", "async_interrupts"])
async def test_system_exit_and_keyboard_interrupt_are_failures_of_the_attempt(path: str) -> None:
    result = await python(path).run(make_context())
    assert result.kind is OutcomeKind.UNKNOWN
    assert result.error_code in ("exception:SystemExit", "exception:KeyboardInterrupt")


async def test_cancellation_still_propagates_through_a_python_handler() -> None:
    with trio.move_on_after(0.05) as scope:
        await python("sleeps_forever").run(make_context())
    assert scope.cancelled_caught
